r"""The ``digital`` accountant: secure aggregation with distributed noise (docs/privacy/digital.md#digital).

A digital round hands the server only the (modular) sum of the participants' messages, so
the noise that protects user k centrally is the sum of the participants' shares; locally,
against a server colluding with every other user, only user k's own share. Who took part is
visible (orthogonal access), so the accountant conditions on it (joint convexity, see
:mod:`otafl.privacy.analysis.distributed`).

Two entry points:

- :func:`digital_round` (here), the registry's per-round function (the interface of ``paper`` and
  ``tight``, used by ``otafl bound``): the facts carry Gaussian shares only, so it is the
  distributed Gaussian mechanism with participation revealed. Central: the exact lower
  quantile m_t of |K_t| (failure delta'_t, charged to delta) and the analytic Gaussian
  mechanism with the summed variance m_t sigma_min^2 + N0/c_t^2, *not* amplified by
  sampling, delta p_max delta_l + delta'; local: the user's own share, as ``tight``.
- :func:`~otafl.privacy.accountants.digital_run.account_digital_run`, used by the training
  loop for ``train.aggregation = "digital"``: reads each round's :class:`~otafl.privacy.facts.DigitalMechanism` and the
  exact law of the participant count. Gaussian shares: per round the conditional profile
  sum_n w_n delta_G(eps; Delta, sqrt(n sigma^2)), composed by privacy-loss distributions.
  Skellam and PBM: Renyi DP of the round's mixture (Agarwal, Kairouz & Liu 2021, Thm 3.5;
  the PBM bound of :mod:`otafl.privacy.analysis.pbm`), added over rounds and converted.
"""

from __future__ import annotations

import math

import torch

from otafl.privacy.accountants.base import (
    REASON_DELTA_PRIME,
    REASON_NO_CENTRAL_NOISE,
    REASON_NO_LOCAL_NOISE,
    RoundBound,
    prepare_round,
)
from otafl.privacy.accountants.closed_form import local_dp
from otafl.privacy.analysis.concentration import binomial_lower_quantile, poisson_binomial_lower_quantile
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon

__all__ = ["digital_round"]


def digital_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                  delta_prime="auto", users=None, dim=None) -> RoundBound:
    """Per-round distributed-Gaussian bound with participation revealed (module docstring).

    Arguments: see :mod:`otafl.privacy.accountants.base` (``dim`` unused).
    """
    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var, alignment_gain=alignment_gain,
                      n0=n0, sensitivity=sensitivity, delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    local = local_dp(x, analytic_gaussian_epsilon, amplify=False)
    dp = x.delta_prime
    dp_bad = dp >= 1
    dpc = torch.clamp(dp, max=1.0 - 1e-16)
    if x.uniform:
        m = binomial_lower_quantile(users=x.users, p=x.participation_prob[..., 0], delta_prime=dpc)
    else:
        m = poisson_binomial_lower_quantile(p=x.participation_prob, delta_prime=dpc)
    s_central = torch.sqrt(torch.clamp(m, min=1.0) * x.min_noise_var + x.channel_noise_var)
    eps_c = analytic_gaussian_epsilon(sensitivity=x.sensitivity, noise_std=s_central, delta=x.delta_l)
    reason = dp_bad.long() * REASON_DELTA_PRIME
    reason = reason + ((s_central == 0) & (reason == 0)).long() * REASON_NO_CENTRAL_NOISE
    central_bad = reason != 0
    reason = reason + local.no_noise.long() * REASON_NO_LOCAL_NOISE
    nobody = x.max_participation_prob == 0
    eps_c = torch.where(central_bad, torch.full_like(eps_c, math.inf), eps_c)
    eps_c = torch.where(nobody & ~central_bad, torch.zeros_like(eps_c), eps_c)
    delta_c = torch.clamp(x.max_participation_prob * x.delta_l + torch.where(dp_bad, torch.ones_like(dp), dp),
                          max=1.0)
    one = torch.ones((), dtype=torch.float64, device=dp.device)
    b = x.batch

    def grid(t):
        return torch.broadcast_to(t, b)

    true = torch.ones((), dtype=torch.bool, device=dp.device)
    return RoundBound(
        epsilon_local=grid(local.epsilon), delta_local=grid(local.delta), epsilon_central=grid(eps_c),
        delta_central=grid(delta_c), users=grid(x.users), mean_participants=grid(x.mean_participants),
        delta_prime=grid(dp), quantile=grid(m), central_noise_std=grid(torch.where(central_bad, 0 * s_central,
                                                                                     s_central)),
        central_sampling_rate=grid(one), local_noise_std=grid(local.noise_std),
        local_sampling_rate=grid(local.sampling_rate), sensitivity=grid(x.sensitivity),
        classic_valid=grid(true), classic_valid_local=grid(true), reason=grid(reason))
