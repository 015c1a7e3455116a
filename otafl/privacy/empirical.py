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

__all__ = ["EmpiricalEpsilon", "GDP_FIT", "GaussianFit", "empirical_epsilon", "CONFIDENCE", "SELECTION", "dkw_band",
           "gaussian_fit", "gdp_delta", "gdp_epsilon", "SAMPLED_FIT", "sampled_fit", "sampled_epsilon"]

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


# --------------------------------------------------------------------------- Gaussian-DP fit


GDP_FIT = "gdp"
"""The fit's name in audit-run's output: the mechanism's trade-off curve taken as Gaussian's."""


@dataclass(frozen=True)
class GaussianFit:
    """mu_lower: with probability >= ``confidence`` the mechanism is not mu'-GDP for any mu' < mu_lower
    (every point of its trade-off curve at once, docs/privacy/auditing.md#auditing); point: the
    threshold where the bound is attained (threshold, false-positive and false-negative upper ends)."""

    mu_lower: float
    point: dict
    band: tuple[float, float]


def dkw_band(n: int, alpha: float) -> float:
    """Half-width of the one-sided Dvoretzky-Kiefer-Wolfowitz-Massart band: the empirical CDF of n
    i.i.d. samples stays within it of the true CDF at every point at once, with probability >= 1 - alpha."""
    return math.sqrt(math.log(1.0 / alpha) / (2.0 * n))


def gaussian_fit(present: np.ndarray, absent: np.ndarray, *, confidence: float = 2 * CONFIDENCE - 1) -> GaussianFit:
    """Lower bound on the Gaussian-DP parameter mu from a statistic that is larger under D (``present``).

    Every threshold t gives a test "D when stat > t" with false-positive rate a(t) = P_D'(stat > t)
    and false-negative rate b(t) = P_D(stat <= t). A mu-GDP mechanism has
    b >= Phi(Phi^-1(1 - a) - mu) for every test, so mu >= Phi^-1(1 - a) - Phi^-1(b). Both rates get
    upper ends valid at every threshold at once (one-sided DKW bands, each at (1 + confidence) / 2),
    so the maximum over all thresholds of Phi^-1(1 - a_hi) - Phi^-1(b_hi) is a lower bound on mu
    at ``confidence`` without any selection split. The statistic must be fixed before these
    samples are drawn (audit-run fits it on other trials)."""
    from scipy.special import ndtri

    present, absent = np.sort(np.asarray(present, dtype=np.float64)), np.sort(np.asarray(absent, dtype=np.float64))
    n_p, n_a = present.size, absent.size
    alpha = (1.0 - confidence) / 2.0
    e_p, e_a = dkw_band(n_p, alpha), dkw_band(n_a, alpha)
    t = np.unique(np.concatenate([present, absent]))
    fpr = (n_a - np.searchsorted(absent, t, side="right")) / n_a + e_a
    fnr = np.searchsorted(present, t, side="right") / n_p + e_p
    ok = (fpr < 1.0) & (fnr < 1.0)
    if not ok.any():
        return GaussianFit(0.0, {"rule": "none"}, (e_p, e_a))
    mu = np.full(t.shape, -np.inf)
    mu[ok] = ndtri(1.0 - fpr[ok]) - ndtri(fnr[ok])
    i = int(np.argmax(mu))
    point = {"rule": "D when stat > t", "threshold": float(t[i]), "fpr_upper": float(fpr[i]),
             "fnr_upper": float(fnr[i]), "samples": [n_p, n_a]}
    return GaussianFit(max(0.0, float(mu[i])), point, (e_p, e_a))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth & Su 2022)."""
    from scipy.special import log_ndtr, ndtr

    if mu <= 0:
        return 0.0
    return float(ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon + log_ndtr(-epsilon / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon of mu-GDP at ``delta`` (0 when mu-GDP is (0, delta)-DP; +inf for mu = +inf)."""
    from scipy.optimize import brentq

    if not math.isfinite(mu):
        return math.inf
    if mu <= 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-10))


# --------------------------------------------------------------------------- sampled-Gaussian fit

SAMPLED_FIT = "sampled-gaussian"
"""The fit's name where the target takes part with a known probability p < 1."""
FIT_POINTS = 400
"""Thresholds (quantiles of the pooled scores) at which the sampled-Gaussian family is fitted."""


def _sampled_curve(mu: np.ndarray, p: float, relation: str, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta) of the test "D when x > t" for the family: x ~ (1 - p) N(0, 1) + p N(+m, 1) under D
    and (1 - p) N(0, 1) + p N(-m, 1) under D' (``replace``, m = mu / 2), or N(0, 1) under D'
    (``add``, m = mu); p = 1 is mu-GDP. Broadcast over mu and t."""
    from scipy.special import ndtr

    m = mu / 2 if relation == "replace" else mu
    absent_branch = ndtr(-t)
    alpha = (1 - p) * absent_branch + p * (ndtr(-(t + m)) if relation == "replace" else absent_branch)
    beta = (1 - p) * ndtr(t) + p * ndtr(t - m)
    return alpha, beta


def _bisect(f, lo: np.ndarray, hi: np.ndarray, steps: int = 60) -> np.ndarray:
    """Root of the increasing f on [lo, hi] elementwise (f(lo) <= 0 <= f(hi) assumed)."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        up = f(mid) > 0
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    return 0.5 * (lo + hi)


