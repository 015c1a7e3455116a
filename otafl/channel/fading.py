"""Block flat fading processes: h[t, k], the amplitude gain of user k in round t.

The model (docs/model.md#fading) is a first-order autoregressive (AR(1), Gauss-Markov)
Rician process. For user k and round t = 0, ..., T-1

    r_{k,0} ~ CN(0, 1),
    r_{k,t} = rho r_{k,t-1} + sqrt(1 - rho^2) w_{k,t},        w_{k,t} ~ CN(0, 1) i.i.d.,
    h_{k,t} = g_k | sqrt(G / (G + 1)) + sqrt(1 / (G + 1)) r_{k,t} |,

where G >= 0 is the Rician K-factor (ratio of line-of-sight to scattered power; G = 0 is
Rayleigh), rho in [0, 1] the correlation between consecutive blocks (0: i.i.d. blocks,
1: static channel) and g_k >= 0 a per-user large-scale amplitude gain (path loss and
shadowing, constant over the run). The scattered part r is stationary, E|r_{k,t}|^2 = 1,
and E[r_{k,t} conj(r_{k,t-1})] = rho, so E[h_{k,t}^2] = g_k^2 (G/(G+1) + 1/(G+1)) = g_k^2.
The line-of-sight phase is fixed at zero (it does not change |.|, only which r's are bad).

This module only *generates* the channel; :mod:`otafl.channel.mac` applies it (the split of
Sionna's ``flat_fading_channel.py``), so tests and power control can reuse a fixed h.
Rayleigh and static channels are thin subclasses with one parameter pinned; a new model is
one new class plus one line in :data:`FADING_MODELS` (in :mod:`otafl.names`, torch-free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range, out_of_range

__all__ = [
    "ARRicianFading",
    "RayleighFading",
    "StaticFading",
    "FADING_MODELS",
    "make_fading",
    "run_row",
]


def _check_rician_k(value: float) -> float:
    v = check_range("fading.rician_k", value, lo=0.0)
    if math.isinf(v):
        raise out_of_range("fading.rician_k", value, "[0, inf)")
    return v


def _check_rho(value: float) -> float:
    return check_range("fading.rho", value, lo=0.0, hi=1.0)


@dataclass(frozen=True)
class ARRicianFading:
    """AR(1) Rician block fading (see the module docstring for the equations).

    Attributes
    ----------
    rician_k : float
        Rician K-factor G >= 0 (linear, not dB). 0 gives Rayleigh fading.
    rho : float
        Correlation between consecutive blocks of the scattered part, in [0, 1].
        0 gives i.i.d. blocks, 1 a channel that never changes during the run.
    """

    rician_k: float = 0.0
    rho: float = 0.0

    def __post_init__(self) -> None:
        _check_rician_k(self.rician_k)
        _check_rho(self.rho)

    # -- the complex scattered field ------------------------------------------------------
    def sample_complex(self, rounds: int, users: int, generator: torch.Generator) -> Tensor:
        """Draw the scattered part r[t, k] of the channel.

        Parameters
        ----------
        rounds : int
            Number of blocks T >= 0.
        users : int
            Number of users K >= 1.
        generator : torch.Generator
            The only source of randomness. Exactly one draw is made,
            ``torch.randn(T, K, 2, dtype=float64)``: slice 0 gives r_{k,0}, slice t >= 1 the
            innovation w_{k,t} (real and imaginary parts each N(0, 1/2)).

        Returns
        -------
        r : [T, K], complex128, on the generator's device
            r_{k,t} = rho r_{k,t-1} + sqrt(1 - rho^2) w_{k,t}; stationary CN(0, 1) marginals
            and lag-1 correlation rho. The recursion runs as a loop over T of K-vectors.
        """
        rounds = int(rounds)
        users = int(users)
        if rounds < 0:
            raise out_of_range("fading.rounds", rounds, "[0, inf)")
        if users < 1:
            raise out_of_range("fading.users", users, "[1, inf)")
        z = torch.randn(rounds, users, 2, generator=generator, dtype=torch.float64,
                        device=generator.device)
        w = torch.complex(z[..., 0], z[..., 1]) * math.sqrt(0.5)  # CN(0, 1)
        rho = float(self.rho)
        if rho == 0.0 or rounds <= 1:
            return w
        innovation = math.sqrt(max(0.0, 1.0 - rho * rho))
        r = torch.empty_like(w)
        r[0] = w[0]
        for t in range(1, rounds):
            r[t] = rho * r[t - 1] + innovation * w[t]
        return r

    def envelope(self, scattered: Tensor, large_scale_gain: Tensor) -> Tensor:
        """Map the scattered field to amplitude gains.

        h_{k,t} = g_k | sqrt(G/(G+1)) + sqrt(1/(G+1)) r_{k,t} |.

        Parameters
        ----------
        scattered : [T, K], complex
            The field r from :meth:`sample_complex`.
        large_scale_gain : [K], float
            Amplitude multiplier g_k >= 0 (not power, not dB).

        Returns
        -------
        h : [T, K], float64, h >= 0
        """
        g = _check_gain(large_scale_gain, scattered.shape[-1]).to(scattered.device)
        G = float(self.rician_k)
        los = math.sqrt(G / (G + 1.0))
        nlos = math.sqrt(1.0 / (G + 1.0))
        return g * torch.abs(los + nlos * scattered.to(torch.complex128))

    # -- the public draw ------------------------------------------------------------------
    def sample(self, rounds: int, large_scale_gain: Tensor, generator: torch.Generator,
               *, return_scattered: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Draw the amplitude gains of every user in every round.

        Parameters
        ----------
        rounds : int
            Number of blocks T >= 0.
        large_scale_gain : [K], float
            Amplitude multiplier g_k >= 0 of each user; ``torch.ones(K)`` for the spec's
            E[h^2] = 1. K is read from its length.
        generator : torch.Generator
            Sole source of randomness (see :meth:`sample_complex` for the one draw made).
        return_scattered : bool, keyword-only
            Also return the complex field r that produced h (for tests and diagnostics).

        Returns
        -------
        h : [T, K], float64
            h_{k,t} >= 0 with E[h_{k,t}^2] = g_k^2; ``(h, r)`` with r [T, K] complex128 when
            ``return_scattered``.
        """
        g = _check_gain(large_scale_gain, None)
        r = self.sample_complex(rounds, g.shape[0], generator)
        h = self.envelope(r, g)
        return (h, r) if return_scattered else h


