"""The ``paper`` accountant: the paper's closed forms (docs/privacy/paper-tight.md#paper).

LDP: the classic Gaussian mechanism with the user's noise and the channel noise,
amplified by p_k. Central: the Hoeffding quantile m_t = mu_t - K beta_t, noise
m_t sigma_min^2 (channel noise left out), the classic Gaussian mechanism, amplified by
q = min(1, p_max / (1 - delta')).

The classic Gaussian step is only a theorem where its eps_0 <= 1 (Dwork & Roth 2014,
Thm A.1): ``classic_valid`` flags it; outside it ``paper`` can *understate* the leakage
(for Delta/s above ~2 the analytic eps is larger) and is not a guaranteed bound. Its LDP
amplification assumes the server cannot tell who took part; it can (see
:func:`~otafl.privacy.accountants.closed_form.local_dp`), so ``classic_valid_local`` is
False wherever 0 < p_k < 1.
"""

from __future__ import annotations

import torch

from otafl.privacy.accountants.base import RoundBound, prepare_round
from otafl.privacy.accountants.closed_form import finish_round, local_dp
from otafl.privacy.analysis.concentration import hoeffding_lower_quantile
from otafl.privacy.analysis.gaussian import classic_gaussian_epsilon

__all__ = ["paper_round"]


def paper_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                delta_prime="auto", users=None, dim=None) -> RoundBound:
    """The paper's per-round LDP and central DP (docs/privacy/paper-tight.md#paper).

    LDP (per user, worst user reported), delta_l,k = p_k delta_l:

        eps_l,k,t = log(1 + p_k (exp(eps_G(Delta, sqrt(sigma_k^2 + N0/c_t^2), delta_l)) - 1))

    Central, with m_t = mu_t - K beta_t (Hoeffding), s_c^2 = m_t sigma_min^2 (channel
    noise left out, which only makes the bound larger), q = min(1, p_max / (1 - delta')):

        eps_c,t = log(1 + q (exp(eps_G(Delta, s_c, delta_l)) - 1)),   delta_c,t = q delta_l + delta'.

    eps_G is the classic Gaussian formula. With uniform p and equal sigma this is the
    paper's form  log(1 + p/(1-delta') (exp(c / sqrt(K (p - beta))) - 1)),
    c = Delta sqrt(2 ln(1.25/delta_l)) / sigma. Undefined (+inf, reason) where
    mu_t <= K beta_t or delta' >= 1. Arguments: see :mod:`otafl.privacy.accountants.base`.
    """
    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var, alignment_gain=alignment_gain,
                      n0=n0, sensitivity=sensitivity, delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    local = local_dp(x, classic_gaussian_epsilon, amplify=True)
    dp = torch.clamp(x.delta_prime, max=1.0 - 1e-16)
    m = hoeffding_lower_quantile(mean_participants=x.mean_participants, users=x.users, delta_prime=dp)
    undefined = m <= 0
    s_central = torch.sqrt(torch.clamp(m, min=0.0) * x.min_noise_var)
    eps0_c = classic_gaussian_epsilon(sensitivity=x.sensitivity, noise_std=s_central, delta=x.delta_l)
    return finish_round(x, local=local, quantile=m, s_central=s_central, eps0_c=eps0_c,
                        hoeffding_undefined=undefined, classic=True)
