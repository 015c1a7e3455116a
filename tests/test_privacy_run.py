"""account_run's typed result: PrivacyResult / AccountantResult, and the flat summary columns of before."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from otafl.privacy import AccountantResult, PrivacyResult, RoundFacts, account_run

F64 = torch.float64


def facts_heterogeneous():
    """Three rounds, five users with their own p and sigma^2; round 1 uniform; N0 = 0 in round 2."""
    out = []
    for t in range(3):
        if t != 1:
            p = torch.tensor([0.9, 0.5, 0.5, 0.7, 1.0], dtype=F64)
            var = torch.tensor([0.5, 0.5, 0.8, 0.5, 0.6], dtype=F64)
        else:
            p = torch.tensor([0.8, 0.8, 0.8, 0.8, 0.8], dtype=F64)
            var = torch.tensor([0.4], dtype=F64)
        out.append(RoundFacts(participation_prob=p, noise_var=var, alignment_gain=2.0, n0=0.5 if t != 2 else 0.0,
                              sensitivity=2.0, dim=4, participants=3))
    return out


def facts_few_participants():
    """mu = 0.8 of K = 4: the auto delta' is >= 1, paper's and tight's central step is undefined."""
    return [RoundFacts(participation_prob=torch.full((4,), 0.2, dtype=F64), noise_var=torch.full((4,), 1.0, dtype=F64),
                       alignment_gain=1.0, n0=1.0, sensitivity=1.0, dim=3, participants=1)] * 2


def facts_no_noise():
    """No artificial and no channel noise: every bound is undefined."""
    return [RoundFacts(participation_prob=torch.full((3,), 0.5, dtype=F64), noise_var=torch.zeros(3, dtype=F64),
                       alignment_gain=1.0, n0=0.0, sensitivity=1.0, dim=2, participants=1)]


CASES = {"a": facts_heterogeneous, "b": facts_few_participants, "c": facts_no_noise}