@dataclass(frozen=True)
class RayleighFading(ARRicianFading):
    """AR(1) Rayleigh fading: :class:`ARRicianFading` with G = 0 (no line of sight)."""

    rician_k: float = field(default=0.0, init=False)


@dataclass(frozen=True)
class StaticFading(ARRicianFading):
    """Static Rician channel: :class:`ARRicianFading` with rho = 1, h_{k,t} = h_{k,0}."""

    rho: float = field(default=1.0, init=False)


def _check_gain(large_scale_gain: Tensor, users: int | None) -> Tensor:
    g = torch.as_tensor(large_scale_gain, dtype=torch.float64)
    if g.ndim != 1:
        raise OtaflInputError(
            f"fading.large_scale_gain has shape {tuple(g.shape)}; expected a 1-D tensor [K]")
    if users is not None and g.shape[0] != users:
        raise OtaflInputError(
            f"fading.large_scale_gain has {g.shape[0]} entries; expected K = {users}")
    bad = ~(torch.isfinite(g) & (g >= 0))
    if bool(bad.any()):
        value = float(g[bad][0])
        raise out_of_range("fading.large_scale_gain", value, "[0, inf)")
    return g


#: Fading models by name. Every entry is :class:`ARRicianFading` or a subclass of it.
#: The names live in :mod:`otafl.names` (torch-free, for spec validation); entries resolve here.
from otafl.names import FADING_MODELS  # noqa: E402


def make_fading(name: str, *, rician_k: float = 0.0, rho: float = 0.0) -> ARRicianFading:
    """Build a fading model from its registry name.

    Both numbers are validated whatever the name (G in [0, inf), rho in [0, 1]); the model
    then pins its own parameter: ``"rayleigh"`` ignores ``rician_k`` (G = 0) and
    ``"static"`` ignores ``rho`` (rho = 1), so one config section serves every model.

    Raises
    ------
    OtaflInputError
        Unknown name (the message lists the known ones) or a value out of range.
    """
    if name not in FADING_MODELS:
        raise OtaflInputError(
            f"fading model {name!r} is unknown; choose one of: {', '.join(sorted(FADING_MODELS))}")
    G = _check_rician_k(rician_k)
    r = _check_rho(rho)
    cls = FADING_MODELS[name]
    if cls is RayleighFading:
        return cls(rho=r)
    if cls is StaticFading:
        return cls(rician_k=G)
    return cls(rician_k=G, rho=r)


def run_row(h: Tensor, H: Tensor) -> int | None:
    """The round t whose row ``H[t]`` of a run's gains H [T, K] the gains ``h`` [K] are (a view
    of the same storage, as the loop and ``audit-run`` pass them), or None when ``h`` is no such
    view (a copy, a clone, another tensor). Used where a per-run plan must find its round without
    the loop passing t (estimated CSI's :class:`~otafl.channel.csi.KnownGains`, the power-control
    policies of :mod:`otafl.fl.power`)."""
    if not (h.dim() == 1 and H.dim() == 2 and H.stride(0) > 0 and h.device == H.device and h.dtype == H.dtype
            and h.numel() == H.shape[1] and h.stride(0) == H.stride(1)
            and h.untyped_storage().data_ptr() == H.untyped_storage().data_ptr()):
        return None
    t, rest = divmod(h.storage_offset() - H.storage_offset(), H.stride(0))
    return t if rest == 0 and 0 <= t < H.shape[0] else None
