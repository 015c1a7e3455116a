"""The Gaussian mechanism (classic and analytic) and privacy amplification by sampling.

Pure, batched float64 functions with keyword-only arguments (the style of Opacus'
``accountants/analysis/rdp.py``). Every argument may be a Python number or a tensor;
tensors broadcast against each other and the result lives on their device.

Conventions: ``sensitivity`` Delta is the l2-sensitivity of the released quantity,
``noise_std`` s the standard deviation of the isotropic Gaussian noise, in the same
units (gradient units in this package). ``noise_std = 0`` means no noise (epsilon = +inf),
``noise_std = inf`` means no signal (epsilon = 0).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "as_float64",
    "broadcast_shapes",
    "classic_gaussian_epsilon",
    "analytic_gaussian_epsilon",
    "exp_diff",
    "log_expm1",
    "gaussian_hockey_stick",
    "amplify_by_sampling",
]


def as_float64(*values, device: torch.device | str | None = None) -> list[Tensor]:
    """Convert numbers/tensors to broadcast-compatible float64 tensors on one device.

    The device is ``device`` if given, else that of the first tensor argument, else CPU.
    """
    if device is None:
        device = next((v.device for v in values if isinstance(v, Tensor)), torch.device("cpu"))
    return [torch.as_tensor(v, dtype=torch.float64, device=device) for v in values]



def broadcast_shapes(*shapes) -> torch.Size:
    """``torch.broadcast_shapes`` without its cost: torch's imports sympy on its first call
    (1.3 s, paid by every process that accounts a round); numpy's rule is the same."""
    import numpy as np

    return torch.Size(np.broadcast_shapes(*(tuple(s) for s in shapes)))

def classic_gaussian_epsilon(*, sensitivity, noise_std, delta) -> Tensor:
    """Classic Gaussian-mechanism epsilon (Dwork & Roth 2014, Thm A.1).

        eps = (Delta / s) * sqrt(2 ln(1.25 / delta))

    Parameters
    ----------
    sensitivity : [...], float  -- l2-sensitivity Delta >= 0.
    noise_std : [...], float    -- noise standard deviation s >= 0 (same units as Delta).
    delta : [...], float        -- failure probability in (0, 1).

    Returns
    -------
    eps : [...], float64. +inf where s = 0 and Delta > 0.

    Notes
    -----
    The theorem only holds for eps <= 1 (Dwork & Roth require eps < 1; the bound is
    continuous at 1). Outside that range the formula can *understate* the true leakage
    (for Delta/s above about 2 the exact epsilon of :func:`analytic_gaussian_epsilon`
    is larger), so callers report ``eps <= 1`` as a validity flag.
    """
    sensitivity, noise_std, delta = as_float64(sensitivity, noise_std, delta)
    ratio = torch.where(sensitivity == 0, torch.zeros_like(noise_std), sensitivity / noise_std)
    return ratio * torch.sqrt(2.0 * torch.log(1.25 / delta))


def _log_hockey_stick(eps: Tensor, ratio: Tensor) -> Tensor:
    """log delta(eps) of N(Delta, s^2) vs N(0, s^2), with ratio = Delta / s > 0 finite.

    Balle & Wang 2018, Thm 8:
        delta(eps) = Phi(r/2 - eps/r) - e^eps Phi(-r/2 - eps/r),   r = Delta / s,
    evaluated as log Phi(a) + log(1 - exp(eps + log Phi(b) - log Phi(a))) so it stays
    finite for tiny delta and large eps.
    """
    log_a = torch.special.log_ndtr(ratio / 2 - eps / ratio)
    log_b = torch.special.log_ndtr(-ratio / 2 - eps / ratio)
    # The exponent is <= 0 in exact arithmetic; clamp rounding so log(-expm1) stays real.
    x = torch.clamp(eps + log_b - log_a, max=0.0)
    return log_a + torch.log(-torch.expm1(x))


def exp_diff(log_pos: Tensor, log_neg: Tensor) -> Tensor:
    """exp(log_pos) - exp(log_neg) without overflow (may be negative); 0 where both are -inf."""
    gap = (log_neg - log_pos).clamp(max=700.0)
    out = torch.exp(log_pos) * -torch.expm1(gap)
    return torch.where(torch.isneginf(log_pos) & torch.isneginf(log_neg), torch.zeros_like(out), out)