# The flat dict that account_run(facts, accountants=["paper", "tight", "exact"], delta_l=1e-5) returned
# before it returned a PrivacyResult (computed with that code, per-round lists included).
OLD_FLAT = json.loads("""
{
 "a": {
  "paper_epsilon_local_max": 13.597818227528803,
  "paper_delta_local": 1e-05,
  "paper_epsilon_central": 778.8050072588345,
  "paper_delta_central": 0.011231078705651364,
  "paper_epsilon_local_total": 30.69417822338767,
  "paper_delta_local_total": 3.8e-05,
  "paper_epsilon_central_total": 2057.338160114402,
  "paper_delta_central_total": 0.025803298711741418,
  "paper_composition": "basic",
  "paper_composition_local": "rdp",
  "paper_defined": true,
  "paper_reason": "",
  "paper_classic_valid": false,
  "paper_epsilon_central_per_round": [778.8050072588345, 499.728145596733, 778.8050072588345],
  "paper_epsilon_local_max_per_round": [12.151135572421957, 13.149789851642627, 13.597818227528803],
  "tight_epsilon_local_max": 15.456155822609322,
  "tight_delta_local": 1e-05,
  "tight_epsilon_central": 14.76032315064382,
  "tight_delta_central": 0.011231078705651364,
  "tight_epsilon_local_total": 31.13175997265935,
  "tight_delta_local_total": 3.8e-05,
  "tight_epsilon_central_total": 23.72039014911902,
  "tight_delta_central_total": 0.025813298711741418,
  "tight_composition": "rdp",
  "tight_composition_local": "rdp",
  "tight_defined": true,
  "tight_reason": "",
  "tight_classic_valid": true,
  "tight_epsilon_central_per_round": [9.299892078645541, 14.76032315064382, 9.997256146434305],
  "tight_epsilon_local_max_per_round": [13.406364343299785, 14.980127943500792, 15.456155822609322],
  "exact_epsilon_local_max": 15.456155822609324,
  "exact_delta_local": 1e-05,
  "exact_epsilon_central": 10.438137932304409,
  "exact_delta_central": 1e-05,
  "exact_epsilon_local_total": 43.842648109409936,
  "exact_delta_local_total": 2.8000000000000003e-05,
  "exact_epsilon_central_total": 25.619911910288167,
  "exact_delta_central_total": 3.0000000000000004e-05,
  "exact_composition": "basic",
  "exact_composition_local": "basic",
  "exact_defined": true,
  "exact_reason": "",
  "exact_classic_valid": true,
  "exact_epsilon_central_per_round": [9.205439557616748, 5.97633442036701, 10.438137932304409],
  "exact_epsilon_local_max_per_round": [13.406364343299812, 14.980127943500799, 15.456155822609324]
 },
 "b": {
  "paper_epsilon_local_max": 1.938657294838731,
  "paper_delta_local": 2.0000000000000003e-06,
  "paper_epsilon_central": Infinity,
  "paper_delta_central": 1.0,
  "paper_epsilon_local_total": 1.8669550047903163,
  "paper_delta_local_total": 1.4000000000000001e-05,
  "paper_epsilon_central_total": Infinity,
  "paper_delta_central_total": 1.0,
  "paper_composition": "none",
  "paper_composition_local": "rdp",
  "paper_defined": false,
  "paper_reason": "delta' >= 1: too few expected participants for the concentration step",
  "paper_classic_valid": false,
  "paper_epsilon_central_per_round": [Infinity, Infinity],
  "paper_epsilon_local_max_per_round": [1.938657294838731, 1.938657294838731],
  "tight_epsilon_local_max": 2.943225239801368,
  "tight_delta_local": 2.0000000000000003e-06,
  "tight_epsilon_central": Infinity,
  "tight_delta_central": 1.0,
  "tight_epsilon_local_total": 4.710265203366288,
  "tight_delta_local_total": 1.4000000000000001e-05,
  "tight_epsilon_central_total": Infinity,
  "tight_delta_central_total": 1.0,
  "tight_composition": "none",
  "tight_composition_local": "rdp",
  "tight_defined": false,
  "tight_reason": "delta' >= 1: too few expected participants for the concentration step",
  "tight_classic_valid": true,
  "tight_epsilon_central_per_round": [Infinity, Infinity],
  "tight_epsilon_local_max_per_round": [2.943225239801368, 2.943225239801368],
  "exact_epsilon_local_max": 2.9408886418733924,
  "exact_delta_local": 2.0000000000000003e-06,
  "exact_epsilon_central": 1.104727801109567,
  "exact_delta_central": 1e-05,
  "exact_epsilon_local_total": 5.881777283746785,
  "exact_delta_local_total": 4.000000000000001e-06,
  "exact_epsilon_central_total": 2.209455602219134,
  "exact_delta_central_total": 2e-05,
  "exact_composition": "basic",
  "exact_composition_local": "basic",
  "exact_defined": true,
  "exact_reason": "",
  "exact_classic_valid": true,
  "exact_epsilon_central_per_round": [1.104727801109567, 1.104727801109567],
  "exact_epsilon_local_max_per_round": [2.9408886418733924, 2.9408886418733924]
 },
 "c": {
  "paper_epsilon_local_max": Infinity,
  "paper_delta_local": 5e-06,
  "paper_epsilon_central": Infinity,
  "paper_delta_central": 0.44627934997358326,
  "paper_epsilon_local_total": Infinity,
  "paper_delta_local_total": 1.5000000000000002e-05,
  "paper_epsilon_central_total": Infinity,
  "paper_delta_central_total": 0.44628934997358327,
  "paper_composition": "none",
  "paper_composition_local": "none",
  "paper_defined": false,
  "paper_reason": "no central noise: zero participant quantile or zero artificial noise, and no channel noise; no local noise: sigma_k^2 = 0 and no channel noise",
  "paper_classic_valid": false,
  "paper_epsilon_central_per_round": [Infinity],
  "paper_epsilon_local_max_per_round": [Infinity],
  "tight_epsilon_local_max": Infinity,
  "tight_delta_local": 5e-06,
  "tight_epsilon_central": Infinity,
  "tight_delta_central": 0.44627934997358326,
  "tight_epsilon_local_total": Infinity,
  "tight_delta_local_total": 1.5000000000000002e-05,
  "tight_epsilon_central_total": Infinity,
  "tight_delta_central_total": 0.44628934997358327,
  "tight_composition": "none",
  "tight_composition_local": "none",
  "tight_defined": false,
  "tight_reason": "no central noise: zero participant quantile or zero artificial noise, and no channel noise; no local noise: sigma_k^2 = 0 and no channel noise",
  "tight_classic_valid": true,
  "tight_epsilon_central_per_round": [Infinity],
  "tight_epsilon_local_max_per_round": [Infinity],
  "exact_epsilon_local_max": Infinity,
  "exact_delta_local": 5e-06,
  "exact_epsilon_central": Infinity,
  "exact_delta_central": 1e-05,
  "exact_epsilon_local_total": Infinity,
  "exact_delta_local_total": 1.5000000000000002e-05,
  "exact_epsilon_central_total": Infinity,
  "exact_delta_central_total": 2e-05,
  "exact_composition": "none",
  "exact_composition_local": "none",
  "exact_defined": false,
  "exact_reason": "no central noise: zero participant quantile or zero artificial noise, and no channel noise; no local noise: sigma_k^2 = 0 and no channel noise",
  "exact_classic_valid": true,
  "exact_epsilon_central_per_round": [Infinity],
  "exact_epsilon_local_max_per_round": [Infinity]
 }
}
""")