def sampled_beta(mu: np.ndarray, p: float, relation: str, alpha: np.ndarray) -> np.ndarray:
    """The family's trade-off curve beta_mu(alpha) (:func:`_sampled_curve`; its likelihood ratio is
    monotone in x, so threshold tests are optimal)."""
    mu, alpha = np.broadcast_arrays(np.asarray(mu, dtype=np.float64), np.asarray(alpha, dtype=np.float64))
    t = _bisect(lambda s: alpha - _sampled_curve(mu, p, relation, s)[0], np.full(mu.shape, -40.0),
                np.full(mu.shape, 40.0 + mu), 48)
    return _sampled_curve(mu, p, relation, t)[1]


def sampled_fit(present: np.ndarray, absent: np.ndarray, *, p: float, relation: str,
                confidence: float = 2 * CONFIDENCE - 1) -> GaussianFit:
    """:func:`gaussian_fit` for a target that takes part with known probability p: the lower bound on
    mu of the sampled-Gaussian family (:func:`_sampled_curve`) from the same simultaneous bands. A
    point below every member's curve (beta_hi < beta_inf(alpha_hi)) fits none and is skipped."""
    present, absent = np.sort(np.asarray(present, dtype=np.float64)), np.sort(np.asarray(absent, dtype=np.float64))
    n_p, n_a = present.size, absent.size
    alpha_conf = (1.0 - confidence) / 2.0
    e_p, e_a = dkw_band(n_p, alpha_conf), dkw_band(n_a, alpha_conf)
    t = np.unique(np.quantile(np.concatenate([present, absent]), np.linspace(0, 1, FIT_POINTS)))
    fpr = (n_a - np.searchsorted(absent, t, side="right")) / n_a + e_a
    fnr = np.searchsorted(present, t, side="right") / n_p + e_p
    ok = (fpr < 1.0) & (fnr < 1.0)
    top = 40.0
    ok &= sampled_beta(np.full(t.shape, top), p, relation, np.minimum(fpr, 1.0)) <= fnr  # some member fits
    if not ok.any():
        return GaussianFit(0.0, {"rule": "none"}, (e_p, e_a))
    a, b = fpr[ok], fnr[ok]
    mu = _bisect(lambda m: b - sampled_beta(m, p, relation, a), np.zeros(a.shape), np.full(a.shape, top), 36)
    i = int(np.argmax(mu))
    point = {"rule": "D when stat > t", "threshold": float(t[ok][i]), "fpr_upper": float(a[i]),
             "fnr_upper": float(b[i]), "samples": [n_p, n_a], "p": p, "relation": relation}
    return GaussianFit(max(0.0, float(mu[i])), point, (e_p, e_a))


def sampled_delta(mu: float, p: float, relation: str, epsilon: float, grid: int = 8001) -> float:
    """delta(epsilon) of the sampled-Gaussian family, both orders of the pair: the largest
    P(x > t) - e^eps Q(x > t) over a fine grid of thresholds (threshold tests are optimal)."""
    from scipy.special import ndtr

    m = mu / 2 if relation == "replace" else mu
    t = np.linspace(-m - 12.0, m + 12.0, grid)  # beyond 12 standard deviations both tails are below 1e-32
    q_tail, p_tail = _sampled_curve(np.float64(mu), p, relation, t)
    p_tail = 1.0 - p_tail  # P_D(x > t)
    best = float(np.max(p_tail - math.exp(epsilon) * q_tail))
    # the other order: D' against D, tests "x < t"
    q_low = (1 - p) * ndtr(t) + p * (ndtr(t + m) if relation == "replace" else ndtr(t))
    best = max(best, float(np.max(q_low - math.exp(epsilon) * (1.0 - p_tail))))
    return max(0.0, best)


def sampled_epsilon(mu: float, p: float, relation: str, delta: float) -> float:
    """The epsilon of the sampled-Gaussian family member at ``delta``."""
    from scipy.optimize import brentq

    if p >= 1.0:
        return gdp_epsilon(mu if relation == "replace" else mu, delta)
    if not math.isfinite(mu):
        return math.inf
    if mu <= 0 or sampled_delta(mu, p, relation, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while sampled_delta(mu, p, relation, hi) > delta and hi < 1e3:
        hi *= 2.0
    return float(brentq(lambda e: sampled_delta(mu, p, relation, e) - delta, 0.0, hi, xtol=1e-6))