def log_expm1(x: Tensor) -> Tensor:
    """log(e^x - 1) for x >= 0 without overflow: ``log(expm1(x))`` up to x = 30, then
    ``x + log1p(-e^-x)`` (``expm1`` overflows above x = 709.78, where the plain form would
    return +inf and the callers' tails would vanish). -inf at x = 0."""
    x = torch.as_tensor(x, dtype=torch.float64)
    small = torch.log(torch.expm1(torch.clamp(x, max=30.0)))
    return torch.where(x > 30.0, x + torch.log1p(-torch.exp(-x)), small)


def gaussian_hockey_stick(*, epsilon, sensitivity, noise_std) -> Tensor:
    """delta(eps): the hockey-stick divergence of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

    The pair N(Delta, s^2) vs N(0, s^2), equivalently N(+a, s^2) vs N(-a, s^2) with
    a = Delta / 2 (the form of the ``exact`` accountant's mixtures, where s^2 = W):

        delta(eps) = Phi(a/s - eps s/(2a)) - e^eps Phi(-a/s - eps s/(2a)),

    each term in log space (:func:`torch.special.log_ndtr`), their difference by
    :func:`exp_diff`, so it stays accurate for tiny delta and large eps.

    Parameters
    ----------
    epsilon : [...], float >= 0.
    sensitivity : [...], float Delta >= 0 (= 2a).
    noise_std : [...], float s >= 0 (same units as Delta).

    Returns
    -------
    delta : [...], float64 -- the smallest delta for which the mechanism is (eps, delta)-DP.
    1 where s = 0 < Delta; 0 where Delta = 0 or s = inf.
    """
    epsilon, sensitivity, noise_std = as_float64(epsilon, sensitivity, noise_std)
    eps, sens, s = torch.broadcast_tensors(epsilon, sensitivity, noise_std)
    a = sens / 2
    z1 = a / s - eps * s / (2 * a)
    z2 = -a / s - eps * s / (2 * a)
    out = exp_diff(torch.special.log_ndtr(z1), eps + torch.special.log_ndtr(z2))
    out = torch.where(s > 0, out.clamp(min=0.0), torch.ones_like(out))
    return torch.where((sens == 0) | torch.isinf(s), torch.zeros_like(out), out)


def analytic_gaussian_epsilon(*, sensitivity, noise_std, delta, iterations: int = 25) -> Tensor:
    """Exact epsilon of the Gaussian mechanism (Balle & Wang 2018, "analytic Gaussian").

    The smallest eps >= 0 with

        delta(eps) = Phi(Delta/(2s) - eps s/Delta) - e^eps Phi(-Delta/(2s) - eps s/Delta) <= delta.

    delta(eps) decreases in eps with d delta/d eps = -e^eps Phi(-r/2 - eps/r) (r = Delta/s),
    so g(eps) = log delta(eps) - log delta has a single root. It is found on the whole
    batch at once by Newton's method on g, safeguarded by a bracket [lo, hi] with
    g(hi) <= 0 < g(lo) (a bisection step whenever Newton leaves it), in log space
    (:func:`torch.special.log_ndtr`). The bracket starts at
    [0, r^2/2 + r z_{1-delta}], whose upper end is feasible because
    delta(eps) <= Phi(r/2 - eps/r). The returned value is the bracket's feasible end, so
    it always satisfies the inequality (an upper bound on the exact root, within about
    1e-11 relative).

    Parameters
    ----------
    sensitivity : [...], float  -- Delta >= 0.
    noise_std : [...], float    -- s >= 0.
    delta : [...], float        -- in (0, 1).
    iterations : int            -- safeguarded Newton steps.

    Returns
    -------
    eps : [...], float64. +inf where s = 0 < Delta; 0 where Delta = 0 or s = inf.
    """
    sensitivity, noise_std, delta = as_float64(sensitivity, noise_std, delta)
    ratio = torch.where(sensitivity == 0, torch.zeros_like(noise_std), sensitivity / noise_std)
    ratio, delta = torch.broadcast_tensors(ratio, delta)
    shape = ratio.shape
    ratio, delta = ratio.reshape(-1), delta.reshape(-1)
    # Slices keep the ~10 temporaries per Newton step small (cache-resident).
    eps = torch.cat([_analytic_root(ratio[i:i + _CHUNK], delta[i:i + _CHUNK], iterations)
                     for i in range(0, max(ratio.numel(), 1), _CHUNK)]) if ratio.numel() else ratio.clone()
    return eps.reshape(shape)


