"""otafl.api.audit without click: rows, verdicts, reproducibility, input errors."""

from __future__ import annotations

import math

import pytest

from otafl.api.audit import audit_grid
from otafl.api.bound import bound_grid
from otafl.errors import OtaflInputError
from otafl.privacy.accountants import exact_round
from otafl.report.text import AUDIT_COLUMNS, audit_text

SMALL = dict(users=[30], p=[0.5], sigma2=[0.5], clip=[1.0], snr_db=[10.0], dim=20, n0=1.0, samples=20000, seed=4)


def test_rows_carry_each_accountants_claim_and_a_consistent_interval():
    out = audit_grid(**SMALL, scope="both")
    rows = out["rows"]
    assert [(r["scope"], r["accountant"]) for r in rows] == [
        (s, a) for s in ("central", "local") for a in ("paper", "tight", "exact")]
    assert all(set(AUDIT_COLUMNS) <= set(r) and r["rounds"] == 1 for r in rows)
    ref = bound_grid(users=[30], p=[0.5], sigma2=[0.5], clip=[1.0], snr_db=[10.0], dim=20, n0=1.0,
                     accountants=["paper", "tight"])["rows"]
    for r in rows:
        if r["accountant"] != "exact":
            want = next(b for b in ref if b["accountant"] == r["accountant"])
            assert r["epsilon"] == want[f"epsilon_{r['scope']}"] and r["delta"] == want[f"delta_{r['scope']}"]
        if math.isfinite(r["epsilon"]):
            assert r["audit_lower"] <= r["audit_delta"] <= r["audit_upper"] or r["hits"] == 0
            assert r["verdict"] == ("ok" if r["delta"] >= r["audit_lower"] else "below")
    exact = [r for r in rows if r["accountant"] == "exact"]
    c = ref[0]["alignment_gain"]
    ex = exact_round(participation_prob=0.5, users=30, noise_var=0.5, alignment_gain=c, n0=1.0, sensitivity=2.0,
                     delta_l=1e-5, dim=20)
    assert exact[0]["epsilon"] == pytest.approx(float(ex.epsilon_central), rel=1e-12)
    assert exact[0]["delta"] == 1e-5 and exact[0]["verdict"] == "ok"
    assert out["meta"]["samples"] == 20000 and out["meta"]["adversary"] == "hidden"


def test_seeded_and_totals_over_rounds():
    local = dict(SMALL, delta_l=1e-2, scope="local", accountants=["tight"], rounds=3)
    a, b = audit_grid(**local), audit_grid(**local)
    assert a == b
    assert [r["rounds"] for r in a["rows"]] == [1, 3]
    one, total = a["rows"]
    assert one["epsilon"] <= total["epsilon"] and total["delta"] == 1e-5 and one["hits"] > 0  # at delta_total
    c = audit_grid(**{**local, "seed": 5})
    assert [r["hits"] for r in c["rows"]] != [r["hits"] for r in a["rows"]]


@pytest.mark.parametrize("others", [["paper"], ["tight", "paper"]])
def test_exacts_totals_do_not_depend_on_the_other_accountants_and_are_a_runs(others):
    """exact's totals are a run's (account_run at delta_total), whatever other accountants are listed."""
    import torch

    from otafl.privacy.accountants import account_run
    from otafl.privacy.facts import RoundFacts

    kw = dict(SMALL, samples=200, rounds=4, scope="both")
    alone = [r for r in audit_grid(**kw, accountants=["exact"])["rows"] if r["rounds"] == 4]
    mixed = [r for r in audit_grid(**kw, accountants=["exact", *others])["rows"]
             if r["rounds"] == 4 and r["accountant"] == "exact"]
    assert [(r["scope"], r["epsilon"], r["delta"]) for r in alone] == \
        [(r["scope"], r["epsilon"], r["delta"]) for r in mixed]
    central, local = alone
    assert central["delta"] == local["delta"] == 1e-5  # the default delta_total
    # the totals a run of 4 such rounds states
    c = bound_grid(users=[30], p=[0.5], sigma2=[0.5], clip=[1.0], snr_db=[10.0], dim=20, n0=1.0,
                   accountants=["paper"])["rows"][0]["alignment_gain"]
    f = RoundFacts(participation_prob=torch.full((30,), 0.5, dtype=torch.float64),
                   noise_var=torch.full((30,), 0.5, dtype=torch.float64), alignment_gain=c, n0=1.0, sensitivity=2.0,
                   dim=20, participants=0)
    run = account_run([f] * 4, accountants=["exact"], delta_l=1e-5, delta_target=1e-5)["exact"]
    assert (central["epsilon"], central["delta"]) == (run.epsilon_central_total, run.delta_central_total)
    assert (local["epsilon"], local["delta"]) == (run.epsilon_local_total, run.delta_local_total)


