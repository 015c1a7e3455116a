"""Channel state information: what the server and the users know of the gains h (``channel.csi``).

Alignment inverts the channel the system *knows*: every transmitter sends with
alpha_k = c_t / h_hat_k, c_t computed from the known gains, so that the MAC delivers

    y_t / c_t = sum_k r_k (g_k + n_k) + m_t / c_t,      r_k = h_k / h_hat_k,

a gain mismatch r_k per user (docs/model.md#channel-state-information). Each option is one
class here plus one line of :data:`otafl.names.CSI_MODELS`:

* :class:`PerfectCSI` (``perfect``, the default): h_hat = h, r = 1, the paper's model; no draw.
* :class:`EstimatedCSI` (``estimated``): one least-squares pilot estimate per user and round,
  h_hat_{k,t} = h_{k,t} + e_{k,t}, e ~ N(0, sigma_e^2) i.i.d., with sigma_e^2 =
  ``channel.csi_error_var`` or 1 / pilot SNR (``channel.pilot_snr_db``): the error of one pilot
  symbol of energy E_p received at noise N0 is N0 / E_p.

The estimates of a whole run are drawn once, with the gains (:func:`otafl.setup.build_channel`,
from the ``fading`` stream after h), so that every caller of a round (the loop, ``audit-run``'s
trials) sees the same h_hat_t for round t, as the accountants condition on it.
:class:`KnownGains` carries them to the round (:attr:`otafl.transmit.ChannelSetup.csi`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from otafl.channel.fading import run_row
from otafl.errors import OtaflInputError, check_range

__all__ = ["CSI_MODELS", "EstimatedCSI", "KnownGains", "PerfectCSI", "make_csi"]

from otafl.names import CSI_MODELS  # noqa: E402 (the names, torch-free)


class PerfectCSI:
    """Perfect CSI: the server and every user know h exactly (h_hat = h)."""

    name = "perfect"
    error_var = 0.0

    @classmethod
    def from_spec(cls, channel) -> PerfectCSI:
        return cls()

    def estimates(self, h: Tensor, generator: torch.Generator) -> Tensor | None:
        """None: the known gains are h itself (nothing is drawn)."""
        return None


class EstimatedCSI:
    """Pilot-based estimates h_hat = h + e, e ~ N(0, ``error_var``) i.i.d. over users and rounds.

    A user whose estimate is not positive cannot invert its channel: it stays silent that round
    (:func:`usable_gains`)."""

    name = "estimated"

    def __init__(self, error_var: float):
        self.error_var = check_range("channel.csi_error_var", error_var, lo=0.0, finite=True)

    @classmethod
    def from_spec(cls, channel) -> EstimatedCSI:
        """sigma_e^2 = ``channel.csi_error_var``, or 10^(-pilot_snr_db / 10) (one LS pilot)."""
        var = channel.csi_error_var
        return cls(10.0 ** (-float(channel.pilot_snr_db) / 10.0) if var is None else var)

    def estimates(self, h: Tensor, generator: torch.Generator) -> Tensor:
        """h_hat [T, K] float64 for the gains h [T, K] (one draw of T K normals from ``generator``)."""
        e = torch.randn(h.shape, generator=generator, dtype=torch.float64, device=generator.device)
        return h.to(torch.float64) + math.sqrt(self.error_var) * e.to(h.device)


def make_csi(channel) -> PerfectCSI | EstimatedCSI:
    """The CSI model of a ``[channel]`` spec section (``csi``, ``pilot_snr_db``, ``csi_error_var``)."""
    name = channel.csi
    if name not in CSI_MODELS:
        raise OtaflInputError(f"channel.csi = {name!r} is not one of: {', '.join(sorted(CSI_MODELS))}")
    return CSI_MODELS[name].from_spec(channel)


class KnownGains:
    """The known gains h_hat [T, K] of a run, found for a round by its gains h [K] (a row of the
    run's h [T, K]: the loop and ``audit-run`` pass ``plan.h[t]``).

    ``finite`` and ``usable`` [T, K] are :func:`usable_gains` of the estimates, computed once, so
    that :meth:`rows` hands a round views of them: a power-control policy that plans per round
    finds its round from the ``finite`` row it is given (:meth:`otafl.fl.power.PowerControl.round_of`)."""

    def __init__(self, gains: Tensor, estimates: Tensor):
        if gains.shape != estimates.shape or gains.dim() != 2:
            raise OtaflInputError(f"estimates have shape {tuple(estimates.shape)}; expected {tuple(gains.shape)}")
        self.gains, self.estimates = gains, estimates.to(gains.device)
        self.finite, self.usable = usable_gains(self.estimates)

    def row(self, h: Tensor) -> int:
        """The round t whose gains are ``h``: the row of the run's gains that ``h`` is (a view),
        else the one row equal to it; OtaflInputError when neither identifies the round."""
        H = self.gains
        t = run_row(h, H)
        if t is not None:
            return t
        same = (H == h.to(H.device, H.dtype)).all(-1).nonzero().view(-1)
        if same.numel() == 1:
            return int(same)
        raise OtaflInputError("channel.csi = 'estimated': a round's gains must be a row of the run's channel "
                              f"(found {same.numel()} matching rounds)")

    def rows(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(h_hat_t, finite_t, usable_t) for the round whose gains are ``h``: views of the run's
        [T, K] tensors (:func:`usable_gains`)."""
        t = self.row(h)
        return self.estimates[t], self.finite[t], self.usable[t]


def usable_gains(known: Tensor) -> tuple[Tensor, Tensor]:
    """(gains for the alignment bound, usable) from the known gains: a user with h_hat <= 0 cannot
    invert its channel, so its bound is +inf (out of every min) and it is not usable."""
    usable = known > 0
    return torch.where(usable, known, torch.full_like(known, math.inf)), usable