_CHUNK = 1 << 16
_NUDGES = torch.tensor([0.0, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9, 1e-8], dtype=torch.float64)


def _analytic_root(ratio: Tensor, delta: Tensor, iterations: int) -> Tensor:
    """Safeguarded Newton for :func:`analytic_gaussian_epsilon` on flat [n] tensors.

    Points leave the iteration as soon as their Newton step is below 1e-14 relative
    (most take 3-6 steps), so the cost follows the typical, not the worst, point.
    """
    eps = torch.where(torch.isinf(ratio), torch.full_like(ratio, math.inf), torch.zeros_like(ratio))
    idx = torch.nonzero(torch.isfinite(ratio) & (ratio > 0)).squeeze(1)
    r, log_delta = ratio[idx], torch.log(delta[idx])
    # eps = 0 already satisfies the inequality: delta(0) = 1 - 2 Phi(-r/2) <= delta.
    positive = _log_hockey_stick(torch.zeros_like(r), r) > log_delta
    idx, r, log_delta = idx[positive], r[positive], log_delta[positive]
    lo = torch.zeros_like(r)
    hi = torch.clamp(r * r / 2 - r * torch.special.ndtri(torch.exp(log_delta)), min=0.0)
    x = hi
    for it in range(iterations):
        log_a = torch.special.log_ndtr(r / 2 - x / r)
        log_b = torch.special.log_ndtr(-r / 2 - x / r)
        u = torch.clamp(x + log_b - log_a, max=0.0)
        log_dx = log_a + torch.log(-torch.expm1(u))
        g = log_dx - log_delta
        feasible = g <= 0
        hi = torch.where(feasible, torch.minimum(hi, x), hi)
        lo = torch.where(feasible, lo, torch.maximum(lo, x))
        # g'(x) = -exp(x + log Phi(b) - log delta(x))
        newton = x + g * torch.exp(log_dx - x - log_b)
        inside = (newton > lo) & (newton < hi)
        x_next = torch.where(inside, newton, (lo + hi) / 2)
        done = (x_next - x).abs() <= 1e-14 * x.abs()
        x = x_next
        if it == iterations - 1:
            done = torch.ones_like(done)
        if bool(done.any()):
            # The iterate may sit a rounding error below the root: take the smallest of a few
            # upward nudges that is feasible (else the bracket's feasible end).
            xd = x[done, None] * (1 + _NUDGES.to(x.device)) + 1e-300
            ok = _log_hockey_stick(xd, r[done, None]) <= log_delta[done, None]
            best = torch.where(ok, xd, torch.full_like(xd, math.inf)).amin(-1)
            eps[idx[done]] = torch.minimum(hi[done], best)
            keep = ~done
            idx, r, log_delta, lo, hi, x = idx[keep], r[keep], log_delta[keep], lo[keep], hi[keep], x[keep]
            if idx.numel() == 0:
                break
    return eps


def amplify_by_sampling(*, epsilon, delta, sampling_rate) -> tuple[Tensor, Tensor]:
    """Privacy amplification by sampling (Balle, Barthe & Gaboardi 2018, Thm 8 / Table 1).

    A mechanism that is (eps, delta)-DP, applied to a user included with probability q
    independently of the data, is

        (log(1 + q (e^eps - 1)),  q delta)-DP.

    Evaluated as ``log1p(q * expm1(eps))`` (accurate for tiny eps and q) and, where
    eps > 700 would overflow ``expm1``, as ``logaddexp(log(1 - q), log q + eps)``.

    Parameters
    ----------
    epsilon : [...], float >= 0 (may be +inf).
    delta : [...], float in [0, 1].
    sampling_rate : [...], float q in [0, 1].

    Returns
    -------
    (eps', delta') : ([...], [...]) float64. q = 0 gives (0, 0) even for eps = +inf.
    """
    epsilon, delta, q = as_float64(epsilon, delta, sampling_rate)
    large = epsilon > 700.0
    eps = torch.log1p(q * torch.expm1(torch.clamp(epsilon, max=700.0)))
    if bool(large.any()):
        eps = torch.where(large, torch.logaddexp(torch.log1p(-q), torch.log(q) + epsilon), eps)
    eps = torch.where(q == 0, torch.zeros_like(eps), eps)
    return eps, q * delta
