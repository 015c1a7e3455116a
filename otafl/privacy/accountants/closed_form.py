"""The steps shared by the closed-form accountants ``paper`` and ``tight``.

Both follow the paper's argument (docs/privacy/index.md#local-dp, docs/privacy/index.md#central-dp):

- LDP per user, worst user reported: user k's own noise and the channel noise,
  s_k^2 = sigma_k^2 + N0/c_t^2, through a Gaussian-mechanism epsilon (:func:`local_dp`);
- central DP: a high-probability lower bound m_t on the number of participants, the
  noise s_c^2 they add, a Gaussian-mechanism epsilon, amplified by sampling at
  q = min(1, p_max / (1 - delta')) and delta_c = q delta_l + delta' (:func:`finish_round`).

The central step treats user k's own noise as present whether or not it takes part (the
fixed-noise assumption, see :mod:`otafl.privacy.analysis.rdp`); the ``exact``
accountant does not make it.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from otafl.privacy.accountants.base import (
    REASON_DELTA_PRIME,
    REASON_HOEFFDING,
    REASON_NO_CENTRAL_NOISE,
    REASON_NO_LOCAL_NOISE,
    RoundBound,
    RoundInputs,
)
from otafl.privacy.analysis.gaussian import amplify_by_sampling

__all__ = ["LocalBound", "local_dp", "finish_round"]


class LocalBound(NamedTuple):
    """The LDP part of a round (worst user), as :func:`local_dp` computes it."""

    epsilon: Tensor      # max_k eps_l,k
    delta: Tensor        # max_k p_k delta_l
    valid: Tensor        # the step is a theorem for every user who can take part (see local_dp)
    no_noise: Tensor     # some user who can take part has s_k = 0
    noise_std: Tensor    # the smallest s_k over users who can take part
    sampling_rate: Tensor  # the RDP view's rate


def local_dp(x: RoundInputs, gaussian_epsilon: Callable[..., Tensor], *, amplify: bool) -> LocalBound:
    """Per-user LDP, worst user, delta_l,k = p_k delta_l.

    s_k^2 = sigma_k^2 + N0/c_t^2 (only user k's own noise and the channel protect it from a
    server colluding with the others), eps_G,k = eps_G(Delta, s_k, delta_l).

    ``amplify=True`` (``paper``): eps_l,k = log(1 + p_k (exp(eps_G,k) - 1)), amplification by
    sampling. That is a theorem only if the server cannot tell whether user k took part;
    it can, from the received energy, whenever user k adds noise of its own (the output
    is N(0, N0/c^2) without user k and N(g_k, sigma_k^2 + N0/c^2) with it), so the
    amplified eps is flagged (``valid`` False) for every user with 0 < p_k < 1. (Without
    own noise, sigma_k = 0, the absent-user output is a Gaussian shift of the present one
    by ||g_k|| <= L, and amplification holds if L <= Delta; the accountant does not know L,
    so it does not claim that case either.)

    ``amplify=False`` (``tight``): eps_l,k = eps_G,k, sound for any p_k by joint convexity of
    the hockey-stick divergence: the two neighbouring outputs are (1 - p) R + p P1 and
    (1 - p) R + p Q1 with the same R (user k absent), so H_e^eps <= p H_e^eps(P1 || Q1)
    <= p delta_l. Users with p_k = 0 leak nothing (eps 0).

    Returns a :class:`LocalBound` of natural-shaped tensors.
    """
    s_local = torch.sqrt(x.noise_var + x.channel_noise_var.unsqueeze(-1))
    sens, std, dl = torch.broadcast_tensors(x.sensitivity.unsqueeze(-1).to(s_local.dtype), s_local,
                                            x.delta_l.unsqueeze(-1).to(s_local.dtype))
    if std.numel() > 1 and bool((sens == sens.reshape(-1)[0]).all()) and bool((dl == dl.reshape(-1)[0]).all()):
        # One root per distinct s_k (Delta and delta_l common): the users of a noise group share
        # it in a round (a 1000-round, 200-user run has 1000 distinct values, not 200,000).
        values, where = torch.unique(std.reshape(-1), return_inverse=True)
        eps0 = gaussian_epsilon(sensitivity=sens.reshape(-1)[:1], noise_std=values,
                                delta=dl.reshape(-1)[:1])[where].reshape(std.shape)
    else:
        eps0 = gaussian_epsilon(sensitivity=sens, noise_std=std, delta=dl)
    p = x.participation_prob
    if amplify:
        eps, _ = amplify_by_sampling(epsilon=eps0, delta=0.0, sampling_rate=p)
    else:
        eps = torch.where(p > 0, eps0, torch.zeros_like(eps0))
    delta = x.max_participation_prob * x.delta_l
    active = p > 0
    # amplification is a theorem here only for a user who always (or never) takes part
    sound = ~active | (p >= 1) if amplify else torch.ones_like(active)
    # the RDP view: a sampled Gaussian at rate p_max when amplified, the plain Gaussian otherwise
    rate = x.max_participation_prob if amplify else (x.max_participation_prob > 0).to(torch.float64)
    if x.uniform:
        s0, e0, a0 = s_local[..., 0], eps0[..., 0], active[..., 0]
        return LocalBound(eps[..., 0], delta, ((e0 <= 1) | ~a0) & sound[..., 0], (s0 == 0) & a0, s0, rate)
    s_min = torch.where(active, s_local, torch.full_like(s_local, math.inf)).amin(-1)
    return LocalBound(eps.amax(-1), delta, (((eps0 <= 1) | ~active) & sound).all(-1),
                  ((s_local == 0) & active).any(-1), s_min, rate)


def finish_round(x: RoundInputs, *, local: LocalBound, quantile, s_central, eps0_c, hoeffding_undefined,
                 classic: bool) -> RoundBound:
    """Amplify the central step, set reasons and +inf where undefined, broadcast to the grid."""
    eps_l, delta_loc, valid_l, no_local_noise, s_local, rate_l = local
    dp = x.delta_prime
    dp_bad = dp >= 1
    reason = dp_bad.long() * REASON_DELTA_PRIME
    reason = reason + (hoeffding_undefined & ~dp_bad).long() * REASON_HOEFFDING
    reason = reason + ((s_central == 0) & (reason == 0)).long() * REASON_NO_CENTRAL_NOISE
    central_bad = reason != 0
    reason = reason + no_local_noise.long() * REASON_NO_LOCAL_NOISE
    # Conditioned on the concentration event (probability >= 1 - delta'), user k takes
    # part with probability at most p_k / (1 - delta').
    q = torch.clamp(x.max_participation_prob / (1.0 - torch.where(dp_bad, torch.zeros_like(dp), dp)), max=1.0)
    eps_c, q_delta = amplify_by_sampling(epsilon=eps0_c, delta=x.delta_l, sampling_rate=q)
    eps_c = torch.where(central_bad, torch.full_like(eps_c, math.inf), eps_c)
    delta_c = torch.clamp(q_delta + dp, max=1.0)
    s_central = torch.where(central_bad, torch.zeros_like(s_central), s_central)
    if classic:
        valid_c = (eps0_c <= 1.0) & ~central_bad
    else:
        valid_c = torch.ones((), dtype=torch.bool, device=dp.device)
        valid_l = valid_c
    b = x.batch

    def grid(t: Tensor) -> Tensor:
        return torch.broadcast_to(t, b)

    return RoundBound(
        epsilon_local=grid(eps_l), delta_local=grid(delta_loc), epsilon_central=grid(eps_c),
        delta_central=grid(delta_c), users=grid(x.users), mean_participants=grid(x.mean_participants),
        delta_prime=grid(dp), quantile=grid(quantile), central_noise_std=grid(s_central),
        central_sampling_rate=grid(q), local_noise_std=grid(s_local),
        local_sampling_rate=grid(rate_l), sensitivity=grid(x.sensitivity),
        classic_valid=grid(valid_c), classic_valid_local=grid(valid_l), reason=grid(reason))
