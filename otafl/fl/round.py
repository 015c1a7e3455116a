"""One FedSGD round over the air: gradients -> clip -> transmit -> MAC -> estimate.

Two interchangeable aggregation strategies (Flower-style pure functions):

* ``ota``   -- the paper's scheme. Every transmitting user k sends
  x_k = alpha_k (g_k + n_k) with alpha_k = c_t / h_k, the MAC returns
  y_t = sum_k h_k x_k + m_t, and the server works with y_t / c_t =
  sum_k g_k + sum_k n_k + m_t / c_t (system-model.md, Transmitter).
* ``ideal`` -- noiseless, orthogonal reception: the server gets sum_k g_k exactly.

Both hand the server an *aligned sum* in gradient units; the estimator then divides by
|K_t| (``known``) or mu_t (``unknown``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from otafl.channel.mac import superpose
from otafl.transmit import (
    alignment_gain,
    effective_noise_var,
    power_scale,
    transmit_power,
    transmit_signals,
)


@dataclass(frozen=True)
class ChannelSetup:
    """What stays fixed over a run: budgets, noise levels and the alignment policy.

    power : [K] float64, P_k = SNR_k d N0 (transmit power budget, signal units)
    noise_var : [K] float64, sigma_k^2 (artificial noise, gradient units)
    """

    power: Tensor
    noise_var: Tensor
    n0: float
    clip: float
    dim: int
    alignment: str = "min"
    threshold: float | None = None


@dataclass
class Aggregate:
    """What a strategy returns for one round."""

    aligned_sum: Tensor  # [d], y_t / c_t (ota) or sum of clipped gradients (ideal)
    transmitting: Tensor  # [K] bool, users whose signal reached the server
    eligible: Tensor  # [K] bool, users allowed to transmit by the alignment policy
    alignment_gain: float  # c_t (nan for ideal)
    effective_noise_var: float  # sum_{K_t} sigma_k^2 + N0 / c_t^2 (0 for ideal)
    max_power_ratio: float  # max over transmitters of alpha^2(||g||^2 + d sigma^2) / P_k


def ota_aggregate(clipped: Tensor, clipped_norms: Tensor, h: Tensor, active: Tensor,
                  setup: ChannelSetup, generator: torch.Generator) -> Aggregate:
    """Over-the-air aggregation of the active users' clipped gradients.

    clipped : [n, d], the clipped gradients of the n = |active| coin winners (in user order)
    clipped_norms : [n], their l2 norms (<= L)
    h : [K] float64, this round's channel gains
    active : [K] bool, the coin winners
    """
    c_t, eligible = alignment_gain(h, setup.power, setup.clip, setup.noise_var, setup.dim,
                                   policy=setup.alignment, threshold=setup.threshold)
    transmitting = active & eligible
    keep = eligible[active]  # which of the n computed gradients are actually sent
    d = clipped.shape[-1]
    if not bool(transmitting.any()) or float(c_t) <= 0.0:
        # Nobody transmits: the server hears only receiver noise, and knows it (CSI + c_t = 0
        # broadcast), so the round carries no gradient.
        return Aggregate(clipped.new_zeros(d), transmitting, eligible, float(c_t), math.inf, 0.0)
    alpha = power_scale(h[transmitting], c_t)
    sigma2 = setup.noise_var[transmitting]
    signals = transmit_signals(clipped[keep], alpha.to(clipped.dtype), sigma2, generator)
    gains = h[transmitting].to(clipped.dtype)
    y = superpose(signals, gains, torch.ones_like(gains, dtype=torch.bool), setup.n0, generator)
    power = transmit_power(clipped_norms[keep].to(torch.float64), alpha, sigma2, setup.dim)
    ratio = float((power / setup.power[transmitting]).max())
    eff = float(effective_noise_var(setup.noise_var, transmitting, setup.n0, c_t))
    return Aggregate(y / float(c_t), transmitting, eligible, float(c_t), eff, ratio)


def ideal_aggregate(clipped: Tensor, clipped_norms: Tensor, h: Tensor, active: Tensor,
                    setup: ChannelSetup, generator: torch.Generator) -> Aggregate:
    """Noiseless aggregation: every sampled user's clipped gradient arrives exactly."""
    everyone = torch.ones_like(active)
    return Aggregate(clipped.sum(dim=0), active.clone(), everyone, math.nan, 0.0, 0.0)


AGGREGATORS = {"ota": ota_aggregate, "ideal": ideal_aggregate}


def channel_only(h: Tensor, active: Tensor, setup: ChannelSetup, strategy: str) -> Aggregate:
    """The channel facts of a round without any gradient (bounds-only runs).

    Same alignment gain, eligibility and effective noise as :func:`ota_aggregate` would
    produce; no signal is formed, so ``aligned_sum`` is empty and the power ratio 0.
    """
    if strategy == "ideal":
        return Aggregate(h.new_zeros(0), active.clone(), torch.ones_like(active), math.nan, 0.0, 0.0)
    c_t, eligible = alignment_gain(h, setup.power, setup.clip, setup.noise_var, setup.dim,
                                   policy=setup.alignment, threshold=setup.threshold)
    transmitting = active & eligible
    eff = (float(effective_noise_var(setup.noise_var, transmitting, setup.n0, c_t))
           if float(c_t) > 0 else math.inf)
    return Aggregate(h.new_zeros(0), transmitting, eligible, float(c_t), eff, 0.0)