# exact's summary fields that changed on purpose since OLD_FLAT: its per-round values may only
# grow by the pessimistic grids (at most ~1 %), its totals are PLD compositions (never above
# the old basic/advanced totals) at the default total delta, the per-round deltas plus delta_l.
EXACT_PER_ROUND = ("exact_epsilon_local_max", "exact_epsilon_central")
CLOSED_TOTALS = ("epsilon_local_total", "delta_local_total", "epsilon_central_total", "delta_central_total",
                 "composition", "composition_local")
EXACT_TOTALS = ("exact_epsilon_local_total", "exact_epsilon_central_total", "exact_delta_local_total",
                "exact_delta_central_total", "exact_composition", "exact_composition_local")


# OLD_FLAT was written by one machine's numpy/scipy/torch; another install's libraries may
# round differently in the last bits (seen: 13.597818227528805 vs 13.597818227528803 with a fresh
# install of numpy 2.4.6, scipy 1.17.1, dp-accounting 0.6.0). "The same value" below means within
# this relative tolerance; texts, flags and non-finite values must match exactly.
SAME = 1e-9


def same(got, was) -> bool:
    """``got`` equals ``was``: floats within :data:`SAME` (relative; inf and nan as themselves),
    lists item by item, anything else exactly."""
    if isinstance(got, (list, tuple)) and isinstance(was, (list, tuple)):
        return len(got) == len(was) and all(same(g, w) for g, w in zip(got, was))
    numbers = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in (got, was)]
    if all(numbers) and (isinstance(got, float) or isinstance(was, float)):
        if math.isnan(got) or math.isnan(was):
            return math.isnan(got) and math.isnan(was)
        return got == was or math.isclose(got, was, rel_tol=SAME)
    return got == was and isinstance(got, bool) == isinstance(was, bool)


def test_the_same_check_has_teeth():
    assert same(13.597818227528805, 13.597818227528803) and same([1.0, math.inf], [1.0, math.inf])
    assert not same(13.5978, 13.5979) and not same(math.inf, 1e308) and not same("pld", "rdp")
    assert not same(1.0, True) and not same([1.0], [1.0, 2.0]) and same(math.nan, math.nan)


@pytest.mark.parametrize("case", sorted(CASES))
def test_summary_fields_equal_the_flat_dict_of_before(case):
    result = account_run(CASES[case](), accountants=["paper", "tight", "exact"], delta_l=1e-5)
    old = OLD_FLAT[case]
    expected = {k: v for k, v in old.items() if not k.endswith("_per_round")}
    fields = result.summary_fields()
    added = {f"{a}_total_reason" for a in ("paper", "tight", "exact")}  # new since OLD_FLAT (delta_total)
    for k in added:  # account_run without a delta_target: no unreachable total; +inf rounds are pointed at
        inf_rounds = fields[k.replace("total_reason", "epsilon_central")] == math.inf
        assert fields[k] == ("total +inf: some round's epsilon is +inf (see reason)" if inf_rounds else "")
    units = {f"{a}_unit" for a in ("paper", "tight", "exact")}  # new: what the epsilons protect
    assert all(fields[k] == "user" for k in units)
    fields = {k: v for k, v in fields.items() if k not in added | units}
    from otafl.privacy.accountants.result import FLAGGED_REASONS

    for a in ("paper", "tight", "exact"):  # new: a flagged value says why in its reason too
        flag = FLAGGED_REASONS.get(a)
        if not fields[f"{a}_classic_valid"] and flag:
            assert flag in fields[f"{a}_reason"]
            fields[f"{a}_reason"] = "; ".join(r for r in fields[f"{a}_reason"].split("; ") if r != flag)
    assert list(fields) == list(expected)  # same columns, same order
    changed = EXACT_PER_ROUND + EXACT_TOTALS + tuple(f"{a}_{s}" for a in ("paper", "tight") for s in CLOSED_TOTALS)
    unchanged = [k for k in fields if k not in changed]
    assert {k: fields[k] for k in unchanged if not same(fields[k], expected[k])} == {}  # the same values
    for a in ("paper", "tight"):  # the totals may only improve, by PLD composition
        for kind, suffix in (("central", "composition"), ("local", "composition_local")):
            got, was = fields[f"{a}_epsilon_{kind}_total"], expected[f"{a}_epsilon_{kind}_total"]
            if fields[f"{a}_{suffix}"] == "pld":
                assert got < was and fields[f"{a}_delta_{kind}_total"] >= expected[f"{a}_delta_{kind}_total"] * (1 - SAME)
            else:
                assert same([got, fields[f"{a}_delta_{kind}_total"]], [was, expected[f"{a}_delta_{kind}_total"]])
                assert fields[f"{a}_{suffix}"] == expected[f"{a}_{suffix}"]
    for name in ("paper", "tight"):
        assert same(list(result[name].epsilon_central_per_round), old[f"{name}_epsilon_central_per_round"])
        assert same(list(result[name].epsilon_local_per_round), old[f"{name}_epsilon_local_max_per_round"])
    ex = result["exact"]
    for new_rounds, old_rounds in ((ex.epsilon_central_per_round, old["exact_epsilon_central_per_round"]),
                                   (ex.epsilon_local_per_round, old["exact_epsilon_local_max_per_round"])):
        for got, was in zip(new_rounds, old_rounds):
            assert got == was or was * (1 - SAME) <= got <= was * 1.01
    assert ex.epsilon_central == max(ex.epsilon_central_per_round)
    assert ex.epsilon_local_max == max(ex.epsilon_local_per_round)
    T = len(CASES[case]())
    if math.isfinite(old["exact_epsilon_central_total"]):
        assert ex.composition_central == ex.composition_local == "pld"
        assert ex.epsilon_central_total < old["exact_epsilon_central_total"]
        assert ex.epsilon_local_total < old["exact_epsilon_local_total"]
        assert ex.delta_central_total == pytest.approx((T + 1) * 1e-5, rel=1e-12)
        assert ex.delta_local_total == pytest.approx(old["exact_delta_local_total"] + 1e-5, rel=1e-12)
    else:
        assert ex.epsilon_central_total == ex.epsilon_local_total == math.inf
        assert ex.composition_central == ex.composition_local == "none"
    json.dumps(fields)


