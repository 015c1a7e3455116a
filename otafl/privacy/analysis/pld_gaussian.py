r"""PLD composition of the closed-form accountants' per-round Gaussian views (docs/privacy/composition.md#pld-composition).

Two per-round pairs, in units of the sensitivity Delta (noise multiplier z = s / Delta,
the user's contribution +-1/2 around the no-participation mean):

- ``sampled``: P = (1 - q) N(0, z^2) + q N(+1/2, z^2) vs Q = the same with -1/2. This is
  the replace-one pair of the fixed-noise model that ``paper``'s and ``tight``'s central
  step assume (the noise is present whether or not user k takes part, user k is included
  with probability q): dp_accounting's Poisson-subsampled Gaussian with the REPLACE_ONE
  relation (sensitivity Delta / 2 = L, noise multiplier s / L). Unlike the RDP view it
  needs no add/remove domination step; like ``exact`` it takes the antipodal pair as the
  worst.
- ``revealed``: P = (1 - p) bot + p N(+1/2, z^2) vs Q = (1 - p) bot + p N(-1/2, z^2): the
  user's participation is visible. Its profile is p H_G(eps), exactly the bound that
  joint convexity gives ``tight``'s LDP at *every* eps, so this pair dominates ``tight``'s
  local round (whatever the server can tell) and may be composed as a PLD.

Rounds are rounded to a geometric grid (q or p up, z down, ratio 1 + resolution; both
only increase the profile: joint convexity in q, post-processing in z), each distinct
cell's profile is evaluated on a common grid (:func:`~otafl.privacy.analysis.mixture.mixture_hockey_stick`,
one-dimensional with equal variances; :func:`~otafl.privacy.analysis.gaussian.gaussian_hockey_stick`)
and composed with its multiplicity by :func:`~otafl.privacy.analysis.pld.compose_profiles`.
"""

from __future__ import annotations

import math

import torch

from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon, as_float64, gaussian_hockey_stick
from otafl.privacy.analysis.mixture import mixture_hockey_stick
from otafl.privacy.analysis.round_grid import round_probability_up, round_variance_down

__all__ = ["gaussian_rounds_epsilon"]

_DT = torch.float64


def gaussian_rounds_epsilon(*, rate, noise_multiplier, delta_target: float, revealed: bool = False,
                            resolution: float = 1e-2, points: int = 64) -> float:
    """Total epsilon at ``delta_target`` of T Gaussian rounds composed by PLD.

    Parameters
    ----------
    rate : [T], float in [0, 1] -- q_t (``sampled``) or p_t (``revealed``); 0: no leakage.
    noise_multiplier : [T], float >= 0 -- z_t = s_t / Delta (0 with a positive rate: +inf).
    delta_target : total delta, in (0, 1); +inf epsilon for a target outside it.
    revealed : the pair of the module docstring.
    resolution : relative step of the grids (0: exact inputs).
    points : grid points on [0, eps_max] (eps_max where every cell's delta is below
        1e-3 delta_target / T).

    Returns
    -------
    epsilon : float (0 without a leaking round, +inf where some round has no noise).
    """
    from otafl.privacy.analysis.pld import MAX_GRID_EPS, compose_profiles, profile_grid

    if not 0.0 < delta_target < 1.0:
        return math.inf
    q, z = (t.reshape(-1).tolist() for t in as_float64(rate, noise_multiplier))
    T = len(q)
    counts: dict[tuple[float, float], int] = {}
    for qt, zt in zip(q, z):
        if qt <= 0 or zt == math.inf:
            continue
        if not zt > 0:
            return math.inf
        # z^2 rounded down on the variance grid: z shrinks by at most sqrt(1 + resolution).
        key = (round_probability_up(qt, resolution=resolution),
               math.sqrt(round_variance_down(zt * zt, resolution=resolution)))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return 0.0
    qs = torch.tensor([k[0] for k in counts], dtype=_DT)
    zs = torch.tensor([k[1] for k in counts], dtype=_DT)
    lam = torch.where(qs < 1, torch.logit(qs), torch.full_like(qs, math.inf))

    def profile(e):  # e [C, E] -> upper bounds on each cell's delta(e)
        if revealed:
            return qs[:, None] * gaussian_hockey_stick(epsilon=e, sensitivity=torch.ones_like(e), noise_std=zs[:, None])
        var = (zs * zs)[:, None].expand_as(e)
        return mixture_hockey_stick(e, log_odds=lam[:, None].expand_as(e), absent_var=var, present_var=var,
                                    half_sensitivity=torch.full_like(e, 0.5))[0]

    floor = 1e-3 * delta_target / T
    # The Gaussian mechanism (rate 1) leaks at least as much as either pair, so its epsilon
    # at the floor brackets every cell's; bisection then finds where each cell's bound
    # falls below the floor (the upper end, so the profile is below it beyond).
    hi = analytic_gaussian_epsilon(sensitivity=torch.ones_like(zs), noise_std=zs, delta=torch.full_like(zs, floor))
    if not bool(torch.isfinite(hi).all()) or float(hi.max()) > MAX_GRID_EPS:
        return math.inf
    lo = torch.zeros_like(hi)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        below = profile(mid[:, None])[:, 0] <= floor
        hi, lo = torch.where(below, mid, hi), torch.where(below, lo, mid)
    gap, eps = profile_grid(float(hi.max()), points)
    prof = profile(eps[None, :].expand(len(counts), -1))
    profiles = [(values, n) for values, n in zip(prof.clamp(0.0, 1.0).numpy(), counts.values())]
    return compose_profiles(profiles, gap=gap, delta_target=delta_target)
