"""The root finder of round_epsilon (otafl.privacy.analysis.roots): its brackets and its pace."""

from __future__ import annotations

import numpy as np
import torch

from otafl.privacy.accountants import exact_run as er
from otafl.privacy.analysis.gaussian import gaussian_hockey_stick
from otafl.privacy.analysis.roots import bracketed_root, sign_gap
from otafl.privacy.facts import uniform_facts

F64 = torch.float64


def _counted(fn, count):
    def evaluate(mask, x):
        count.append(int(mask.sum()))
        out = torch.zeros_like(x)
        out[mask] = fn(x)[mask]
        return out
    return evaluate


def test_gaussian_roots_are_bracketed_from_above_within_the_tolerance_in_few_steps():
    """The Gaussian mechanism's epsilon at delta = 1e-5 for noise 0.5 ... 20 (sensitivity 1):
    the returned point meets the target, a point xtol (1 + eps) below it does not, and from the
    bracket [0, 2 eps_true + 1] it takes at most 8 evaluations a row (secant steps on sign_gap)."""
    sigma = torch.tensor([0.5, 1.0, 2.0, 5.0, 20.0], dtype=F64)
    t = torch.full_like(sigma, 1e-5)
    delta = lambda e: gaussian_hockey_stick(epsilon=e, sensitivity=torch.ones_like(e), noise_std=sigma)  # noqa: E731
    root_t = torch.sqrt(-torch.log(t))
    fn = lambda e: sign_gap(delta(e), root_t)  # noqa: E731
    lo, hi = torch.zeros_like(sigma), 2.0 / sigma + 10.0
    count = []
    got = bracketed_root(_counted(fn, count), lo, hi, fn(lo), fn(hi), torch.ones_like(sigma, dtype=torch.bool), 1e-9)
    assert bool((delta(got) <= t).all())
    assert bool((delta(got - 1e-9 * (1 + got)) > t).all())
    assert sum(count) <= 8 * len(sigma)


def test_a_step_function_is_bisected_to_the_tolerance():
    """A sign change with no slope to follow (no secant step is worth taking): the safeguards
    still close every bracket to xtol (1 + hi), around the jump."""
    jump = torch.tensor([0.1, 0.37, 2.5, 7.0], dtype=F64)
    fn = lambda x: torch.where(x < jump, torch.ones_like(x), -torch.ones_like(x))  # noqa: E731
    lo, hi = torch.zeros_like(jump), torch.full_like(jump, 10.0)
    got = bracketed_root(_counted(fn, []), lo, hi, fn(lo), fn(hi), torch.ones_like(jump, dtype=torch.bool), 1e-9)
    assert bool((got >= jump).all()) and bool((got <= jump + 1e-9 * (1 + got)).all())


def test_eq_5_roots_of_a_fading_run_take_fewer_evaluations_than_illinois_steps_on_log_delta(monkeypatch):
    """Rows of a fading run (K = 200, d = 7850, 6 rounds): eq. (5)'s solve from scratch takes at
    most 8.5 row evaluations a central row and 11.5 a local one (8.0 and 10.3 here; Illinois
    steps on log delta - log target took 10.3 and 13.2)."""
    from otafl.privacy.analysis import ota_round

    gains = 0.5 * (1.0 + np.sqrt(np.random.default_rng(0).exponential(size=6)))
    facts = [uniform_facts(200, 0.5, 0.1, float(c), 1.0, 2.0, 7850) for c in gains]
    rows, inner = [], ota_round.round_delta
    monkeypatch.setattr(ota_round, "round_delta", lambda e, s, **k: rows.append(s.participation_prob.shape[0])
                        or inner(e, s, **k))
    for kind, most in (("central", 8.5), ("local", 11.5)):
        keys = list(dict.fromkeys(k for ks in er.run_row_keys(facts, kind) for k in ks))
        rows.clear()
        eps = ota_round.round_epsilon(torch.full((len(keys),), 1e-5, dtype=F64), er._spec(keys, 1e-12),
                                      conditioning="total")
        assert bool(torch.isfinite(eps).all()) and bool((eps > 0).all())
        assert sum(rows) <= most * len(keys)