def test_privacy_result_is_a_read_only_mapping_of_accountant_results():
    facts = facts_few_participants()
    result = account_run(facts, accountants=["tight", "paper"], delta_l=1e-5)
    assert isinstance(result, PrivacyResult)
    assert list(result) == ["tight", "paper"] and len(result) == 2
    paper = result["paper"]
    assert isinstance(paper, AccountantResult) and paper.name == "paper"
    assert paper.defined is False and "delta'" in paper.reason and paper.epsilon_central_total == math.inf
    assert paper.composition_central == "none"
    with pytest.raises(dataclasses.FrozenInstanceError):
        paper.epsilon_central = 0.0
    with pytest.raises(KeyError):
        result["exact"]
    assert list(result.summary_fields()) == [*result["tight"].summary_fields(), *paper.summary_fields()]


def test_round_fields_are_the_per_round_record_columns():
    result = account_run(facts_heterogeneous(), accountants=["paper", "tight"], delta_l=1e-5)
    for t in range(3):
        assert result.round_fields(t) == {
            "paper_epsilon_central": result["paper"].epsilon_central_per_round[t],
            "paper_epsilon_local_max": result["paper"].epsilon_local_per_round[t],
            "tight_epsilon_central": result["tight"].epsilon_central_per_round[t],
            "tight_epsilon_local_max": result["tight"].epsilon_local_per_round[t],
        }


def test_account_run_dispatches_steps_and_digital_to_their_run_level_composers():
    """account_run(["steps"]) and account_run(["digital"]) state what account_steps and
    account_digital_run state for the same facts (they used to come back as +inf totals from
    the per-round bound interface)."""
    from otafl.privacy.accountants.digital_run import account_digital_run
    from otafl.privacy.accountants.steps_run import account_steps
    from otafl.privacy.facts import DigitalMechanism

    F64 = torch.float64
    steps = [RoundFacts(participation_prob=torch.full((20,), 0.5, dtype=F64), noise_var=torch.zeros(20, dtype=F64),
                        alignment_gain=1.0, n0=0.0, sensitivity=2.0, dim=10, participants=10, local_steps=5,
                        record_sampling=0.1, step_noise=1.0, record_clip=1.0) for _ in range(4)]
    got = account_run(steps, accountants=["steps"], delta_l=1e-5)["steps"]
    assert got == account_steps(steps, delta_l=1e-5)
    assert math.isfinite(got.epsilon_central_total) and got.epsilon_central_total > 0
    digital = [RoundFacts(participation_prob=torch.full((40,), 0.5, dtype=F64), noise_var=torch.zeros(40, dtype=F64),
                          alignment_gain=math.inf, n0=0.0, sensitivity=2.0, dim=64, participants=20,
                          digital=DigitalMechanism("skellam", coordinates=64, noise_var=0.5, scale=100.0))
               for _ in range(3)]
    got = account_run(digital, accountants=["digital"], delta_l=1e-5, digital_delta_total=1e-3)["digital"]
    assert got == account_digital_run(digital, delta_l=1e-5, delta_total=1e-3)
    assert math.isfinite(got.epsilon_central_total) and got.delta_central_total <= 1e-3
