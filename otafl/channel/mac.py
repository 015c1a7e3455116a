"""Gaussian multiple-access channel (MAC): superpose the users' signals and add noise.

    y_t = sum_{k in K_t} h_{k,t} x_{k,t} + m_t,        m_t ~ N(0, N0 I_d)

(docs/model.md#mac). The gains h come from :mod:`otafl.channel.fading`; this module
only applies them, as Sionna's ``ApplyFlatFadingChannel`` does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range

__all__ = ["superpose"]


def superpose(signals: Tensor, gains: Tensor, active: Tensor, n0: float,
              generator: torch.Generator) -> Tensor:
    """Receive one block over the fading MAC.

    Parameters
    ----------
    signals : [K, d], float
        x_{k,t}, the signal each user would send (units: sqrt(power) per coordinate).
    gains : [K], float
        Amplitude gains h_{k,t} >= 0 of this block.
    active : [K], bool
        Which users transmit (k in K_t). Rows of inactive users are ignored entirely
        (masked, so even non-finite values there cannot leak into y).
    n0 : float
        Noise variance N0 >= 0 per real coordinate.
    generator : torch.Generator
        Draws m_t as ``torch.randn(d, dtype=signals.dtype) * sqrt(N0)``; when N0 == 0
        nothing is drawn and the generator is left untouched.

    Returns
    -------
    y : [d], same dtype and device as ``signals``
        y_t = sum_k active_k h_k x_k + m_t.
    """
    n0 = check_range("channel.n0", n0, lo=0.0)
    if signals.ndim != 2:
        raise OtaflInputError(f"signals has shape {tuple(signals.shape)}; expected [K, d]")
    K, d = signals.shape
    if gains.shape != (K,) or active.shape != (K,):
        raise OtaflInputError(
            f"gains {tuple(gains.shape)} and active {tuple(active.shape)} must both be [{K}]")
    mask = active.to(device=signals.device, dtype=torch.bool)
    h = gains.to(device=signals.device, dtype=signals.dtype)
    zero = torch.zeros((), dtype=signals.dtype, device=signals.device)
    y = torch.where(mask[:, None], h[:, None] * signals, zero).sum(dim=0)
    if n0 > 0.0:
        m = torch.randn(d, generator=generator, dtype=signals.dtype, device=generator.device)
        y = y + math.sqrt(n0) * m.to(signals.device)
    return y
