"""Power control as a strategy (docs/model.md#power-control): each policy changes c_t only through
public facts, the loop never names one, and the accountants read the changed noise."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from otafl.config import load_spec, spec_from_mapping
from otafl.fl.loop import run_experiment
from otafl.fl.strategies import POWER_CONTROLS
from otafl.setup import build_channel

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"data": {"name": "synthetic", "users": 20, "samples": 400}, "model": {"name": "single-layer"},
         "train": {"rounds": 12, "eval_every": 12}, "sampling": {"p": 0.5},
         "privacy": {"accountants": ["exact", "tight", "paper"]}}


def small(**sections) -> dict:
    body = {k: dict(v) for k, v in SMALL.items()}
    for section, keys in sections.items():
        body.setdefault(section, {}).update(keys)
    return body


def test_the_loop_never_names_a_policy():
    text = (ROOT / "otafl/fl/loop.py").read_text()
    assert not re.search(r"power_control ==|csi ==", text)
    power = (ROOT / "otafl/fl/power.py").read_text()
    assert not re.search(r"power_control ==", power)


def test_every_registered_policy_loads_a_class_and_the_names_are_torch_free():
    from otafl.fl.power import PowerControl

    for name, entry in POWER_CONTROLS.items():
        assert isinstance(entry.target, str) and issubclass(entry.load(), PowerControl), name


def test_full_power_leaves_the_setup_and_the_run_unchanged():
    spec = spec_from_mapping(small())
    full = spec_from_mapping(small(transmit={"power_control": "full"}))
    assert build_channel(spec, dim=50).setup.power_control is None
    a, b = run_experiment(spec, train=False), run_experiment(full, train=False)
    assert [r["alignment_gain"] for r in a.rounds] == [r["alignment_gain"] for r in b.rounds]
    assert a.summary["exact_epsilon_central_total"] == b.summary["exact_epsilon_central_total"]
    assert "power_control" not in a.summary


def test_privacy_budget_meets_target_8_over_100_quickstart_rounds_within_2_percent_from_below():
    """The acceptance run (quickstart data and channel, 100 rounds), bounds only: exact's central total
    lands in [0.98 x 8, 8]."""
    spec = load_spec(ROOT / "experiments/quickstart.toml",
                     ["train.rounds=100", "transmit.power_control='privacy-budget'", "privacy.target_epsilon=8",
                      "privacy.accountants=['exact']"])
    res = run_experiment(spec, train=False)
    total = res.summary["exact_epsilon_central_total"]
    assert 0.98 * 8 <= total <= 8.0
    assert res.summary["planned_epsilon"] == pytest.approx(total, rel=1e-12)
    # each round sits at the cap or, in a deep fade whose bound is below it, at full power
    full = run_experiment(load_spec(ROOT / "experiments/quickstart.toml", ["train.rounds=100"]), train=False)
    cap = res.summary["power_cap"]
    assert all(r["alignment_gain"] == pytest.approx(min(cap, f["alignment_gain"]), rel=1e-12)
               for r, f in zip(res.rounds, full.rounds))
    assert sum(cap < f["alignment_gain"] for f in full.rounds) > 90


def test_privacy_budget_adds_nothing_where_full_power_already_meets_the_target():
    spec = spec_from_mapping(small(transmit={"power_control": "privacy-budget"}, privacy={"target_epsilon": 1e6}))
    res = run_experiment(spec, train=False)
    assert res.summary["power_cap"] == math.inf and res.summary["added_noise_var"] == 0.0
    full = run_experiment(spec_from_mapping(small()), train=False)
    assert [r["alignment_gain"] for r in res.rounds] == [r["alignment_gain"] for r in full.rounds]


def test_privacy_budget_without_channel_noise_adds_artificial_noise_to_meet_the_target():
    spec = spec_from_mapping(small(channel={"n0": 0.0}, transmit={"power_control": "privacy-budget", "sigma2": 0.0},
                                   privacy={"target_epsilon": 4.0, "accountants": ["exact"]}))
    res = run_experiment(spec, train=False)
    assert res.summary["added_noise_var"] > 0 and res.summary["power_cap"] == math.inf
    assert 0.98 * 4.0 <= res.summary["exact_epsilon_central_total"] <= 4.0


@pytest.mark.parametrize("accountant", ["exact", "tight", "paper"])
def test_every_accountant_reads_the_lowered_gain_from_the_round_facts(accountant):
    """exact and tight credit the channel noise N0 / c_t^2, so a lower c_t lowers their epsilons; paper's
    central step credits the artificial noise only (docs/privacy/paper-tight.md), so it stays put."""
    body = {"data": {"name": "synthetic", "users": 200, "samples": 400}, "train": {"rounds": 5},
            "privacy": {"accountants": [accountant]}}
    full = run_experiment(spec_from_mapping(body), train=False)
    low = run_experiment(spec_from_mapping({**body, "transmit": {"power_control": "schedule", "power_start": 0.1,
                                                                 "power_end": 0.1}}), train=False)
    for f, lo in zip(full.rounds, low.rounds):
        assert lo["alignment_gain"] == pytest.approx(0.1 * f["alignment_gain"], rel=1e-12)
        assert lo["effective_noise_var"] > f["effective_noise_var"]
    for key in (f"{accountant}_epsilon_central", f"{accountant}_epsilon_central_total"):
        assert math.isfinite(full.summary[key])
        if accountant == "paper":
            assert low.summary[key] == full.summary[key]
        else:
            assert low.summary[key] < 0.9 * full.summary[key]


def test_a_schedule_list_scales_each_round_by_its_value_and_a_ramp_is_geometric():
    values = [1.0, 0.5, 0.25] * 4
    full = run_experiment(spec_from_mapping(small()), train=False)
    listed = run_experiment(spec_from_mapping(small(transmit={"power_control": "schedule", "power_schedule": values})),
                            train=False)
    assert [r["alignment_gain"] / f["alignment_gain"] for r, f in zip(listed.rounds, full.rounds)] == \
        pytest.approx(values, rel=1e-12)
    ramp = run_experiment(spec_from_mapping(small(transmit={"power_control": "schedule", "power_start": 1.0,
                                                            "power_end": 0.01})), train=False)
    ratios = [r["alignment_gain"] / f["alignment_gain"] for r, f in zip(ramp.rounds, full.rounds)]
    assert ratios[0] == pytest.approx(1.0) and ratios[-1] == pytest.approx(0.01)
    assert ratios == pytest.approx([0.01 ** (t / 11) for t in range(12)], rel=1e-9)


def test_cotaf_aligns_at_a_fixed_gain_and_silences_the_users_below_the_threshold():
    spec = spec_from_mapping(small(transmit={"power_control": "cotaf", "threshold": 0.6}))
    res = run_experiment(spec, train=False)
    plan = build_channel(spec, dim=res.summary["dim"])
    scale = float(plan.setup.bound_scale.min())
    assert [r["alignment_gain"] for r in res.rounds] == pytest.approx([0.6 * scale] * len(res.rounds), rel=1e-12)
    assert res.summary["cotaf_gain"] == pytest.approx(0.6 * scale)
    assert sum(r["outages"] for r in res.rounds) > 0
    # silenced users do not count as expected participants (the accountants' p_eff)
    for t, r in enumerate(res.rounds):
        eligible = plan.h[t] >= 0.6
        assert r["expected_participants"] == pytest.approx(float((plan.p[t] * eligible).sum()))


def test_cotaf_training_keeps_every_transmitter_within_its_budget():
    spec = spec_from_mapping(small(transmit={"power_control": "cotaf", "threshold": 0.5}))
    res = run_experiment(spec)
    assert 0 < res.summary["max_power_ratio"] <= 1.0 + 1e-9
    assert math.isfinite(res.summary["final_test_accuracy"])


def test_a_schedule_refuses_gains_that_are_not_a_row_of_its_run():
    spec = spec_from_mapping(small(transmit={"power_control": "schedule", "power_start": 0.5, "power_end": 0.5}))
    plan = build_channel(spec, dim=10)
    from otafl.errors import OtaflInputError

    assert float(plan.setup.gain(plan.h[3])[0]) == pytest.approx(0.5 * float(plan.setup.full_gain(plan.h[3])[0]))
    with pytest.raises(OtaflInputError, match="channel rows"):
        plan.setup.gain(plan.h[3].clone())


def test_the_policies_need_only_public_facts_the_plan_is_the_same_whatever_the_data():
    """The plan is built from the channel and the spec before any data: two data seeds, one channel."""
    body = small(transmit={"power_control": "privacy-budget"}, privacy={"target_epsilon": 5.0, "accountants": []})
    a = build_channel(spec_from_mapping(body), dim=100)
    b = build_channel(spec_from_mapping({**body, "data": {**body["data"], "name": "digits"}}), dim=100)
    assert a.setup.power_control.cap == b.setup.power_control.cap
    assert torch.equal(a.h, b.h)


def test_privacy_budget_refuses_local_steps_and_other_aggregations_in_one_line():
    from otafl.errors import OtaflInputError

    for extra in ({"algorithm": "fedavg"}, {"aggregation": "ideal"}):
        body = small(transmit={"power_control": "privacy-budget"}, privacy={"target_epsilon": 5.0, "accountants": []})
        body["train"] = {**body["train"], **extra}
        with pytest.raises(OtaflInputError, match="needs train.algorithm = 'fedsgd' and train.aggregation = 'ota'|"
                                                  "needs train.aggregation = 'ota'"):
            build_channel(spec_from_mapping(body), dim=10)
    for policy in ("cotaf", "schedule"):
        body = small(transmit={"power_control": policy, "threshold": 0.5}, train={"aggregation": "ideal"})
        with pytest.raises(OtaflInputError, match="needs train.aggregation = 'ota'"):
            build_channel(spec_from_mapping(body), dim=10)


def test_the_run_report_names_the_plan_only_when_a_policy_is_set():
    from otafl.report.text import run_text

    full = run_experiment(spec_from_mapping(small(privacy={"accountants": []})), train=False)
    assert "power control" not in run_text(full.summary, [], "out")
    sched = run_experiment(spec_from_mapping(small(transmit={"power_control": "schedule", "power_start": 0.5},
                                                   privacy={"accountants": []})), train=False)
    assert "  power control: schedule: c_t from 0.5 to 1 times the alignment bound" in run_text(sched.summary, [], "out")
