"""Power control with estimated CSI (docs/guides/power-control.md#with-csi-error): every policy aligns to
the known gains h_hat, privacy-budget plans on the same mismatched rounds the accountants compose, and
``audit-run``'s lower bound stays below every accountant. The audit-power setting (10 users, d = 4,
3 rounds, privacy-budget at epsilon 2) with one least-squares pilot at 20 dB (sigma_e^2 = 0.01)."""

from __future__ import annotations

import pytest
import torch
from audit_checks import assert_sound

from otafl.api.audit_run import audit_run
from otafl.config import load_audit_spec, load_spec
from otafl.fl.loop import run_experiment
from otafl.fl.strategies import POWER_CONTROLS
from otafl.setup import build_channel

POWER = "experiments/audit-power.toml"
PILOT = ["channel.csi='estimated'", "channel.pilot_snr_db=20"]


def _spec(policy: str, *extra: str):
    return load_spec(POWER, overrides=[f"transmit.power_control='{policy}'", *PILOT, *extra])


def _run_and_plan(spec):
    """The run's facts and its channel plan (built again at the run's model dimension)."""
    facts = run_experiment(spec, train=False).facts
    return facts, build_channel(spec, dim=facts[0].dim)


def test_privacy_budget_with_estimated_csi_meets_its_target_on_the_mismatched_rounds():
    result = run_experiment(_spec("privacy-budget"), train=False)
    assert all(f.csi_ratio_min < 1.0 < f.csi_ratio_max for f in result.facts)  # every round mismatched
    total = result.summary["exact_epsilon_central_total"]
    assert 0.98 * 2.0 <= total <= 2.0
    assert result.summary["planned_epsilon"] == pytest.approx(total, rel=1e-12)


def test_privacy_budgets_plan_is_the_runs_facts_gain_eligibility_and_mismatch():
    spec = _spec("privacy-budget")
    run, plan = _run_and_plan(spec)
    policy = plan.setup.power_control
    planned = policy._facts(plan.setup.noise_var, policy.cap, plan.setup)
    assert len(planned) == len(run) == 3
    for a, b in zip(planned, run):
        assert a.alignment_gain == pytest.approx(b.alignment_gain, rel=1e-12)
        assert (a.csi_ratio_min, a.csi_ratio_max) == (b.csi_ratio_min, b.csi_ratio_max)
        assert torch.equal(a.participation_prob, b.participation_prob)


def test_the_perfect_csi_cap_would_overshoot_the_target_once_the_mismatch_is_accounted():
    perfect = build_channel(load_spec(POWER), dim=4).setup.power_control
    plan = build_channel(_spec("privacy-budget"), dim=4)
    policy = plan.setup.power_control
    assert policy.cap < perfect.cap
    assert policy._epsilon(plan.setup.noise_var, perfect.cap, plan.setup) > 2.0  # measured 2.41


def test_a_schedule_with_estimated_csi_scales_the_bound_on_the_known_gains_each_round():
    spec = _spec("schedule")
    facts, plan = _run_and_plan(spec)
    policy, csi = plan.setup.power_control, plan.setup.csi
    for t, f in enumerate(facts):
        bound = float(plan.setup.full_gain(csi.finite[t])[0])
        assert f.alignment_gain == pytest.approx(float(policy.scales[t]) * bound, rel=1e-12)
    assert float(policy.scales[-1]) == pytest.approx(0.3)


def test_cotaf_with_estimated_csi_silences_the_users_whose_estimate_is_below_h_min():
    spec = _spec("cotaf", "transmit.threshold=1.0")
    facts, plan = _run_and_plan(spec)
    silent = plan.setup.csi.estimates < 1.0
    assert bool(silent.any()) and not bool(silent.all())
    for t, f in enumerate(facts):
        assert torch.equal(f.participation_prob == 0, silent[t].cpu())
        assert f.alignment_gain == pytest.approx(plan.setup.power_control.c)


@pytest.mark.parametrize("policy", sorted(POWER_CONTROLS))
def test_every_policy_with_estimated_csi_runs_and_is_accounted(policy):
    summary = run_experiment(_spec(policy), train=False).summary
    assert 0.0 < summary["exact_epsilon_central_total"] < float("inf")


@pytest.mark.parametrize("policy", sorted(POWER_CONTROLS))
def test_a_short_audit_of_every_policy_with_estimated_csi_stays_below_every_accountant(policy):
    spec, audit = load_audit_spec(POWER, [f"transmit.power_control='{policy}'", *PILOT, "audit.trials=500",
                                          "audit.seed=1"])
    result = audit_run(spec, audit)
    assert_sound(result)
    assert result["rounds"] == 3


def test_liu_simeones_closed_form_refuses_estimated_csi_in_one_line():
    from otafl.api.liu_simeone import closed_form_rows
    from otafl.errors import OtaflInputError

    spec = load_spec("experiments/liu-simeone.toml", overrides=PILOT)
    with pytest.raises(OtaflInputError, match=r"channel.csi = 'estimated' is outside the allowed range \{'perfect'\}"):
        closed_form_rows(spec)
