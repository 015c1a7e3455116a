"""``audit-run`` on every power-control policy (docs/guides/power-control.md): the audit's lower bound
never exceeds a shown upper bound, and privacy-budget's planned epsilon is what exact reports."""

from __future__ import annotations

import pytest
from audit_checks import assert_sound

from otafl.api.audit_run import audit_run
from otafl.config import load_audit_spec
from otafl.fl.strategies import POWER_CONTROLS

POWER = "experiments/audit-power.toml"


@pytest.mark.parametrize("policy", sorted(POWER_CONTROLS))
def test_a_short_audit_of_every_policy_stays_below_every_accountant(policy):
    spec, audit = load_audit_spec(POWER, [f"transmit.power_control='{policy}'", "audit.trials=2000", "audit.seed=1"])
    result = audit_run(spec, audit)
    assert_sound(result)
    assert result["rounds"] == 3 and set(result["upper"]) == {"exact", "tight", "paper"}


def test_scaffold_with_its_warm_start_under_a_schedule_is_audited_below_every_accountant():
    """The warm start transmits on round 0's channel: the schedule reads that row as round 0."""
    spec, audit = load_audit_spec("experiments/audit-scaffold-warm.toml",
                                  ["transmit.power_control='schedule'", "transmit.power_start=0.5",
                                   "transmit.power_end=0.25", "audit.trials=1000", "audit.seed=1"])
    assert_sound(audit_run(spec, audit))


def test_the_audited_privacy_budget_run_is_accounted_at_its_target():
    spec, audit = load_audit_spec(POWER, ["audit.trials=1000"])
    result = audit_run(spec, audit)
    assert 0.98 * 2.0 <= result["upper"]["exact"] <= 2.0
    assert_sound(result)


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(POWER_CONTROLS))
def test_a_long_audit_of_every_policy_stays_below_every_accountant(policy):
    spec, audit = load_audit_spec(POWER, [f"transmit.power_control='{policy}'", "audit.trials=10000", "audit.seed=2"])
    assert_sound(audit_run(spec, audit))
