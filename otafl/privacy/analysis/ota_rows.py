"""Rows of :class:`~otafl.privacy.analysis.ota_round.RoundSpec` for a grid of rounds.

A round with K users becomes a few rows, one per user the adversary might attack, and
each grid point reports its worst row:

- central DP (:func:`central_rows`): users are grouped by their own noise sigma_k^2; a
  group is charged its largest p and the law of the others with that user removed (the
  stochastically smallest law of n in the group: delta increases with p and decreases
  with n). The others' noise is the smallest sigma^2 of the users who can take part
  (replacing a larger variance by a smaller one only helps the adversary). With uniform
  p and sigma this is one row with n ~ Binomial(K - 1, p).
- local DP (:func:`local_rows`): n = 0 (the other users may collude with the server),
  one row per noise group, charged its largest p_k at delta = p_k delta_l (it covers
  every member: delta / p is non-decreasing in p).

Inputs are flattened grids [B] (or [B, K] per user); all float64. See docs/privacy/exact.md#exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from otafl.privacy.analysis.cells import DEFAULT_GRID, CellGrid
from otafl.privacy.analysis.count_law import (
    binomial_count_law,
    local_count_law,
    poisson_binomial_count_law,
    stack_laws,
)
from otafl.privacy.analysis.ota_round import RoundSpec, round_epsilon

__all__ = ["RoundRows", "central_rows", "local_rows", "rows_epsilon"]

_DT = torch.float64


@dataclass(frozen=True)
class RoundRows:
    """Rows of :class:`RoundSpec` for a grid of rounds and which grid point each belongs to.

    ``spec`` has R rows; ``point`` [R] (int64) is the flattened grid index of each row,
    ``target`` [R] the delta at which that row's epsilon is wanted.
    """

    spec: RoundSpec
    point: torch.Tensor
    target: torch.Tensor


def _spec(rows, law, dim, dev):
    t = lambda i: torch.tensor([r[i] for r in rows], dtype=_DT, device=dev)  # noqa: E731
    return RoundSpec(participation_prob=t(0), own_noise_var=t(1), others_noise_var=t(2),
                     channel_noise_var=t(3), half_sensitivity=t(4), law=law, dim=dim)


def others_s2(s2: torch.Tensor, active: torch.Tensor, j: int) -> torch.Tensor:
    """The noise variances of the users other than j who can take part."""
    keep = active.clone()
    keep[j] = False
    return s2[keep]


def central_rows(*, participation_prob: torch.Tensor, noise_var: torch.Tensor,
                 channel_noise_var: torch.Tensor, sensitivity: torch.Tensor, dim: int | None,
                 delta: torch.Tensor, users: torch.Tensor | None = None,
                 tail_mass: float | None = None, block_rel_width: float = 1e-3) -> RoundRows:
    r"""Central-DP rows for B grid points (flattened).

    Parameters
    ----------
    participation_prob, noise_var : [B, K] per user, or [B] with ``users`` [B] (uniform).
    channel_noise_var : [B], N0 / c^2 (gradient units^2).
    sensitivity : [B], Delta (the worst pair is +-Delta/2, i.e. Delta = 2L).
    delta : [B], target delta of each point.
    tail_mass : mass of the law of n left out (added to delta); default
        min(1e-12, 1e-6 * delta).

    Grouping (sound for every user, see the module docstring): users are grouped by
    their own noise sigma_k^2; a group is charged p_own = its largest p and the law of
    the others with that user removed (stochastically the smallest law of n for the
    group; delta is increasing in p_own and decreasing in n under eq. (1); under eq. (5)
    the total count's law is the same for every member and P(k in | m) is largest for the
    largest p). The others' noise is the smallest sigma^2 of the users who can take part;
    eq. (5) is kept (``total_ok``) only where every other user has exactly that noise.
    With uniform p and sigma this is exactly one row with n ~ Binomial(K - 1, p).
    """
    dev = channel_noise_var.device
    delta = delta.to(_DT)
    tm_all = torch.clamp(1e-6 * delta, max=1e-12) if tail_mass is None else \
        torch.full_like(delta, float(tail_mass))
    half = 0.5 * sensitivity.to(_DT)
    if users is not None:
        p, s2 = participation_prob.to(_DT), noise_var.to(_DT)
        law = binomial_count_law(p, users.to(_DT) - 1, tail_mass=tm_all,
                                 block_rel_width=block_rel_width)
        spec = RoundSpec(participation_prob=p, own_noise_var=s2, others_noise_var=s2,
                         channel_noise_var=channel_noise_var.to(_DT), half_sensitivity=half,
                         law=law, dim=dim)
        return RoundRows(spec=spec, point=torch.arange(p.shape[0], device=dev), target=delta)
    rows, laws, point, target, total_ok = [], [], [], [], []
    for b in range(channel_noise_var.shape[0]):
        tm = float(tm_all[b])
        p, s2 = participation_prob[b].to(_DT), noise_var[b].to(_DT)
        active = p > 0
        if not bool(active.any()):
            active = torch.ones_like(active)
        s_min = float(s2[active].min())
        for v in torch.unique(s2[active]).tolist():
            members = torch.nonzero(active & (s2 == v)).reshape(-1)
            j = int(members[torch.argmax(p[members])])
            others = torch.cat([p[:j], p[j + 1:]])
            if others.numel() and bool((others == others[0]).all()):
                law = binomial_count_law(others[:1], others.numel(), tail_mass=tm,
                                         block_rel_width=block_rel_width)
            elif others.numel():
                law = poisson_binomial_count_law(others[None], tail_mass=tm,
                                                 block_rel_width=block_rel_width)
            else:
                law = local_count_law(1, device=dev)
            rows.append((float(p[j]), float(v), s_min, float(channel_noise_var[b]),
                         float(half[b])))
            total_ok.append(bool((others_s2(s2, active, j) == s_min).all()))
            laws.append(law)
            point.append(b)
            target.append(float(delta[b]))
    spec = _spec(rows, stack_laws(laws), dim, dev)
    spec = RoundSpec(*[getattr(spec, f) for f in ("participation_prob", "own_noise_var", "others_noise_var",
                                                   "channel_noise_var", "half_sensitivity", "law", "dim")],
                     total_ok=torch.tensor(total_ok, dtype=torch.bool, device=dev))
    return RoundRows(spec=spec,
                     point=torch.tensor(point, dtype=torch.long, device=dev),
                     target=torch.tensor(target, dtype=_DT, device=dev))


def local_rows(*, participation_prob: torch.Tensor, noise_var: torch.Tensor,
               channel_noise_var: torch.Tensor, sensitivity: torch.Tensor, dim: int | None,
               delta_l: torch.Tensor, uniform: bool) -> RoundRows:
    """Local-DP rows: one per distinct sigma_k^2 among users with p_k > 0, charged the
    group's largest p at target p delta_l.

    Parameters as in :func:`central_rows` (``uniform``: inputs are [B], one user type).
    n = 0: the other users may collude with the server and cancel their contributions.
    Within a noise group delta(eps) / p is non-decreasing in p (joint convexity:
    (1 - p) R + p P = (p/p') [(1 - p') R + p' P] + (1 - p/p') R), so the largest p's
    epsilon at p delta_l is at least every member's at its own p_k delta_l, and its
    profile dominates every member's pointwise.
    """
    dev = channel_noise_var.device
    half = 0.5 * sensitivity.to(_DT)
    if uniform:
        p, s2 = participation_prob.to(_DT), noise_var.to(_DT)
        keep = torch.nonzero(p > 0).reshape(-1)
        spec = RoundSpec(participation_prob=p[keep], own_noise_var=s2[keep],
                         others_noise_var=torch.zeros_like(s2[keep]),
                         channel_noise_var=channel_noise_var.to(_DT)[keep],
                         half_sensitivity=half[keep], law=local_count_law(len(keep), device=dev),
                         dim=dim)
        return RoundRows(spec=spec, point=keep, target=p[keep] * delta_l.to(_DT)[keep])
    rows, point, target = [], [], []
    for b in range(channel_noise_var.shape[0]):
        p_b, s2_b = participation_prob[b].to(_DT), noise_var[b].to(_DT)
        active = p_b > 0
        for s2 in torch.unique(s2_b[active]).tolist():
            p = float(p_b[active & (s2_b == s2)].max())
            rows.append((p, s2, 0.0, float(channel_noise_var[b]), float(half[b])))
            point.append(b)
            target.append(p * float(delta_l[b]))
    return RoundRows(spec=_spec(rows, local_count_law(len(rows), device=dev), dim, dev),
                     point=torch.tensor(point, dtype=torch.long, device=dev),
                     target=torch.tensor(target, dtype=_DT, device=dev))


def rows_epsilon(rows: RoundRows, num_points: int, *, grid: CellGrid = DEFAULT_GRID
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Worst epsilon over each grid point's rows, and the smallest n + 1 accounted for.

    Returns ``eps`` [num_points] (0 where a point has no row) and ``fewest`` [num_points],
    min over its rows of (smallest n in the window) + 1: P(|K_t| < fewest) <= tail mass.
    """
    dev = rows.point.device
    out = torch.zeros(num_points, dtype=_DT, device=dev)
    fewest = torch.zeros(num_points, dtype=_DT, device=dev)
    if rows.point.numel() == 0:
        return out, fewest
    eps = round_epsilon(rows.target, rows.spec, grid=grid)
    n_min = rows.spec.law.n_first[:, 0] + 1
    fewest = torch.full_like(fewest, math.inf).scatter_reduce(0, rows.point, n_min, reduce="amin")
    fewest = torch.where(torch.isinf(fewest), torch.zeros_like(fewest), fewest)
    return out.scatter_reduce(0, rows.point, eps, reduce="amax", include_self=True), fewest
