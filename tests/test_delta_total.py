"""privacy.delta_total: every accountant states its run totals at the one delta the user sets."""

import copy
import functools
import math

import pytest

from otafl.config import load_spec
from otafl.errors import OtaflInputError
from otafl.fl.loop import run_experiment
from otafl.privacy.accountants.result import delta_too_large

# transmit.sigma2 = 1: the steps accountant's PLDs stay small (at 0.1 its totals near eps 170 took 5x longer)
SMALL = ["data.name=synthetic", "data.users=20", "data.batch_size=8", "channel.snr_db=10", "train.rounds=6",
         "transmit.sigma2=1", "privacy.accountants=['exact', 'paper', 'tight', 'steps']"]


@functools.lru_cache(maxsize=None)
def _cached(extra: tuple) -> dict:
    return run_experiment(load_spec(None, SMALL + list(extra)), train=False).summary


def _summary(extra=()):
    """A bounds-only run's summary (each spec computed once per process; a copy)."""
    return copy.deepcopy(_cached(tuple(extra)))


def test_every_total_is_stated_at_the_default_delta_total():
    s = _summary()
    assert s["delta_total"] == 1e-5
    for a in ("exact", "paper", "tight", "steps"):
        assert s[f"{a}_delta_central_total"] == 1e-5
        assert s[f"{a}_delta_local_total"] == 1e-5
    assert math.isfinite(s["exact_epsilon_central_total"])


def test_a_larger_delta_total_moves_every_total_and_lowers_exact():
    s, big = _summary(), _summary(["privacy.delta_total=1e-3"])
    for a in ("exact", "paper", "tight", "steps"):
        assert big[f"{a}_delta_central_total"] == 1e-3
    assert big["exact_epsilon_central_total"] < s["exact_epsilon_central_total"]


def test_unreachable_total_is_inf_with_a_reason_not_a_moved_delta():
    s = _summary(["privacy.delta_prime=1e-4"])  # 6 rounds x 1e-4 of concentration tails > 1e-5
    assert s["tight_epsilon_central_total"] == math.inf
    assert s["tight_delta_central_total"] == 1e-5
    assert "delta_total" in s["tight_total_reason"]


@pytest.mark.parametrize("bad", ["0", "1", "-1e-5", "'auto'"])
def test_delta_total_outside_0_1_is_refused(bad):
    with pytest.raises(OtaflInputError, match="privacy.delta_total"):
        load_spec(None, SMALL + [f"privacy.delta_total={bad}"])


def test_delta_flag_uses_one_over_k_or_the_users_limit():
    assert delta_too_large(0.1, 200) and not delta_too_large(1e-5, 200)
    assert delta_too_large(1e-4, 200, max_delta=1e-5) and not delta_too_large(float("nan"), 200)
