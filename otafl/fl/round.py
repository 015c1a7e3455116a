"""One FedSGD round over the air: gradients -> clip -> transmit -> MAC -> estimate.

Two interchangeable aggregation strategies (Flower-style pure functions) with one signature,
``strategy(grads, h, active, setup, generator, *, superposition) -> Aggregate``:

* ``ota``   -- the paper's scheme. Every transmitting user k sends
  x_k = alpha_k (g_k + n_k) with alpha_k = c_t / h_k, the MAC returns
  y_t = sum_k h_k x_k + m_t, and the server works with y_t / c_t =
  sum_k g_k + sum_k n_k + m_t / c_t (docs/model.md#transmitter).
* ``ideal`` -- noiseless, orthogonal reception: the server gets sum_k g_k exactly.

(g_k here is user k's gradient clipped to norm L.) Both hand the server an *aligned sum* in
gradient units; the estimator then divides by |K_t| (``known``) or mu_t (``unknown``).

A strategy receives the active users' gradients as :class:`otafl.fl.grads.UserGradients`
-- their norms before clipping and a weighted sum -- and clips them itself
(:func:`otafl.transmit.clip_factors`): the round needs each user's norm (clipping, power
budget) and the *sum* of the clipped gradients, so the fast gradient path
(:func:`otafl.fl.grads.ghost_gradients`) never forms the [n, d] per-user tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from otafl.channel.mac import superpose
from otafl.errors import OtaflInputError
from otafl.fl.grads import UserGradients
from otafl.fl.strategies import SUPERPOSITIONS  # how ota_aggregate forms the MAC output (re-exported)
from otafl.transmit import (
    ChannelSetup,
    clip_factors,
    effective_noise_var,
    power_scale,
    transmit_power,
    transmit_signals,
)


@dataclass
class Aggregate:
    """What a strategy returns for one round."""

    aligned_sum: Tensor  # [d], y_t / c_t (ota) or sum of clipped gradients (ideal)
    transmitting: Tensor  # [K] bool, users whose signal reached the server
    eligible: Tensor  # [K] bool, users allowed to transmit by the alignment policy
    alignment_gain: float  # c_t (nan for ideal)
    effective_noise_var: float  # sum_{K_t} sigma_k^2 + N0 / c_t^2 (0 for ideal)
    max_power_ratio: float  # max over transmitters of alpha^2(||g||^2 + d sigma^2) / P_k
    participants: int | None = None  # |K_t| = transmitting.sum() (counted here when not given)
    extras: dict = field(default_factory=dict)  # round-record columns: channel_uses, energy, outages, ...
    skip: bool = False  # True: the round carries no update (digital: the modular sum overflowed)

    def __post_init__(self):
        if self.participants is None:
            self.participants = int(self.transmitting.sum())




def _check_superposition(superposition: str) -> None:
    if superposition not in SUPERPOSITIONS:
        raise OtaflInputError(f"superposition = {superposition!r} is not one of: {', '.join(SUPERPOSITIONS)}")


class ChannelState(NamedTuple):
    gain: float  # c_t
    eligible: Tensor  # [K] bool
    transmitting: Tensor  # [K] bool, active & eligible; all False when c_t = 0
    senders: Tensor  # [|K_t|] int64, the transmitting users in user order
    noise_var: float  # sigma_z^2 = sum_{K_t} r_k^2 sigma_k^2 + N0 / c_t^2; inf when nobody transmits
    known: Tensor | None = None  # [K] h_hat, the gains alignment inverts (None: perfect CSI, h itself)
    ratio: Tensor | None = None  # [K] r_k = h_k / h_hat_k where eligible, 1 elsewhere (None: perfect CSI)


def channel_state(h: Tensor, active: Tensor, setup: ChannelSetup) -> ChannelState:
    """The channel side of a round, shared by :func:`ota_aggregate` and :func:`channel_only`:
    alignment gain, eligibility, who transmits, and the effective noise. With c_t = 0 nobody
    can be aligned, so nobody transmits. With estimated CSI (``setup.csi``) c_t and eligibility
    come from the known gains h_hat (a user with h_hat <= 0 stays silent) and each sender
    arrives with gain r_k c_t, r_k = h_k / h_hat_k (docs/model.md#channel-state-information)."""
    known = ratio = None
    if setup.csi is None:
        c_t, eligible = setup.gain(h)
    else:
        known, finite, usable = setup.csi.rows(h)  # views of the run's [T, K]: a policy finds its round
        c_t, eligible = setup.gain(finite)
        eligible = eligible & usable
        if not bool(eligible.any()):
            c_t = torch.zeros((), dtype=torch.float64, device=h.device)
        ratio = torch.where(eligible, h / torch.where(usable, known, torch.ones_like(known)), torch.ones_like(h))
    c = float(c_t)
    transmitting = active & eligible
    if c <= 0.0:
        transmitting = torch.zeros_like(transmitting)
    senders = transmitting.nonzero().view(-1)
    if senders.numel() == 0:
        return ChannelState(c, eligible, transmitting, senders, math.inf, known, ratio)
    var = setup.noise_var if ratio is None else setup.noise_var * ratio * ratio  # what each sender's noise arrives as
    eff = float(effective_noise_var(var, transmitting, setup.n0, c_t))
    return ChannelState(c, eligible, transmitting, senders, eff, known, ratio)


def csi_mismatch(state: ChannelState) -> dict:
    """The round-record columns of estimated CSI: the smallest and largest r_k = h_k / h_hat_k over
    the users who may transmit (1, 1 when nobody may); none with perfect CSI."""
    if state.ratio is None:
        return {}
    r = state.ratio[state.eligible] if state.gain > 0 else state.ratio[:0]
    if r.numel() == 0:
        return {"csi_ratio_min": 1.0, "csi_ratio_max": 1.0}
    return {"csi_ratio_min": float(r.min()), "csi_ratio_max": float(r.max())}


def ota_aggregate(grads: UserGradients, h: Tensor, active: Tensor, setup: ChannelSetup,
                  generator: torch.Generator, *, superposition: str = "aggregate") -> Aggregate:
    """Over-the-air aggregation of the active users' clipped gradients.

    Each transmitting user k (active and eligible) sends x_k = alpha_k (c_k g_k + n_k) with
    c_k = min(1, L / ||g_k||), alpha_k = c_t / h_k and n_k ~ N(0, sigma_k^2 I_d); the server
    divides the MAC output by c_t:

        y_t / c_t = sum_k c_k g_k + sum_k n_k + m_t / c_t,     m_t ~ N(0, N0 I_d).

    With estimated CSI (``setup.csi``) alpha_k = c_t / h_hat_k and c_t come from the known gains,
    and each sender arrives times r_k = h_k / h_hat_k: y_t / c_t = sum_k r_k (c_k g_k + n_k) +
    m_t / c_t (docs/model.md#channel-state-information).

    ``superposition`` chooses how that is simulated:

    ``"aggregate"`` (default)
        The independent Gaussian terms sum to one Gaussian, sum_k n_k + m_t / c_t ~
        N(0, sigma_z^2 I_d) with sigma_z^2 = sum_k sigma_k^2 + N0 / c_t^2 (the effective
        noise variance), so the aligned sum is sum_k c_k g_k + sigma_z z with a single draw
        z = ``torch.randn(d)`` (none when sigma_z^2 = 0). Equal in distribution to the
        per-user path given the gradients; costs one d-vector instead of a [|K_t|, d] draw,
        and the clipped sum comes from ``grads.weighted_sum`` without materialising g_k.
    ``"per-user"``
        Materialise every x_k (:func:`otafl.transmit.transmit_signals`, one [|K_t|, d]
        draw) and superpose them over the fading MAC (:func:`otafl.channel.mac.superpose`,
        one more d-vector when N0 > 0): the channel simulated literally, so that the
        alignment alpha_k h_k = c_t is exercised.

    Parameters
    ----------
    grads : UserGradients
        The n = |active| coin winners' gradients, in user order (norms before clipping).
    h : [K] float64, this round's channel gains.
    active : [K] bool, the coin winners.
    setup : ChannelSetup.  generator : the noise stream (device of the gradients).
    """
    _check_superposition(superposition)
    state = channel_state(h, active, setup)
    c, eligible, transmitting, senders = state.gain, state.eligible, state.transmitting, state.senders
    d = grads.dim
    perfect = state.ratio is None
    silencing = setup.may_silence or not perfect  # truncation, a power-control policy or estimated CSI
    outages = int((active & ~eligible).sum()) if silencing else 0  # silenced
    extras = {"channel_uses": float(d), "energy": 0.0, "outages": outages, **csi_mismatch(state)}
    if senders.numel() == 0:
        # Nobody transmits: the server hears only receiver noise, and knows it (CSI + c_t = 0
        # broadcast), so the round carries no gradient.
        return Aggregate(grads.norms.new_zeros(d), transmitting, eligible, c, state.noise_var, 0.0, 0,
                         extras=extras)
    eff = state.noise_var
    # which of the n computed gradients are sent (all of them unless the policy silences some)
    keep = eligible[active] if silencing else None
    factor = clip_factors(grads.norms, setup.clip)
    coef = factor if keep is None else factor * keep.to(factor.dtype)
    sent_norms = grads.norms * coef  # min(||g_k||, L) for the senders
    if keep is not None:
        sent_norms = sent_norms[keep]
    h_tx, sigma2 = h.index_select(0, senders), setup.noise_var.index_select(0, senders)
    alpha = power_scale(h_tx if perfect else state.known.index_select(0, senders), c)  # inverts the known gain
    power = transmit_power(sent_norms, alpha, sigma2, setup.dim)
    ratio = float((power / setup.power.index_select(0, senders)).max())
    extras["energy"] = float(power.sum())  # sum of the participants' alpha^2 (||g||^2 + d sigma^2)
    if superposition == "aggregate":
        aligned = grads.weighted_sum(coef if perfect else coef * state.ratio[active].to(coef.dtype))
        if eff > 0.0:
            z = torch.randn(d, generator=generator, dtype=aligned.dtype, device=generator.device)
            aligned.add_(z if z.device == aligned.device else z.to(aligned.device), alpha=math.sqrt(eff))
    else:
        kept = slice(None) if keep is None else keep
        clipped = grads.materialise()[kept] * factor[kept, None]
        signals = transmit_signals(clipped, alpha.to(clipped.dtype), sigma2, generator)
        gains = h_tx.to(clipped.dtype)
        y = superpose(signals, gains, torch.ones_like(gains, dtype=torch.bool), setup.n0, generator)
        aligned = y / c
    return Aggregate(aligned, transmitting, eligible, c, eff, ratio, senders.numel(), extras=extras)


def ideal_aggregate(grads: UserGradients, h: Tensor, active: Tensor, setup: ChannelSetup,
                    generator: torch.Generator, *, superposition: str = "aggregate") -> Aggregate:
    """Noiseless aggregation: every sampled user's clipped gradient arrives exactly,
    sum_k min(1, L / ||g_k||) g_k (``superposition`` is accepted and has no effect)."""
    _check_superposition(superposition)
    everyone = torch.ones_like(active)
    factor = clip_factors(grads.norms, setup.clip)
    return Aggregate(grads.weighted_sum(factor), active.clone(), everyone, math.nan, 0.0, 0.0)


AGGREGATORS = {"ota": ota_aggregate, "ideal": ideal_aggregate}
"""The channel functions of the ``ota`` and ``ideal`` aggregations (the digital one is
:func:`otafl.fl.digital.digital_aggregate`); the strategies that use them, and the registry
of accepted names, are :mod:`otafl.fl.aggregations` and :mod:`otafl.fl.strategies`."""


def channel_only(h: Tensor, active: Tensor, setup: ChannelSetup) -> Aggregate:
    """The over-the-air channel facts of a round without any gradient (bounds-only runs).

    Same alignment gain, eligibility and effective noise as :func:`ota_aggregate` would
    produce; no signal is formed, so ``aligned_sum`` is empty and the power ratio 0.
    """
    state = channel_state(h, active, setup)
    extras = {"channel_uses": float(setup.dim), "energy": math.nan,
              "outages": int((active & ~state.eligible).sum()), **csi_mismatch(state)}
    return Aggregate(h.new_zeros(0), state.transmitting, state.eligible, state.gain, state.noise_var, 0.0,
                     state.senders.numel(), extras=extras)
