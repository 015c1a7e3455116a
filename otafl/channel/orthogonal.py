r"""Orthogonal multiple access for digital uplinks: rates, channel uses, energy and outage.

Each digital participant sends B = D * bits bits over its own orthogonal resource, on the
same fading channel as the over-the-air system (docs/model.md#digital-channel). User k has
the energy budget P_k per d-dimensional block (P_k = SNR_k d N0, :func:`otafl.transmit.max_power`),
i.e. P_k / d per channel use, so its SNR per full-band use is SNR_k h_k^2
(SNR_k = P_k / (d N0); a unit reference noise when N0 = 0).

``tdma``   the users take turns on the whole band: rate r_k = log2(1 + SNR_k h_k^2) bits per
           use, u_k = ceil(B / r_k) uses; the round lasts sum_k u_k uses; user k spends
           u_k P_k / d.
``ofdma``  the band is split into K equal subchannels, one per user, used in parallel. A
           subchannel use lasts K full-band uses and, at the same power, sees K times the
           SNR: r_k = log2(1 + K SNR_k h_k^2) bits per subchannel use, u_k = ceil(B / r_k)
           subchannel uses, K u_k full-band uses of time; the round lasts max_k K u_k; user k
           spends K u_k P_k / d.

Outage: a user whose rate (per use of its resource) is below ``min_rate`` does not transmit
and its update is lost that round (it knows h_k; the server sees that it sent nothing).
Over-the-air, for comparison, uses d channel uses per round whatever the number of users.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from otafl.errors import OtaflInputError
from otafl.transmit import REFERENCE_N0

__all__ = ["ACCESS_SCHEMES", "UplinkCost", "orthogonal_rates", "uplink_cost"]

from otafl.names import ACCESS_SCHEMES  # noqa: E402 (the names, torch-free)


class UplinkCost(NamedTuple):
    """One round's orthogonal uplink.

    rate : [K] bits per use of each user's resource.   outage : [K] bool (rate < min_rate).
    channel_uses : float, the round's duration in full-band channel uses.
    energy : float, the transmitting users' total energy (units of P_k).
    bits : float, bits delivered (B per transmitting user).   outages : int, active users in outage.
    """

    rate: Tensor
    outage: Tensor
    channel_uses: float
    energy: float
    bits: float
    outages: int


def orthogonal_rates(*, h: Tensor, power: Tensor, dim: int, n0: float, access: str, users: int) -> Tensor:
    """[K] bits per use of each user's resource (module docstring)."""
    if access not in ACCESS_SCHEMES:
        raise OtaflInputError(f"digital.access = {access!r} is not one of: {', '.join(ACCESS_SCHEMES)}")
    ref = n0 if n0 > 0 else REFERENCE_N0
    snr = torch.as_tensor(power, dtype=torch.float64) / (int(dim) * ref) * torch.as_tensor(h, dtype=torch.float64) ** 2
    if access == "ofdma":
        snr = snr * int(users)
    return torch.log2(1.0 + snr)


def uplink_cost(*, h: Tensor, power: Tensor, dim: int, n0: float, access: str, users: int,
                transmitting: Tensor, bits_per_user: float, min_rate: float) -> UplinkCost:
    """Channel uses, energy and outages of one round (module docstring).

    h, power : [K] float64; transmitting : [K] bool, the users who want to send (coin winners);
    bits_per_user : B.
    """
    rate = orthogonal_rates(h=h, power=power, dim=dim, n0=n0, access=access, users=users)
    outage = rate < float(min_rate)
    sends = transmitting.to(rate.device) & ~outage
    uses = torch.where(sends, torch.ceil(float(bits_per_user) / torch.clamp(rate, min=1e-300)),
                       torch.zeros_like(rate))
    per_use_energy = torch.as_tensor(power, dtype=torch.float64) / int(dim)
    if access == "tdma":
        duration, time = float(uses.sum()), uses
    else:
        time = int(users) * uses
        duration = float(time.max()) if time.numel() else 0.0
    energy = float((time * per_use_energy).sum())
    return UplinkCost(rate, outage, duration, energy, float(sends.sum()) * float(bits_per_user),
                      int((transmitting.to(rate.device) & outage).sum()))