def test_printed_numbers_of_the_local_audit_are_pinned():
    # otafl audit --scope local --users 50 --p 0.1,0.5 --sigma2 0.5 --n0 1 --dim 20 --delta-l 1e-2
    #             --samples 200000 --seed 0   (the table before the api split)
    out = audit_grid(scope="local", users=[50], p=[0.1, 0.5], sigma2=[0.5], clip=[1.0], snr_db=[10.0], n0=1.0,
                     dim=20, delta_l=1e-2, samples=200000, seed=0)
    got = [(r["accountant"], r["p"], *(f"{r[k]:.4g}" for k in ("epsilon", "audit_delta", "audit_lower",
                                                                 "audit_upper")), r["verdict"]) for r in out["rows"]]
    assert got == [
        ("paper", 0.1, "6.042", "0.01149", "0.0112", "0.01215", "below"),
        ("tight", 0.1, "9.136", "0.0009708", "0.0008849", "0.00117", "ok"),
        ("exact", 0.1, "9.136", "0.0009708", "0.0008849", "0.00117", "ok"),
        ("paper", 0.5, "7.65", "0.01858", "0.01786", "0.01905", "below"),
        ("tight", 0.5, "9.136", "0.00499", "0.004822", "0.005453", "ok"),
        ("exact", 0.5, "9.136", "0.00499", "0.004822", "0.005453", "ok")]


def test_audit_text_is_one_line_per_row_and_a_footer():
    out = audit_grid(**SMALL, accountants=["exact", "paper"])
    lines = audit_text(out).splitlines()
    assert lines[0].split() == list(AUDIT_COLUMNS) and len(lines) == 1 + 2 + 2
    assert lines[-1].startswith("privacy unit: user level")
    assert lines[-2].startswith("audit: 20000 draws, seed 4, hidden adversary, 95% Clopper-Pearson")


@pytest.mark.parametrize("kw,needle", [
    ({"accountants": []}, "^no accountant given$"),
    ({"accountants": ["magic"]}, "magic"),
    ({"samples": 0}, "samples"),
    ({"scope": "global"}, "scope"),
    ({"adversary": "oracle"}, "adversary"),
    ({"confidence": 1.0}, "confidence"),
    ({"dim": 0}, "dim"),
])
def test_bad_input_raises_an_input_error(kw, needle):
    with pytest.raises(OtaflInputError, match=needle):
        audit_grid(**{**SMALL, **kw})


def test_progress_follows_the_batches_and_ends_at_the_total(monkeypatch):
    import otafl.api.audit as audit_module

    calls = []
    monkeypatch.setattr(audit_module, "AUDIT_BATCH", 5000)  # 20000 draws: 4 batches a row
    out = audit_grid(**{**SMALL, "samples": 20000}, rounds=2, scope="both",
                     progress=lambda done, total: calls.append((done, total)))
    total = calls[-1][1]
    # bounds: 1 point x (paper, tight) + exact (1 + 2 scopes of totals); draws: 2 scopes x 4 batches x (1 + 2)
    assert total == 2 + 3 + 2 * 4 * 3 and calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(out["rows"]) == 2 * 2 * 3


def test_batched_draws_are_the_stream_of_one_call():
    import torch

    from otafl.api.audit import AUDIT_BATCH, _audit_batches
    from otafl.privacy.analysis.count_law import binomial_count_law
    from otafl.privacy.analysis.ota_round import RoundSpec
    from otafl.privacy.audit import audit_round
    from otafl.progress import Tally

    one = lambda v: torch.tensor([float(v)], dtype=torch.float64)  # noqa: E731
    spec = RoundSpec(participation_prob=one(0.5), own_noise_var=one(0.5), others_noise_var=one(0.5),
                     channel_noise_var=one(0.1), half_sensitivity=one(1.0),
                     law=binomial_count_law(one(0.5), 29, tail_mass=1e-12, block_rel_width=0.0), dim=20)
    eps = torch.tensor([0.5, 2.0, math.inf], dtype=torch.float64)
    samples = 2 * AUDIT_BATCH + 123
    ref = audit_round(spec, eps, samples=samples, generator=torch.Generator().manual_seed(3))
    delta, lower, upper, hits = _audit_batches(spec, eps, samples=samples, generator=torch.Generator().manual_seed(3),
                                               rounds=1, adversary="hidden", confidence=0.95, tally=Tally(None, 3))
    assert torch.equal(hits, ref.hits) and torch.equal(lower, ref.lower) and torch.equal(upper, ref.upper)
    assert delta.tolist() == pytest.approx(ref.delta.tolist(), rel=1e-12)


def test_audit_batches_keep_their_freed_buffers_and_give_the_same_numbers():
    from otafl.heap import retained_heap

    kw = dict(SMALL, samples=300, accountants=["tight"])
    plain = audit_grid(**kw)
    with retained_heap():  # nested use and the defaults restored on exit are harmless
        kept = audit_grid(**kw)
    assert plain == kept
