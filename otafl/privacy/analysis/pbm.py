r"""Renyi DP of the Poisson binomial mechanism (PBM) summed under secure aggregation.

The mechanism (Chen, Ozgur & Kairouz 2022): every participant encodes each coordinate x_j
in [-c, c] of its rotated vector as p_j = 1/2 + theta x_j / c and sends, per coordinate,
m Bernoulli(p_j) coins summed, Z_j ~ Binomial(m, p_j); the server sees only sum_k Z_{k,j}.
One record of user k moves its p-vector by delta with ||delta||_2 <= s = theta Delta / c and
|delta_j| <= 2 theta. The bound (docs/privacy/digital.md#digital, "PBM bound"), integer alpha >= 2,
n participants (user k and n - 1 others):

1. Group i (i = 1..m) of a coordinate is user k's coin i plus coin i of every other
   participant; the sum is a post-processing of the m independent group sums, whose
   Renyi divergences add.
2. Another participant's coin is Bernoulli(p) = (1 - 2 theta) Bernoulli(1/2)
   + 2 theta Bernoulli(q), q in [0, 1], whatever its data, so the number M of fair coins in
   a group is Binomial(n - 1, 1 - 2 theta); revealing M and the other coins only helps the
   adversary (joint convexity of E_Q[(P/Q)^alpha]).
3. One coin Bernoulli(u) against Bernoulli(v) on top of Binomial(M, 1/2) noise b:
   P/Q = 1 + (u - v) h with h(x) = (b(x-1) - b(x)) / Q(x), so for integer alpha

       E_Q[(P/Q)^alpha] = 1 + sum_{l=2}^{alpha} C(alpha, l) (u - v)^l E_Q[h^l]
                       <= 1 + sum_l C(alpha, l) |u - v|^l H_l(M),

   H_l(M) = sup_{v in [1/2 - theta, 1/2 + theta]} f(v),
   f(v) = sum_x |b(x-1) - b(x)|^l / Q_v(x)^(l-1)
   (the l = 1 term is zero). Q_v(x) = v b(x-1) + (1 - v) b(x) is affine in v and positive and
   t -> t^-(l-1) is convex on t > 0, so f is convex and its sup is at an end of the interval;
   b is symmetric, and x -> M + 1 - x gives f(v) = f(1 - v), so H_l(M) = f(1/2 - theta) exactly.
4. A coordinate: (alpha - 1) D_j <= m log(1 + Phi_n(|delta_j|)),
   Phi_n(delta) = sum_l C(alpha, l) delta^l E_M[H_l(M)].
5. Vectors: with kappa_n = m sup_{0 < delta <= d_max} log(1 + Phi_n(delta)) / delta^2,
   d_max = min(2 theta, s), sum_j m log(1 + Phi_n(delta_j)) <= kappa_n sum_j delta_j^2, so

       eps_n(alpha) <= s^2 kappa_n / (alpha - 1).

   The sup is bounded on a geometric grid delta_1 < ... < delta_G = d_max: on
   [delta_i, delta_{i+1}], Phi(delta) <= delta^2 Phi(delta_{i+1}) / delta_{i+1}^2 and
   log(1 + a x) / x falls in x, and below delta_1 the ratio is at most Phi(delta_1)/delta_1^2.

This bound is derived here (docs/privacy/digital.md#digital); the constants of Chen, Ozgur &
Kairouz's own theorem are not reproduced. It is checked against the exact Renyi
divergence of Poisson-binomial laws by convolution (tests/test_privacy_digital.py).
Pure float64 (numpy/scipy for the binomial log pmfs), memoised per parameter set.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = ["MAX_PBM_ORDER", "PBM_NOISE_CAP", "pbm_log_h", "pbm_kappa", "pbm_rdp"]

PBM_NOISE_CAP = 1024
"""Largest fair-coin count M for which H_l(M) is computed; larger M use H_l(PBM_NOISE_CAP)
(H_l falls in M, checked in the tests, so this only loosens the bound)."""

_CHUNK_ENTRIES = 1 << 21
_DELTA_GRID = 64
MAX_PBM_ORDER = 64
"""Largest Renyi order the PBM bound is evaluated at."""


@functools.lru_cache(maxsize=32)
def _log_h_np(theta: float, max_noise: int, max_order: int) -> np.ndarray:
    """log H_l(M) = log f(1/2 - theta) (step 3), vectorised over M in chunks of at most
    _CHUNK_ENTRIES (M, x, l) terms."""
    from scipy.special import gammaln

    orders = np.arange(2, max_order + 1, dtype=np.float64)
    v = 0.5 - theta
    log_v, log_1mv = math.log(v), math.log1p(-v)
    out = np.full((max_noise + 1, max_order + 1), -np.inf)
    cap = _CHUNK_ENTRIES / max(1, orders.size)  # (M, x) pairs per chunk
    start = 0
    while start <= max_noise:
        # rows r with r (start + r + 1) orders <= _CHUNK_ENTRIES (x runs over 0..stop)
        rows = max(1, int((math.sqrt((start + 1) ** 2 + 4 * cap) - (start + 1)) / 2))
        stop = min(max_noise + 1, start + rows)
        M = np.arange(start, stop, dtype=np.float64)[:, None]
        x = np.arange(stop + 1, dtype=np.float64)[None, :]  # x = 0..max M + 1
        inside = x <= M
        log_b = np.where(inside, gammaln(M + 1) - gammaln(x + 1) - gammaln(np.maximum(M - x, 0) + 1)
                         - M * math.log(2.0), -np.inf)  # log b(x), b = Binomial(M, 1/2) pmf
        log_b_prev = np.concatenate([np.full((M.shape[0], 1), -np.inf), log_b[:, :-1]], axis=1)
        # |b(x-1) - b(x)| = b(x) |2x - M - 1| / (M + 1 - x) for 1 <= x <= M; b(0) at x = 0 and
        # b(M) at x = M + 1 (zero at x = (M + 1) / 2, odd M); no cancellation
        with np.errstate(divide="ignore"):
            log_diff = np.where(inside, log_b + np.log(np.abs(2 * x - M - 1)) - np.log(np.maximum(M + 1 - x, 1)),
                                np.where(x == M + 1, log_b_prev, -np.inf))
        log_diff[:, 0] = -M[:, 0] * math.log(2.0)
        log_q = np.logaddexp(log_v + log_b_prev, log_1mv + log_b)  # log Q_v(x), v = 1/2 - theta
        with np.errstate(invalid="ignore"):  # -inf - -inf beyond x = M + 1, masked
            terms = orders * log_diff[..., None] - (orders - 1) * log_q[..., None]
        terms = np.where(np.isneginf(log_diff)[..., None], -np.inf, terms)
        peak = terms.max(axis=1, keepdims=True)  # finite: the x = 0 term is
        out[start:stop, 2:] = np.log(np.exp(terms - peak).sum(axis=1)) + peak[:, 0]
        start = stop
    out.setflags(write=False)
    return out


def pbm_log_h(theta: float, max_noise: int, max_order: int) -> torch.Tensor:
    """log H_l(M) of step 3 for M = 0..max_noise, l = 0..max_order ([M+1, L+1] float64;
    entries l < 2 are -inf, unused)."""
    return torch.from_numpy(_log_h_np(float(theta), int(max_noise), int(max_order)).copy())


def _noise_bucket(top: int) -> int:
    return max(64, 1 << max(0, int(top)).bit_length())


@functools.lru_cache(maxsize=8192)
def _kappa_all(participants: int, theta: float, d_max: float, trials: int, orders: tuple) -> np.ndarray:
    """kappa_n at each of ``orders`` (integers in [2, MAX_PBM_ORDER])."""
    from scipy.special import gammaln, logsumexp
    from scipy.stats import binom

    n = int(participants)
    top = min(n - 1, PBM_NOISE_CAP)
    a_max = max(orders)
    log_h = _log_h_np(float(theta), min(_noise_bucket(top), PBM_NOISE_CAP), MAX_PBM_ORDER)[:, 2:a_max + 1]
    M = np.arange(n)  # fair coins among the n - 1 others' coins of one group
    log_w = binom.logpmf(M, n - 1, 1.0 - 2.0 * theta) if n > 1 else np.zeros(1)
    log_eh = logsumexp(log_w[:, None] + log_h[np.minimum(M, top)], axis=0)  # [l] log E_M H_l(M)
    ls = np.arange(2, a_max + 1, dtype=np.float64)
    alphas = np.asarray(orders, dtype=np.float64)[:, None]
    with np.errstate(invalid="ignore"):
        log_binom = np.where(ls[None, :] <= alphas, gammaln(alphas + 1) - gammaln(ls + 1)
                             - gammaln(np.maximum(alphas - ls, 0) + 1), -np.inf)
    grid = d_max * np.geomspace(1e-3, 1.0, _DELTA_GRID)
    terms = (log_binom + log_eh[None, :])[:, None, :] + ls[None, None, :] * np.log(grid)[None, :, None]
    peak = terms.max(axis=2)
    log_phi = peak + np.log(np.exp(terms - peak[..., None]).sum(axis=2))  # [alpha, grid] log Phi
    # below grid[0]: log(1 + Phi)/d^2 <= Phi(grid[0]) / grid[0]^2
    ratio0 = np.exp(log_phi[:, 0] - 2 * math.log(grid[0]))
    # on [grid[i], grid[i+1]]: <= log(1 + grid[i]^2 Phi(grid[i+1]) / grid[i+1]^2) / grid[i]^2
    log_arg = log_phi[:, 1:] - 2 * np.log(grid[1:]) + 2 * np.log(grid[:-1])
    inner = np.where(log_arg > 700.0, np.inf,
                     np.log1p(np.exp(np.minimum(log_arg, 700.0))) / grid[:-1] ** 2)
    out = trials * np.maximum(ratio0, inner.max(axis=1))
    out.setflags(write=False)
    return out


def pbm_kappa(*, order: int, participants: int, theta: float, d_max: float, trials: int) -> float:
    """kappa_n of step 5 (per unit s^2): (alpha - 1) eps_n(alpha) <= s^2 kappa_n."""
    if not 2 <= int(order) <= MAX_PBM_ORDER:
        raise ValueError(f"order = {order!r} is outside the allowed range [2, {MAX_PBM_ORDER}]")
    return float(_kappa_all(int(participants), float(theta), float(d_max), int(trials), (int(order),))[0])


def pbm_rdp(*, orders, participants, trials: int, theta: float, sensitivity: float,
            box: float) -> torch.Tensor:
    """RDP eps_n(alpha) of the PBM sum of n participants (module docstring, step 5).

    Parameters
    ----------
    orders : sequence of integers >= 2.
    participants : [N] integers >= 1 (n, user k included).
    trials : m >= 1 coins per coordinate.   theta : in (0, 1/2).
    sensitivity : Delta, l2 distance of user k's two (clipped, rotated) vectors.
    box : c > 0, the per-coordinate bound of the encoding (|x_j| <= c).

    Returns
    -------
    [N, A] float64 eps_n(alpha) (+inf where it overflows).
    """
    s = float(theta) * float(sensitivity) / float(box)
    d_max = min(2.0 * float(theta), s)
    n_values = [int(n) for n in torch.as_tensor(participants).reshape(-1).tolist()]
    out = torch.empty(len(n_values), len(orders), dtype=torch.float64)
    idx = np.asarray([int(a) for a in orders])
    if idx.min() < 2 or idx.max() > MAX_PBM_ORDER:
        raise ValueError(f"orders must lie in [2, {MAX_PBM_ORDER}], found {orders!r}")
    key = tuple(int(a) for a in idx)
    for i, n in enumerate(n_values):
        kappa = _kappa_all(n, float(theta), d_max, int(trials), key)
        out[i] = torch.from_numpy(s * s * kappa / (idx - 1))
    return out
