r"""Liu & Simeone's closed-form epsilon (JSAC 39(1), 2021, "Privacy for free"), for comparison with ``exact``.

Their DP rule (the constraint their public code checks, kclip/Privacy4Free_DPWFL): a user's rounds are
(eps, delta)-DP if

    R = sum_t Delta_t^2 / (2 x_t)  <=  (sqrt(eps + C^2) - C)^2,     sqrt(pi) C exp(C^2) = 1 / delta,

with x_t the variance of the Gaussian noise that always covers the user's contribution in round t and
Delta_t its l2 sensitivity; so eps = R + 2 C sqrt(R) (:func:`closed_form_epsilon`).

Why it is an upper bound (docs/guides/power-control.md#liu-simeone): the T rounds' privacy loss is
N(R, 2R) (composed Gaussian mechanisms), so P(loss > eps) = Q(sqrt(2) C) <= exp(-C^2) / (2 sqrt(pi) C)
= delta / 2 <= delta, and P(loss > eps) <= delta implies (eps, delta)-DP. It stays one where the round is
dominated by such a Gaussian: with participation p <= 1 (joint convexity) and other users' noise left
out (otafl puts x_t = N0 / c_t^2 + min_k sigma_k^2, the user's own noise and the channel's). It is not
one if x_t counts noise that is not always there (the other users' artificial noise with p < 1): the
callers flag that case (``counts_others``).
"""

from __future__ import annotations

import math
from typing import Sequence

from otafl.errors import OtaflInputError, check_range

__all__ = ["closed_form_c", "closed_form_budget", "closed_form_epsilon"]


def closed_form_c(delta: float) -> float:
    """C > 0 solving sqrt(pi) C exp(C^2) = 1 / delta (bisection on log(sqrt(pi) C) + C^2 = log(1/delta),
    increasing in C), to float precision."""
    check_range("delta", delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    target = math.log(1.0 / delta)
    f = lambda c: math.log(math.sqrt(math.pi) * c) + c * c - target  # noqa: E731
    lo, hi = 1e-300, 1.0
    while f(hi) < 0:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi) if hi / max(lo, 1e-300) < 4 else math.sqrt(lo * hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return hi


def closed_form_budget(epsilon: float, delta: float) -> float:
    """The largest R = sum_t Delta_t^2 / (2 x_t) the rule allows at (epsilon, delta): (sqrt(eps + C^2) - C)^2."""
    check_range("epsilon", epsilon, lo=0.0, lo_open=True)
    c = closed_form_c(delta)
    return (math.sqrt(epsilon + c * c) - c) ** 2


def closed_form_epsilon(noise_vars: Sequence[float], sensitivity: float, delta: float) -> float:
    """eps = R + 2 C sqrt(R), R = sum_t sensitivity^2 / (2 x_t), for the rounds' noise variances x_t
    (inf for a round with no noise)."""
    check_range("sensitivity", sensitivity, lo=0.0, lo_open=True)
    if len(noise_vars) == 0:
        raise OtaflInputError("noise_vars = [] is outside the allowed range (at least one round)")
    if any(not x >= 0 for x in noise_vars):
        raise OtaflInputError(f"noise_vars holds {min(noise_vars)!r}, outside the allowed range [0, inf]")
    if any(x == 0 for x in noise_vars):
        return math.inf
    r = sum(sensitivity * sensitivity / (2.0 * x) for x in noise_vars)
    c = closed_form_c(delta)
    return r + 2.0 * c * math.sqrt(r)
