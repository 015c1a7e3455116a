"""Composition of per-round (eps, delta) guarantees over T rounds.

Three compositions, all reported at the same total delta so their epsilons compare:

- ``basic``: (sum_t eps_t, sum_t delta_t) (Dwork & Roth 2014, Thm 3.16).
- ``advanced``: heterogeneous advanced composition (Kairouz, Oh & Viswanath 2015, Thm 3.5).
- ``rdp``: each round as a Poisson-subsampled Gaussian, composed in Renyi DP by Opacus
  (:mod:`otafl.privacy.analysis.rdp`), plus the sum of the concentration events'
  probabilities delta'_t.

:func:`compose_best` takes the smallest. All functions are pure and batched over leading
dimensions, with rounds on the last one; float64. See docs/privacy/composition.md#composition.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from otafl.privacy.analysis.gaussian import as_float64
from otafl.privacy.analysis.rdp import rdp_epsilon

__all__ = [
    "COMPOSITIONS",
    "compose_basic",
    "compose_advanced",
    "compose_best",
]

COMPOSITIONS = ("basic", "advanced", "rdp", "pld")
"""Composition names; :func:`compose_best` returns an index into this tuple (-1: none finite).
``pld`` is added by :func:`otafl.privacy.accountants.run.compose_round_bounds` (and ``exact``)."""


def compose_basic(*, epsilon, delta) -> tuple[Tensor, Tensor]:
    """Basic composition: (sum_t eps_t, sum_t delta_t) (Dwork & Roth 2014, Thm 3.16).

    Parameters
    ----------
    epsilon, delta : [..., T], float -- per-round guarantees.

    Returns
    -------
    (eps, delta) : ([...], [...]) float64; delta is capped at 1.
    """
    epsilon, delta = as_float64(epsilon, delta)
    return epsilon.sum(-1), delta.sum(-1).clamp(max=1.0)


def compose_advanced(*, epsilon, delta, delta_slack) -> tuple[Tensor, Tensor]:
    """Heterogeneous advanced composition (Kairouz, Oh & Viswanath 2015, Thm 3.5).

    For delta~ in (0, 1], T mechanisms that are (eps_t, delta_t)-DP compose to
    (eps~, 1 - (1 - delta~) prod_t (1 - delta_t))-DP with

        eps~ = sum_t eps_t (e^eps_t - 1)/(e^eps_t + 1)
               + sqrt(2 sum_t eps_t^2 * min(ln(1/delta~), ln(e + sqrt(sum_t eps_t^2)/delta~))),

    the smaller of the theorem's two sqrt terms ((e^x - 1)/(e^x + 1) = tanh(x/2)).
    The theorem's third option, sum_t eps_t, is :func:`compose_basic`.

    Parameters
    ----------
    epsilon, delta : [..., T], float; delta_slack : [...], float in (0, 1] (delta~).

    Returns
    -------
    (eps, delta) : ([...], [...]) float64. eps = +inf where delta~ <= 0.
    """
    epsilon, delta, slack = as_float64(epsilon, delta, delta_slack)
    sum_sq = (epsilon * epsilon).sum(-1)
    drift = (epsilon * torch.tanh(epsilon / 2)).sum(-1)
    safe = slack.clamp(min=1e-300)
    log_term = torch.minimum(-torch.log(safe), torch.log(math.e + torch.sqrt(sum_sq) / safe))
    eps = drift + torch.sqrt(2.0 * sum_sq * log_term)
    eps = torch.where(slack > 0, eps, torch.full_like(eps, math.inf))
    total_delta = 1.0 - (1.0 - slack) * torch.prod(1.0 - delta, dim=-1)
    return eps, total_delta



def compose_best(*, epsilon, delta, delta_target=None, delta_slack: float = 1e-5,
                 sampling_rate=None, noise_multiplier=None, event_delta=None,
                 rdp_resolution: float = 1e-2) -> dict[str, Tensor]:
    """Smallest epsilon over basic, advanced and RDP composition at one total delta.

    The total delta of the run is ``delta_target``; by default it is the basic
    composition's sum_t delta_t plus ``delta_slack`` (delta_l in the accountants), so
    that advanced and RDP composition have a slack to spend. Each composition is
    stated at a total delta <= the target:

    - basic: (sum eps_t, sum delta_t), usable when sum delta_t <= target;
    - advanced: delta~ = 1 - (1 - target) / prod_t (1 - delta_t) (needs delta~ > 0);
    - rdp (when ``sampling_rate`` and ``noise_multiplier`` are given): converted at
      target - sum_t event_delta_t (the concentration events delta'_t), needs > 0.

    Parameters
    ----------
    epsilon, delta : [..., T], float -- per-round guarantees (for the basic/advanced rules).
    delta_target : [...], float or None.
    sampling_rate, noise_multiplier : [..., T], float or None -- the sampled-Gaussian view
        of each round for RDP (q_t and s_t / Delta).
    event_delta : [..., T], float or None -- delta'_t added outside RDP (0 if None).

    Returns
    -------
    dict of [...] tensors: ``epsilon``, ``delta`` (float64; the target wherever
    ``delta_target`` is given, even where basic wins), ``composition`` (int64 index
    into :data:`COMPOSITIONS`, -1 where every composition gives +inf), and the three
    candidates ``epsilon_basic``, ``epsilon_advanced``, ``epsilon_rdp``.
    """
    epsilon, delta = as_float64(epsilon, delta)
    eps_b, delta_b = compose_basic(epsilon=epsilon, delta=delta)
    target = delta_b + delta_slack if delta_target is None else as_float64(delta_target, device=epsilon.device)[0]
    target = torch.broadcast_to(target, eps_b.shape).clamp(max=1.0)
    eps_b = torch.where(delta_b <= target, eps_b, torch.full_like(eps_b, math.inf))
    slack = 1.0 - (1.0 - target) / torch.prod(1.0 - delta, dim=-1).clamp(min=1e-300)
    eps_a, _ = compose_advanced(epsilon=epsilon, delta=delta, delta_slack=slack)
    eps_a = torch.where(torch.isfinite(epsilon).all(-1), eps_a, torch.full_like(eps_a, math.inf))
    if sampling_rate is not None and noise_multiplier is not None:
        extra = torch.zeros_like(epsilon) if event_delta is None else as_float64(event_delta, device=epsilon.device)[0]
        rdp_delta = target - torch.broadcast_to(extra, epsilon.shape).sum(-1)
        eps_r, _ = rdp_epsilon(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                               delta=rdp_delta, rdp_resolution=rdp_resolution)
    else:
        eps_r = torch.full_like(eps_b, math.inf)
    candidates = torch.stack([eps_b, eps_a, eps_r], dim=-1)
    best, which = candidates.min(dim=-1)  # ties go to the first: basic, then advanced
    which = torch.where(torch.isfinite(best), which, torch.full_like(which, -1))
    # at a given target every candidate is stated there (basic's smaller sum_t delta_t is
    # also an (eps, target) guarantee); without one, basic keeps its own sum
    total_delta = torch.where(which == 0, delta_b, target) if delta_target is None else target.clone()
    return {"epsilon": best, "delta": total_delta, "composition": which,
            "epsilon_basic": eps_b, "epsilon_advanced": eps_a, "epsilon_rdp": eps_r}
