r"""Distributed DP under secure aggregation: the participants' count law, Renyi mixtures and
their conversion, and the summed-Gaussian mechanism (privacy profile and PLD).

The noise of the released sum comes only from the participants. The accountants condition
on who took part (the server of an orthogonal-access system sees who transmitted): for
user k, with probability 1 - p_k the output does not depend on its data (the same law R
under both neighbouring datasets); with probability p_k the sum carries user k's value and
the noise shares of n = 1 + N participants, N the number of other participants. By joint
convexity of E_Q[(P/Q)^alpha] and of the hockey-stick divergence over this mixture (whose
weights do not depend on the data):

    exp((alpha - 1) eps(alpha)) <= (1 - p) + p sum_n w_n exp((alpha - 1) eps_n(alpha)),
    delta(eps) <= p sum_n w_n delta_n(eps),

w_n = P(N = n - 1). The worst user has p = max_k p_k and N ~ PoissonBinomial(p without one
maximal entry): every other user's N stochastically dominates it and eps_n falls in n.
Composition over rounds adds the Renyi orders (Mironov 2017); the conversion to
(eps, delta) is Balle et al. (2020, Thm 21), as Opacus' get_privacy_spent. See
docs/privacy/digital.md#digital.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from otafl.privacy.analysis.concentration import poisson_binomial_pmf
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon, gaussian_hockey_stick

__all__ = [
    "DIGITAL_ORDERS",
    "others_count_law",
    "participant_window",
    "rdp_mixture",
    "rdp_to_epsilon",
    "gaussian_conditional_epsilon",
    "gaussian_round_pld",
]

DIGITAL_ORDERS: tuple[int, ...] = (*range(2, 33), 40, 48, 56, 64)
"""Integer Renyi orders of the digital accountants (the Skellam and PBM bounds need integers)."""

WINDOW_TAIL = 1e-15
"""Count-law mass left out of a window on each side (charged pessimistically, see
:func:`participant_window`)."""


def _binomial_pmf(trials: int, p: float) -> Tensor:
    n = torch.arange(trials + 1, dtype=torch.float64)
    if p <= 0.0 or p >= 1.0:
        out = torch.zeros(trials + 1, dtype=torch.float64)
        out[0 if p <= 0.0 else trials] = 1.0
        return out
    log_pmf = (torch.lgamma(torch.tensor(trials + 1.0, dtype=torch.float64)) - torch.lgamma(n + 1)
               - torch.lgamma(trials - n + 1) + n * math.log(p) + (trials - n) * math.log1p(-p))
    return torch.exp(log_pmf)


def others_count_law(participation_prob) -> tuple[float, Tensor]:
    """(p_max, pmf of N) for the worst user of a round.

    participation_prob : [K] float in [0, 1]. Returns p_max and the [K] pmf of the number of
    *other* participants N = 0..K-1 (binomial when every p is equal, else the Poisson
    binomial of p with one maximal entry removed).
    """
    p = torch.as_tensor(participation_prob, dtype=torch.float64).reshape(-1)
    K = p.numel()
    p_max = float(p.max()) if K else 0.0
    if K <= 1:
        return p_max, torch.ones(1, dtype=torch.float64)
    if bool((p == p[0]).all()):
        return p_max, _binomial_pmf(K - 1, float(p[0]))
    drop = int(torch.argmax(p))
    others = torch.cat([p[:drop], p[drop + 1:]])
    return p_max, poisson_binomial_pmf(others).clamp(min=0.0)


def participant_window(pmf: Tensor, tail: float = WINDOW_TAIL, *, cut_below: float = 0.0
                       ) -> tuple[Tensor, Tensor, float]:
    """Participant counts n = 1 + N and their weights, the tails handled pessimistically.

    The upper tail (mass <= ``tail``) is charged to the largest kept n (fewer participants
    leak more). The lower tail: with ``cut_below = 0`` the mass <= ``tail`` is charged to
    n = 1 (user k's own share only: the largest leakage; right for privacy profiles, where
    it adds at most its mass to delta); with ``cut_below = tau > 0`` the counts with
    P(N < n - 1) <= tau are dropped and their mass returned, to be charged to delta as a
    failure event (right for Renyi mixtures, where a rare tiny n dominates high orders).

    Returns (n [W] int64, weights [W] float64, cut mass).
    """
    pmf = torch.as_tensor(pmf, dtype=torch.float64)
    cdf = torch.cumsum(pmf, 0)
    cut = float(cut_below)
    lo = int(torch.searchsorted(cdf, torch.tensor([max(tail, cut)], dtype=torch.float64)))
    lo = min(lo, pmf.numel() - 1)
    upper = torch.flip(torch.cumsum(torch.flip(pmf, [0]), 0), [0])  # P(N >= i)
    hi = int((upper > tail).nonzero().max()) if bool((upper > tail).any()) else pmf.numel() - 1
    hi = max(hi, lo)
    w = pmf[lo:hi + 1].clone()
    w[-1] += float(pmf[hi + 1:].sum())
    n = torch.arange(lo, hi + 1, dtype=torch.int64) + 1
    low_mass = float(pmf[:lo].sum())
    if cut > 0.0:
        return n, w, low_mass
    if low_mass > 0.0:
        if lo == 0:
            w[0] += low_mass
        else:
            n = torch.cat([torch.ones(1, dtype=torch.int64), n])
            w = torch.cat([torch.tensor([low_mass], dtype=torch.float64), w])
    return n, w, 0.0


def rdp_mixture(*, participation_prob: float, weights: Tensor, rdp: Tensor, orders) -> Tensor:
    """eps(alpha) of a round: log((1 - p) + p sum_n w_n exp((alpha-1) eps_n(alpha))) / (alpha - 1).

    weights : [W] (if they sum to 1 - tau < 1, the mixture is the round conditioned on the
    count not being in the cut tail: the result is divided by 1 - p tau); rdp : [W, A]
    eps_n(alpha) (may be +inf); returns [A] float64.
    """
    a = torch.as_tensor(orders, dtype=torch.float64)
    p = float(participation_prob)
    if p <= 0.0:
        return torch.zeros_like(a)
    w = torch.as_tensor(weights, dtype=torch.float64)
    log_inner = torch.logsumexp(torch.log(w).unsqueeze(-1) + (a - 1) * rdp, dim=0)  # [A]
    if p >= 1.0:
        total = log_inner
    else:
        total = torch.logaddexp(torch.full_like(a, math.log1p(-p)), math.log(p) + log_inner)
    kept = float(w.sum())
    if kept < 1.0:
        total = total - math.log1p(-p * (1.0 - kept))
    return total / (a - 1)


def rdp_to_epsilon(rdp: Tensor, orders, delta: float) -> tuple[float, float]:
    """(eps, alpha*) = min_alpha rdp(alpha) + ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1)
    (Balle et al. 2020, Thm 21); +inf when every order is infinite or delta <= 0."""
    if not delta > 0.0:
        return math.inf, math.nan
    a = torch.as_tensor(orders, dtype=torch.float64)
    eps = rdp + torch.log((a - 1) / a) - (math.log(delta) + torch.log(a)) / (a - 1)
    eps = torch.where(torch.isfinite(rdp), eps, torch.full_like(eps, math.inf))
    i = int(torch.argmin(eps))
    best = float(eps[i])
    return (max(best, 0.0), float(a[i])) if math.isfinite(best) else (math.inf, math.nan)


def gaussian_conditional_epsilon(*, weights, noise_std, sensitivity: float, delta: float,
                                 iterations: int = 64) -> float:
    """Smallest eps with sum_n w_n delta_G(eps; Delta, s_n) <= delta (bisection; the feasible end).

    weights : [W] summing to 1; noise_std : [W] s_n (0: no noise). With one weight this is
    the analytic Gaussian mechanism (Balle & Wang 2018).
    """
    w = torch.as_tensor(weights, dtype=torch.float64)
    s = torch.as_tensor(noise_std, dtype=torch.float64)
    if w.numel() == 1:
        return float(analytic_gaussian_epsilon(sensitivity=sensitivity, noise_std=s[0], delta=delta))
    if bool(((s == 0) & (w > 0)).any()) and float(w[s == 0].sum()) > delta:
        return math.inf
    hi = float(analytic_gaussian_epsilon(sensitivity=sensitivity, noise_std=s[w > 0].min(), delta=delta))
    if not math.isfinite(hi):
        hi = 1e4
    lo = 0.0

    def profile(eps: float) -> float:
        return float((w * gaussian_hockey_stick(epsilon=eps, sensitivity=sensitivity, noise_std=s)).sum())

    if profile(0.0) <= delta:
        return 0.0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if profile(mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


#: Most grid points of one round's PLD (16 MB of float64).
MAX_PLD_POINTS = 2_000_000


def gaussian_round_pld(*, participation_prob: float, weights, noise_std, sensitivity: float,
                       interval: float = 2e-4, tail: float = 1e-15):
    """Pessimistic PLD of one round: (1 - p) (no leakage) + p sum_n w_n Gaussian(Delta, s_n).

    A mixture of privacy-loss distributions with data-independent weights is the PLD of the
    mechanism that also reveals the mixture's index, which dominates the round. For the
    Gaussian pair N(Delta, s^2) vs N(0, s^2) the privacy loss is N(mu, 2 mu),
    mu = Delta^2 / (2 s^2) (Balle & Wang 2018); each component's loss is rounded *up* to the
    grid ``interval`` (pessimistic), the lower tail beyond ``tail`` is moved up to the first
    kept point and the upper tail to +inf. Returns a dp_accounting PrivacyLossDistribution
    (symmetric: the Gaussian pairs are).
    """
    import numpy as np
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from scipy.special import ndtr, ndtri

    w = np.asarray(torch.as_tensor(weights, dtype=torch.float64).tolist(), dtype=np.float64).reshape(-1)
    s = np.asarray(torch.as_tensor(noise_std, dtype=torch.float64).tolist(), dtype=np.float64).reshape(-1)
    p = float(participation_prob)
    w = p * w / w.sum() if w.sum() > 0 else w * 0.0
    inf_mass = float(w[s == 0].sum())
    keep = (w > 0) & (s > 0) & np.isfinite(s)
    mu = sensitivity ** 2 / (2 * s[keep] ** 2)
    sd = np.sqrt(2 * mu)
    z = -ndtri(tail)
    lo_loss = np.clip(np.floor((mu - z * sd) / interval), -2.0**62, 2.0**62).astype(np.int64)  # castable
    hi_loss = np.clip(np.ceil((mu + z * sd) / interval), -2.0**62, 2.0**62).astype(np.int64)
    k_lo = int(min(0, lo_loss.min())) if mu.size else 0
    # At most MAX_PLD_POINTS grid points (a noise of 1e-30 once asked for ~1e18): the loss
    # beyond the grid's top goes to +inf, which only raises epsilon (pessimistic).
    k_top = k_lo + MAX_PLD_POINTS - 1
    hi_loss = np.minimum(hi_loss, k_top)
    fits = lo_loss <= hi_loss  # else the whole component lies beyond the grid
    k_hi = int(max(0, hi_loss[fits].max())) if fits.any() else 0
    probs = np.zeros(k_hi - k_lo + 1)
    probs[-k_lo] += max(0.0, 1.0 - p) + float(w[~keep & (s != 0)].sum())  # no leakage: loss 0
    for wi, mi, si, a, b in zip(w[keep], mu, sd, lo_loss, hi_loss):
        if a > b:  # the whole component lies beyond the grid
            inf_mass += wi
            continue
        edges = np.arange(a, b + 1) * interval  # loss in (edge[i-1], edge[i]] -> edge[i]
        cdf = ndtr((edges - mi) / si)
        part = np.diff(cdf, prepend=0.0)  # part[0]: everything <= edges[0] (moved up to it)
        probs[a - k_lo:b - k_lo + 1] += wi * part
        inf_mass += wi * max(0.0, 1.0 - float(cdf[-1]))
    pmf = pld_pmf.DensePLDPmf(discretization=interval, lower_loss=k_lo, probs=probs,
                              infinity_mass=inf_mass, pessimistic_estimate=True)
    return pld_lib.PrivacyLossDistribution(pmf)
