r"""Empirical lower bounds on epsilon from samples of a mechanism's output on two neighbours.

Any (epsilon, delta)-DP mechanism M and any test ``reject`` (a set of outputs) satisfy
P(M(D) in reject) <= e^eps P(M(D') in reject) + delta, for both orders of the pair. A
threshold test on a scalar statistic therefore gives

    eps >= log( (P_D(stat > t) - delta) / P_D'(stat > t) ),

and the same with the pair swapped and with ``stat < t``. From N samples per data set the two
probabilities are estimated with exact Clopper-Pearson intervals: the lower end of the bound
uses the lower end for the numerator and the upper end for the denominator (each interval
two-sided at ``confidence``, so both hold together with probability >= 2 confidence - 1;
95% at 0.975). The test (order, direction, threshold) is chosen on a ``selection`` share of
the samples and evaluated on the rest, so that the interval is not biased by the choice
(docs/privacy/auditing.md#auditing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["EmpiricalEpsilon", "empirical_epsilon", "CONFIDENCE", "SELECTION"]

CONFIDENCE = 0.975
"""Each Clopper-Pearson interval is two-sided at this level; the pair holds at >= 95%."""
SELECTION = 0.25
"""Share of each data set's samples that chooses the test (the rest evaluates it)."""
CANDIDATES = 400
"""Thresholds tried on the selection samples (quantiles of their pooled values)."""


@dataclass(frozen=True)
class EmpiricalEpsilon:
    """epsilon_lower: the lower end (the sound lower bound at 95%); ci: (lower, upper) interval
    of the chosen test's epsilon; test: how it was chosen (order, direction, threshold, counts)."""

    epsilon_lower: float
    ci: tuple[float, float]
    delta: float
    test: dict


def _cp(hits: np.ndarray, n: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    from scipy.special import betaincinv

    hits = np.asarray(hits, dtype=np.float64)
    alpha = 1.0 - confidence
    with np.errstate(all="ignore"):
        lo = np.where(hits <= 0, 0.0, betaincinv(np.maximum(hits, 1e-300), n - hits + 1, alpha / 2))
        hi = np.where(hits >= n, 1.0, betaincinv(hits + 1, np.maximum(n - hits, 1e-300), 1 - alpha / 2))
    return lo, hi


def _log_ratio(num: np.ndarray, den: np.ndarray, delta: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(np.maximum(num - delta, 0.0) / den)
    out = np.where(num - delta <= 0, -np.inf, out)
    return np.where((den <= 0) & (num - delta > 0), np.inf, out)


def _tests(p: np.ndarray, q: np.ndarray, thresholds: np.ndarray):
    """For each (order, direction): counts of p and q samples in the rejection set at every threshold."""
    ps, qs = np.sort(p), np.sort(q)
    above_p = p.size - np.searchsorted(ps, thresholds, side="right")
    above_q = q.size - np.searchsorted(qs, thresholds, side="right")
    below_p = np.searchsorted(ps, thresholds, side="left")
    below_q = np.searchsorted(qs, thresholds, side="left")
    # (name, hits of the numerator's data set, its size, hits of the denominator's, its size)
    return [("D>", above_p, p.size, above_q, q.size), ("D<", below_p, p.size, below_q, q.size),
            ("D'>", above_q, q.size, above_p, p.size), ("D'<", below_q, q.size, below_p, p.size)]


def empirical_epsilon(present: np.ndarray, absent: np.ndarray, *, delta: float, confidence: float = CONFIDENCE,
                      selection: float = SELECTION) -> EmpiricalEpsilon:
    """Lower bound on epsilon at ``delta`` from the statistic's samples under D (``present``)
    and D' (``absent``) (module docstring). The first ``selection`` share of each array chooses
    the test; the samples must be in draw order (independent, identically distributed)."""
    present, absent = np.asarray(present, dtype=np.float64), np.asarray(absent, dtype=np.float64)
    sp, sa = int(present.size * selection), int(absent.size * selection)
    pool = np.concatenate([present[:sp], absent[:sa]])
    pool = pool[np.isfinite(pool)]
    if pool.size == 0 or present.size - sp < 1 or absent.size - sa < 1:
        return EmpiricalEpsilon(0.0, (0.0, math.inf), delta, {"rule": "none"})
    thresholds = np.unique(np.quantile(pool, np.linspace(0.0, 1.0, CANDIDATES)))
    best = (-math.inf, None)
    for name, hn, nn, hd, nd in _tests(present[:sp], absent[:sa], thresholds):
        # score on the selection samples: the lower end the test would give there
        lo, _ = _cp(hn, nn, confidence)
        _, hi = _cp(hd, nd, confidence)
        score = _log_ratio(lo, hi, delta)
        i = int(np.argmax(score))
        if score[i] > best[0]:
            best = (float(score[i]), (name, float(thresholds[i])))
    if best[1] is None:
        return EmpiricalEpsilon(0.0, (0.0, math.inf), delta, {"rule": "none"})
    name, t = best[1]
    ep, ea = present[sp:], absent[sa:]
    row = {n: (hn, nn, hd, nd) for n, hn, nn, hd, nd in _tests(ep, ea, np.array([t]))}[name]
    hn, nn, hd, nd = (int(np.asarray(v).reshape(-1)[0]) if not isinstance(v, int) else v for v in row)
    n_lo, n_hi = _cp(np.array([hn]), nn, confidence)
    d_lo, d_hi = _cp(np.array([hd]), nd, confidence)
    lower = float(_log_ratio(n_lo, d_hi, delta)[0])
    upper = float(_log_ratio(n_hi, d_lo, delta)[0])
    test = {"rule": f"reject when stat {name[-1]} t, numerator {name[:-1]}", "threshold": t,
            "numerator_hits": hn, "denominator_hits": hd, "evaluated": [nn, nd], "selected_on": [sp, sa]}
    return EmpiricalEpsilon(max(0.0, lower), (max(0.0, lower), max(0.0, upper)), delta, test)
