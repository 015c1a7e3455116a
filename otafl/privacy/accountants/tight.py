"""The ``tight`` accountant: the paper's argument with sharper pieces (docs/privacy/paper-tight.md#tight).

The exact Poisson-binomial quantile of |K_t|, the analytic Gaussian mechanism (Balle &
Wang 2018), and the channel noise N0/c_t^2 in the central noise. Its central eps never
exceeds ``paper``'s where ``paper`` is valid. Its LDP is *not* amplified by sampling:
(eps_G, p_k delta_l) by joint convexity, a theorem whatever the server can tell (so
"never exceeds paper" holds for LDP only at p = 1, where ``paper`` is a theorem too).

The central step treats user k's own noise as present whether or not it takes part; with
few participants in d dimensions the variance a participant adds is visible, which the
``exact`` accountant models (and ``otafl audit`` measures: sound but loose at the paper
preset).
"""

from __future__ import annotations

import torch

from otafl.privacy.accountants.base import RoundBound, prepare_round
from otafl.privacy.accountants.closed_form import finish_round, local_dp
from otafl.privacy.analysis.concentration import binomial_lower_quantile, poisson_binomial_lower_quantile
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon

__all__ = ["tight_round"]


def tight_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                delta_prime="auto", users=None, dim=None) -> RoundBound:
    """``paper``'s argument with sharper pieces (docs/privacy/paper-tight.md#tight).

    - m_t = the largest integer m with P(|K_t| < m) <= delta' under the exact
      Poisson-binomial law of |K_t| (binomial for uniform p); always >= ``paper``'s
      Hoeffding m_t, and defined for every delta' in (0, 1);
    - eps_G = the analytic Gaussian mechanism (Balle & Wang 2018), for LDP and central;
    - central noise s_c^2 = m_t sigma_min^2 + N0/c_t^2 (the channel noise counts).

    LDP: eps_G(Delta, sqrt(sigma_k^2 + N0/c_t^2), delta_l) without amplification, delta
    p_k delta_l (:func:`~otafl.privacy.accountants.closed_form.local_dp`). Where ``paper``'s
    classic step is valid (eps_0 <= 1) the central eps never exceeds ``paper``'s.
    Arguments: see :mod:`otafl.privacy.accountants.base`.
    """
    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var, alignment_gain=alignment_gain,
                      n0=n0, sensitivity=sensitivity, delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    local = local_dp(x, analytic_gaussian_epsilon, amplify=False)
    dp = torch.clamp(x.delta_prime, max=1.0 - 1e-16)
    if x.uniform:
        m = binomial_lower_quantile(users=x.users, p=x.participation_prob[..., 0], delta_prime=dp)
    else:
        m = poisson_binomial_lower_quantile(p=x.participation_prob, delta_prime=dp)
    s_central = torch.sqrt(m * x.min_noise_var + x.channel_noise_var)
    eps0_c = analytic_gaussian_epsilon(sensitivity=x.sensitivity, noise_std=s_central, delta=x.delta_l)
    return finish_round(x, local=local, quantile=m, s_central=s_central, eps0_c=eps0_c,
                        hoeffding_undefined=torch.zeros((), dtype=torch.bool, device=m.device), classic=False)
