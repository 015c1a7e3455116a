"""User sampling: participation probabilities p[t, k] and the users' independent coins.

Each user decides alone, independently, each round: k in K_t with probability p_{k,t}
(docs/model.md#sampling). The server knows every p_{k,t}, not the coins.
The expected number of participants is mu_t = sum_k p_{k,t}.

Schemes (registry :data:`SAMPLING_SCHEMES`):

- ``uniform``        p_{k,t} = p.
- ``time-varying``   p_{k,t} = p_t, one schedule for every user.
- ``channel-aware``  p_{k,t} = min(1, h_{k,t} / h_th): users in a good fade join more often.
  With the ``unknown`` estimator this weights user k's gradient by p_{k,t}
  (:mod:`otafl.estimate`).

A scheme maps the whole channel tensor h[T, K] to p[T, K] (float64). Time-varying schedules
need the horizon T: call ``probabilities`` once on the full tensor, or per round with
``start=t, horizon=T``.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range, out_of_range

__all__ = [
    "SamplingScheme",
    "UniformSampling",
    "TimeVaryingSampling",
    "ChannelAwareSampling",
    "SAMPLING_SCHEMES",
    "SCHEDULES",
    "make_sampling",
    "draw_participants",
]


def _check_p(name: str, value: float) -> float:
    return check_range(name, value, lo=0.0, hi=1.0, lo_open=True)


def _as_h(h: Tensor) -> Tensor:
    h = torch.as_tensor(h, dtype=torch.float64)
    if h.ndim != 2:
        raise OtaflInputError(f"h has shape {tuple(h.shape)}; expected [T, K]")
    return h


@runtime_checkable
class SamplingScheme(Protocol):
    """Anything that turns channel gains into participation probabilities."""

    def probabilities(self, h: Tensor, *, start: int = 0, horizon: int | None = None) -> Tensor:
        """p[t, k] for the rounds of ``h``.

        h : [T, K], float — amplitude gains; rows are rounds ``start, ..., start + T - 1`` of
        a run with ``horizon`` rounds (default: ``start + T``).
        Returns p : [T, K], float64, entries in [0, 1].
        """
        ...


@dataclass(frozen=True)
class UniformSampling:
    """p_{k,t} = p for every user and round; p in (0, 1]."""

    p: float

    def __post_init__(self) -> None:
        _check_p("sampling.p", self.p)

    def probabilities(self, h: Tensor, *, start: int = 0, horizon: int | None = None) -> Tensor:
        h = _as_h(h)
        return torch.full(h.shape, float(self.p), dtype=torch.float64, device=h.device)


#: Schedules of :class:`TimeVaryingSampling`.
from otafl.names import SCHEDULES  # noqa: E402 (the names, torch-free)


@dataclass(frozen=True)
class TimeVaryingSampling:
    """p_{k,t} = p_t for every user, p_t from a schedule over the horizon of T rounds.

    With s = t / (T - 1) in [0, 1] (s = 0 when T = 1):

    - ``constant``     p_t = p_start (``p_end`` is ignored).
    - ``linear``       p_t = p_start + (p_end - p_start) s.
    - ``exponential``  p_t = p_start (p_end / p_start)^s  (geometric interpolation).
    - ``cosine``       p_t = p_end + (p_start - p_end) (1 + cos(pi s)) / 2  (cosine annealing).
    - ``list``         p_t = values[t]; ``p_start``/``p_end`` are not used. Past the end of
      the list (T > len(values)) the last value is held (``overflow="hold"``, the default)
      or the list is repeated (``overflow="cycle"``).

    Every p_t lies in (0, 1]: the endpoints and list values are checked at construction, and
    the interpolations stay between their endpoints.
    """

    schedule: str
    p_start: float | None = None
    p_end: float | None = None
    values: tuple[float, ...] = ()
    overflow: str = "hold"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise OtaflInputError(
                f"sampling.schedule = {self.schedule!r} is unknown; choose one of: {', '.join(SCHEDULES)}")
        if self.overflow not in ("hold", "cycle"):
            raise OtaflInputError(
                f"sampling.overflow = {self.overflow!r} is unknown; choose one of: hold, cycle")
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        if self.schedule == "list":
            if not self.values:
                raise OtaflInputError("sampling.values is empty; schedule 'list' needs at least one value")
            for v in self.values:
                _check_p("sampling.values", v)
        else:
            if self.p_start is None:
                raise OtaflInputError(f"sampling.p_start is required by schedule {self.schedule!r}")
            if self.p_end is None and self.schedule != "constant":
                raise OtaflInputError(f"sampling.p_end is required by schedule {self.schedule!r}")
        if self.p_start is not None:
            _check_p("sampling.p_start", self.p_start)
        if self.p_end is not None:
            _check_p("sampling.p_end", self.p_end)

    def schedule_values(self, horizon: int) -> Tensor:
        """p_t for t = 0, ..., horizon - 1, as a [horizon] float64 tensor."""
        T = int(horizon)
        if T < 0:
            raise out_of_range("rounds", T, "[0, inf)")
        t = torch.arange(T, dtype=torch.float64)
        if self.schedule == "list":
            vals = torch.tensor(self.values, dtype=torch.float64)
            n = vals.numel()
            idx = torch.arange(T) % n if self.overflow == "cycle" else torch.clamp(torch.arange(T), max=n - 1)
            return vals[idx]
        p0 = float(self.p_start)
        if self.schedule == "constant":
            return torch.full((T,), p0, dtype=torch.float64)
        p1 = float(self.p_end)
        s = t / (T - 1) if T > 1 else torch.zeros_like(t)
        if self.schedule == "linear":
            p = p0 + (p1 - p0) * s
        elif self.schedule == "exponential":
            p = p0 * torch.pow(torch.tensor(p1 / p0, dtype=torch.float64), s)
        else:  # cosine
            p = p1 + (p0 - p1) * 0.5 * (1.0 + torch.cos(math.pi * s))
        if T > 1:  # pin the endpoints exactly (interpolation can miss them by one ulp)
            p[0] = p0
            p[-1] = p1
        # rounding can never leave the interval spanned by p0 and p1, which lies in (0, 1]
        return torch.clamp(p, min=min(p0, p1), max=max(p0, p1))

    def probabilities(self, h: Tensor, *, start: int = 0, horizon: int | None = None) -> Tensor:
        h = _as_h(h)
        T, K = h.shape
        start = int(start)
        horizon = start + T if horizon is None else int(horizon)
        if start < 0 or start + T > horizon:
            raise OtaflInputError(
                f"rounds {start}..{start + T - 1} do not fit in a horizon of {horizon} rounds")
        p_t = self.schedule_values(horizon)[start:start + T].to(h.device)
        return p_t[:, None].expand(T, K).contiguous()


@dataclass(frozen=True)
class ChannelAwareSampling:
    """p_{k,t} = min(1, h_{k,t} / h_th), h_th > 0 (same units as h).

    Users whose gain reaches h_th always join; weaker ones join in proportion to their gain.
    With E[h^2] = 1 and h_th = 2 (the paper's preset) few users join in a round, so the
    privacy amplification is strong; the ``unknown`` estimator then weights users by p_k.
    """

    h_th: float

    def __post_init__(self) -> None:
        v = check_range("sampling.h_th", self.h_th, lo=0.0, lo_open=True)
        if math.isinf(v):
            raise out_of_range("sampling.h_th", self.h_th, "(0, inf)")

    def probabilities(self, h: Tensor, *, start: int = 0, horizon: int | None = None) -> Tensor:
        h = _as_h(h)
        return torch.clamp(h / float(self.h_th), max=1.0)


#: Sampling schemes by name.
#: The names live in :mod:`otafl.names` (torch-free, for spec validation); entries resolve here.
from otafl.names import SAMPLING_SCHEMES  # noqa: E402


def make_sampling(name: str, **params) -> SamplingScheme:
    """Build a sampling scheme from its registry name and keyword parameters.

    ``make_sampling("uniform", p=0.5)``, ``make_sampling("channel-aware", h_th=2.0)``,
    ``make_sampling("time-varying", schedule="linear", p_start=0.2, p_end=0.8)``.

    Raises
    ------
    OtaflInputError
        Unknown name (lists the names), a parameter the scheme does not take (lists the
        ones it does), or a value out of range, e.g.
        ``sampling.p = 1.5 is outside the allowed range (0, 1]``.
    """
    if name not in SAMPLING_SCHEMES:
        raise OtaflInputError(
            f"sampling scheme {name!r} is unknown; choose one of: {', '.join(sorted(SAMPLING_SCHEMES))}")
    cls = SAMPLING_SCHEMES[name]
    allowed = [f.name for f in fields(cls)]
    extra = sorted(set(params) - set(allowed))
    if extra:
        raise OtaflInputError(
            f"sampling scheme {name!r} takes {', '.join(allowed)}; got unexpected {', '.join(extra)}")
    missing = [f.name for f in fields(cls)
               if f.name not in params and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise OtaflInputError(f"sampling scheme {name!r} needs {', '.join(missing)}")
    if "values" in params and params["values"] is not None:
        params = {**params, "values": tuple(params["values"])}
    return cls(**params)


def draw_participants(p: Tensor, generator: torch.Generator) -> Tensor:
    """Each user flips its own coin: active_k = U_k < p_k, U_k ~ Uniform[0, 1) i.i.d.

    Parameters
    ----------
    p : [K] (or any shape), float — participation probabilities in [0, 1].
    generator : torch.Generator — one draw ``torch.rand(p.shape, dtype=float64)``.

    Returns
    -------
    active : same shape as ``p``, bool. p = 1 always joins, p = 0 never.
    """
    p = torch.as_tensor(p, dtype=torch.float64)
    bad = ~((p >= 0) & (p <= 1))
    if bool(bad.any()):
        raise out_of_range("participation probability", float(p[bad].reshape(-1)[0]), "[0, 1]")
    u = torch.rand(p.shape, generator=generator, dtype=torch.float64, device=generator.device)
    return u.to(p.device) < p
