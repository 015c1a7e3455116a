r"""Composition of numerically integrated round profiles by privacy-loss distributions.

Each distinct round's upper bound delta_t(eps) (:func:`round_profile`, the smaller of
eqs. (1) and (5) of :mod:`~otafl.privacy.analysis.ota_round`) is evaluated on a fixed-gap
grid eps_i = i * gap, i = 0..points, common to all rounds. The round's pair is symmetric
(u -> -u swaps P and Q), so for eps < 0, delta(eps) = 1 - e^eps + e^eps delta(-eps). With
several rows (user groups) in a round, the pointwise maximum of their profiles is used
(it dominates every row, and a maximum of convex functions is convex). From these values
dp_accounting builds the pessimistic connect-the-dots PLD (Doroshenko, Ghazi, Kamath,
Kumar & Manurangsi 2022, Alg. 1), whose profile is the chord through the points, above
every convex profile through (or below) them; the PLDs of the distinct rounds are
self-composed with their multiplicities and composed by FFT (:func:`compose_profiles`),
and epsilon is read at delta_target. Since min(delta_(1), delta_(5)) need not be convex,
its greatest convex minorant in e^eps is used (still above the true, convex, profile).
dp_accounting is imported on first use. See docs/privacy/composition.md#pld-composition.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch

from otafl.privacy.analysis.cells import DEFAULT_GRID, CellGrid
from otafl.privacy.analysis.count_law import lump_counts, total_count_law
from otafl.privacy.analysis.ota_round import RoundSpec, round_cells, round_delta, take_rows, with_dim
from otafl.privacy.analysis.pld_dense import compose_dense_counted, connect_dots_pmf, dense_arrays, round_pmfs  # noqa: F401

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_GRID_EPS", "lower_convex_envelope", "round_profile", "total_upper", "others_floor", "probe_rows", "profile_grid",
           "compose_profiles"]

_DT = torch.float64
MAX_GRID_EPS = 500.0
"""Largest grid end eps_max for a PLD (e^eps must stay finite); beyond, the total is +inf."""
_TAIL = 1e-15  # each composition's tails cut to the pessimistic side (pld_dense, as dp_accounting's)


def lower_convex_envelope(x, y):
    """Greatest convex minorant of the points (x_i, y_i) (x increasing), at the x_i.

    A true privacy profile is convex in x = e^eps; where it lies below every point it
    lies below this envelope too, so replacing min(delta_(1), delta_(5)) (not convex in
    general) by its envelope keeps the connect-the-dots PLD pessimistic.

    Parameters
    ----------
    x, y : [N] numpy float64 arrays, x increasing.

    Returns
    -------
    [N] numpy float64: the envelope at each x_i.
    """
    import numpy as np

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.arange(len(x))
    # Vectorised passes: a point on or above the segment between its kept neighbours is no
    # vertex of the lower hull of the kept points, and dropping non-vertices leaves the hull
    # unchanged, so all such points are dropped at once; repeated until the kept points are
    # convex (then they are the hull's vertices, as in :func:`_lower_convex_envelope_scan`).
    while len(keep) > 2:
        xa, xb, xc = x[keep[:-2]], x[keep[1:-1]], x[keep[2:]]
        ya, yb, yc = y[keep[:-2]], y[keep[1:-1]], y[keep[2:]]
        above = (yb - ya) * (xc - xa) >= (yc - ya) * (xb - xa)
        if not above.any():
            break
        keep = np.concatenate([keep[:1], keep[1:-1][~above], keep[-1:]])
    # The constant min(y) is a convex minorant, so the envelope is >= min(y); interpolating
    # towards a zero vertex can round a denormal below it (-5e-324: dp_accounting then refuses
    # the profile as a delta), so the floor is applied.
    return np.maximum(np.interp(x, x[keep], y[keep]), y.min())


def _lower_convex_envelope_scan(x, y):
    """The monotone-chain scan that :func:`lower_convex_envelope` replaced (kept for the tests)."""
    import numpy as np

    hull = [0]
    for i in range(1, len(x)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (y[b] - y[a]) * (x[i] - x[a]) >= (y[i] - y[a]) * (x[b] - x[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return np.interp(x, x[hull], y[hull])


def round_profile(eps: torch.Tensor, spec: RoundSpec, *, grid: CellGrid = DEFAULT_GRID,
                  probe_delta: float | None = None, slack: float = 1e-3, stride: int = 1,
                  lump: float = 0.01, max_elements: int = 1 << 18, others: str = "probe",
                  upper: torch.Tensor | None = None, limit: torch.Tensor | None = None) -> torch.Tensor:
    """Upper bound on each row's profile at the points ``eps`` (increasing): eq. (5), and eq. (1) where it helps.

    Both equations bound the same delta, so any pointwise choice between them, or any
    chord between upper bounds (the true profile is convex in e^eps), is an upper bound.
    Eq. (5) (one-dimensional when the noises are equal) is evaluated everywhere. Eq. (1)
    needs the s cells in d dimensions (costly), so there it enters only

    - for rows where its d = 1 lower bound is below eq. (5) at some point (elsewhere it
      cannot be smaller: u alone is a projection of the d-dimensional output); with
      ``probe_delta``, only for rows where that holds at the probe point (the first grid
      point where eq. (5) is <= ``probe_delta``) and eq. (1) is smaller there by enough to
      save more than a relative ``slack`` of that epsilon (estimated from eq. (5)'s
      log-slope);
    - evaluated at every ``stride``-th point (and the last) and, in between, replaced by
      its chord in e^eps (above the convex true profile), with the law of n lumped into
      blocks over which the absent variance grows by at most a relative ``lump``
      (:func:`_others_upper`).

    In d = 1 or with ``dim=None`` eq. (1) is cheap and the result is min(delta_(1),
    delta_(5)) at every point, as ``round_delta(conditioning="best")``.

    ``others="skip"`` leaves the d-dimensional eq. (1) out wherever eq. (5) holds (it is
    still used on rows where eq. (5) does not hold, which have no other bound); the
    caller decides that it cannot help (:func:`otafl.privacy.accountants.exact_run.compose_exact_rounds`
    screens the run's total with eq. (1)'s d = 1 lower bound). ``upper``: eq. (5)'s
    values at ``eps`` ([R, E]) when the caller has them already. ``limit`` ([R] ints): eq. (1)
    enters each row at its first ``limit`` points only (and up to the next evaluated point,
    for the chords); beyond, eq. (5) alone (:func:`_others_upper`'s ``limit``).

    Parameters
    ----------
    eps : [E], float64 >= 0, increasing.
    spec : R rows.
    max_elements : chunk size in (row, eps, count, cell) elements (memory).

    Returns
    -------
    [R, E] float64 in [0, 1].
    """
    eps = torch.as_tensor(eps, dtype=_DT).reshape(-1)
    R, E = spec.participation_prob.shape[0], eps.numel()
    if R == 0:
        return torch.empty(R, E, dtype=_DT)
    N = spec.law.weight.shape[1]
    if total_count_law(spec.law, spec.participation_prob) is None:  # blocks: eq. (1) only
        return _others_upper(eps, spec, torch.arange(R), grid, max_elements)
    rows = max(1, max_elements // max(1, E * (N + 1)))
    up = upper.clone() if upper is not None else total_upper(eps, spec, max_elements)
    if spec.dim is None or spec.dim <= 1:
        low = torch.cat([round_delta(eps.expand(min(R, s + rows) - s, E),
                                     take_rows(spec, torch.arange(s, min(R, s + rows))), conditioning="others",
                                     lower=False)[0]
                         for s in range(0, R, rows)])
        return torch.minimum(up, low)
    if others == "skip":
        cand = torch.nonzero(~spec.total_ok).reshape(-1) if spec.total_ok is not None else torch.arange(0)
    elif probe_delta is None:
        cand = torch.nonzero((_d1_lower(eps.expand(R, E), spec, rows) < up).any(1)).reshape(-1)
    else:
        cand, at, up_at, slope = _probe(eps, spec, up, probe_delta, slack, rows)
        if cand.numel():
            d_probe = _others_upper(eps[at[cand]][:, None], spec, cand, grid, max_elements, lump)[:, 0]
            saved = torch.log(up_at[cand] / d_probe) / slope[cand]
            cand = cand[(d_probe < up_at[cand]) & ~(saved <= slack * eps[at[cand]])]
    if cand.numel():
        sparse = torch.unique(torch.cat([torch.arange(0, E, max(1, stride)), torch.tensor([E - 1])]))
        need = None
        if limit is not None:  # the sparse points up to each row's limit, and the next one (its chords)
            need = torch.searchsorted(sparse, (limit[cand] - 1).clamp(min=0), right=True) + 1
        u1 = _others_upper(eps[sparse], spec, cand, grid, max_elements, lump, limit=need)
        x = torch.exp(eps)
        seg = (torch.searchsorted(sparse, torch.arange(E), right=True) - 1).clamp(max=len(sparse) - 2)
        if len(sparse) == 1:
            full = u1.expand(-1, E)
        else:
            xa, xb = x[sparse[seg]], x[sparse[seg + 1]]
            frac = ((x - xa) / (xb - xa)).clamp(0.0, 1.0)
            full = u1[:, seg] + (u1[:, seg + 1] - u1[:, seg]) * frac
            full[:, sparse] = u1
        if need is not None:  # no bound beyond a row's points (+inf, and nan where chords meet +inf)
            full = torch.nan_to_num(full, nan=math.inf)
        up[cand] = torch.minimum(up[cand], full)
    return up


def _d1_lower(e: torch.Tensor, spec: RoundSpec, rows: int) -> torch.Tensor:
    """Eq. (1) in d = 1, a lower bound on eq. (1) in d dimensions (u alone is a projection of the
    output), for every row of ``spec`` at its own points ``e`` [R, E'], ``rows`` rows at a time."""
    R, one = e.shape[0], with_dim(spec, 1)
    return torch.cat([round_delta(e[s:s + rows], take_rows(one, torch.arange(s, min(R, s + rows))),
                                  conditioning="others", upper=False)[1] for s in range(0, R, rows)])


def _probe(eps, spec, up, probe_delta, slack, rows):
    """Rows where eq. (1)'s d = 1 lower bound could save more than ``slack`` of eq. (5)'s
    epsilon at the probe point (the first point where eq. (5) is <= ``probe_delta``), and
    (probe index, eq. (5) there, eq. (5)'s log-slope there) per row."""
    R, E = up.shape
    below = up <= probe_delta
    at = torch.where(below.any(1), below.to(torch.int8).argmax(1), torch.full((R,), E - 1))
    up_at = up.gather(1, at[:, None])[:, 0]
    low_at = _d1_lower(eps[at][:, None], spec, rows)[:, 0]
    prev = (at - 1).clamp(min=0)
    # The epsilon eq. (1) could save at the probe, from eq. (5)'s log-slope there.
    slope = (torch.log(up[torch.arange(R), prev]) - torch.log(up_at)) / (eps[at] - eps[prev]).clamp(min=1e-300)
    # Its d = 1 lower bound caps what the d-dimensional eq. (1) can save: rows where even
    # that saves no more than ``slack`` skip the costly cells (at K = 10^4 most rows).
    could = torch.log(up_at / low_at) / slope
    return torch.nonzero((low_at < up_at) & ~(could <= slack * eps[at])).reshape(-1), at, up_at, slope


def probe_rows(eps: torch.Tensor, spec: RoundSpec, up: torch.Tensor, probe_delta: float, slack: float = 1e-3,
               max_elements: int = 1 << 18) -> torch.Tensor:
    """The rows of ``spec`` where :func:`round_profile` (with ``probe_delta``) may use eq. (1)
    in d dimensions: its d = 1 lower bound saves more than ``slack`` at the probe. ``up``:
    eq. (5) at ``eps`` [R, E]. Index tensor."""
    rows = max(1, max_elements // max(1, spec.law.weight.shape[1] + 1))
    return _probe(eps, spec, up, probe_delta, slack, rows)[0]


def total_upper(eps: torch.Tensor, spec: RoundSpec, max_elements: int = 1 << 18) -> torch.Tensor:
    """Eq. (5)'s upper bound for every row of ``spec`` at ``eps`` ([E], common), chunked by
    rows to about ``max_elements`` (row, eps, count) elements. [R, E]."""
    R, E, N = spec.participation_prob.shape[0], eps.numel(), spec.law.weight.shape[1]
    rows = max(1, max_elements // max(1, E * (N + 1)))
    return torch.cat([round_delta(eps.expand(min(R, s + rows) - s, E), take_rows(spec, torch.arange(s, min(R, s + rows))),
                                  conditioning="total", lower=False)[0] for s in range(0, R, rows)])


def others_floor(eps: torch.Tensor, spec: RoundSpec, max_elements: int = 1 << 18) -> torch.Tensor:
    """Eq. (1)'s d = 1 lower bound for every row at ``eps`` ([E], common): no d-dimensional
    eq. (1) upper bound can be below it (u alone is a projection of the output). Not a bound
    on delta; used to screen where eq. (1) could help. [R, E]."""
    R, E, N = spec.participation_prob.shape[0], eps.numel(), spec.law.weight.shape[1]
    return _d1_lower(eps.expand(R, E), spec, max(1, max_elements // max(1, E * (N + 1))))


CALL_ELEMENTS = 1 << 15
"""(row, eps, count, cell) elements of one eq. (1) evaluation in :func:`_others_upper`: the
kernel's temporaries then stay in cache (measured on the paper preset's run: 16k-64k elements
a call 0.30 s, 260k 0.38 s, 2.7k 0.67 s)."""
LIMIT_BAND = 16
"""Rows given a ``limit`` in :func:`_others_upper` are evaluated in bands of rows whose limits
round up to the same multiple of this many points."""


def _others_upper(eps: torch.Tensor, spec: RoundSpec, rows: torch.Tensor, grid: CellGrid,
                  max_elements: int, lump: float = 0.0, limit: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. (1)'s upper bound for ``rows`` of ``spec`` at ``eps`` ([E] common, or [len(rows), E]).

    With ``lump > 0`` each row's law of n is coarsened first (:func:`lump_counts`): blocks
    of consecutive n over which the absent variance n sigma_o^2 + ch grows by at most a
    relative ``lump``, each charged at its smallest n (safe: eq. (1)'s terms do not
    increase with n). The cells are built once per chunk of rows; rows are chunked to about
    ``max_elements`` (row, eps, count, cell) elements, eps columns to :data:`CALL_ELEMENTS`.
    ``limit`` ([len(rows)] ints, with a common [E] ``eps``): each row needs only its first
    ``limit`` points; rows are evaluated in bands (:data:`LIMIT_BAND`) up to their band's
    largest limit, and +inf (no bound) is returned beyond it.
    """
    if limit is not None and len(rows) and eps.dim() == 1:
        out = torch.full((len(rows), eps.shape[-1]), math.inf, dtype=_DT)
        limit = limit.clamp(min=1, max=eps.shape[-1])
        band = (limit + LIMIT_BAND - 1) // LIMIT_BAND
        for b in torch.unique(band).tolist():
            sel = torch.nonzero(band == b).reshape(-1)
            top = int(limit[sel].max())
            out[sel, :top] = _others_upper(eps[:top], spec, rows[sel], grid, max_elements, lump)
        return out
    if lump > 0 and len(rows):
        so2 = spec.others_noise_var[rows]
        var = spec.law.n_first[rows, 0] * so2 + spec.channel_noise_var[rows]
        width = torch.where(so2 > 0, lump * var / so2.clamp(min=1e-300), torch.zeros_like(so2)).floor()
        wide = torch.nonzero(width >= 2).reshape(-1)
        if wide.numel():
            out = torch.empty(len(rows), eps.shape[-1], dtype=_DT)
            rest = torch.nonzero(width < 2).reshape(-1)
            if rest.numel():
                out[rest] = _others_upper(eps if eps.dim() == 1 else eps[rest], spec, rows[rest], grid, max_elements)
            for i in wide.tolist():
                one = take_rows(spec, rows[i:i + 1])
                one = RoundSpec(one.participation_prob, one.own_noise_var, one.others_noise_var,
                                one.channel_noise_var, one.half_sensitivity,
                                lump_counts(one.law, int(width[i])), one.dim, one.total_ok)
                out[i] = _others_upper(eps if eps.dim() == 1 else eps[i:i + 1], one, torch.tensor([0]), grid,
                                       max_elements)[0]
            return out
    N = spec.law.weight.shape[1]
    J = grid.quantile_cells + grid.posterior_cells + 4 if spec.dim is not None and spec.dim > 1 else 2
    E = eps.shape[-1]
    per_row = N * J
    step = max(1, max_elements // max(1, per_row * min(E, 8)))
    out = []
    for s in range(0, len(rows), step):
        idx = rows[s:s + step]
        cols = max(1, CALL_ELEMENTS // max(1, per_row * len(idx)))  # eps columns a call, for this chunk's rows
        sub = take_rows(spec, idx)
        cells = round_cells(sub, grid, "others", lower=False)
        e = eps.expand(len(idx), E) if eps.dim() == 1 else eps[s:s + step]
        out.append(torch.cat([round_delta(e[:, i:i + cols], sub, cells=cells, conditioning="others", lower=False)[0]
                              for i in range(0, E, cols)], dim=1))
    return torch.cat(out) if out else torch.empty(0, E, dtype=_DT)


def profile_grid(eps_max: float, points: int) -> tuple[float, torch.Tensor]:
    """The common grid: gap = max(eps_max, 1e-6) / points and eps_i = i gap, i = 0..points."""
    gap = max(eps_max, 1e-6) / points
    return gap, gap * torch.arange(points + 1, dtype=_DT)


def _pmf_epsilon(pmf, delta: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= ``delta`` for one dp_accounting PLD pmf, computed
    without overflow: delta(eps) = m_inf + sum_{l > eps} p_l (1 - exp(eps - l)), where every
    exp(eps - l) <= 1; bisection on eps, returning the upper end (so delta(eps) <= delta holds)."""
    import numpy as np

    losses, probs, inf_mass = dense_arrays(pmf)
    if inf_mass > delta:
        return math.inf

    def delta_at(eps: float) -> float:
        above = losses > eps
        return inf_mass + float(np.sum(probs[above] * -np.expm1(eps - losses[above])))

    if delta_at(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, float(losses[-1]) if probs.size else 0.0
    if delta_at(hi) > delta:  # only the infinite mass is left above the top loss
        return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if delta_at(mid) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi


def compose_counted(plds) -> object | None:
    """The composition of dp_accounting PLDs given as (pld, count) pairs (each self-composed
    ``count`` times), or None when there are none.

    Composed as a Huffman tree on the rounds each partial composition holds (the two smallest
    first, ties in the given order): a PLD's support grows with its rounds, so composing in
    sequence convolves the growing total with every pair's PLD, and a run of many distinct
    rounds (local steps: every round's last step has its own noise) costs its rounds times
    the total's size; the tree costs about the total's size per level. Composition is
    commutative, so the result is the same up to dp_accounting's pessimistic truncation of
    each composition's tails (measured: relative 2e-10 on a 300-round FedAvg run).

    dp_accounting's truncation bounds (a Chernoff bound over a fixed list of orders,
    pld/common.py) overflow scipy's logsumexp at some orders; those give non-finite bounds,
    which it skips, so numpy's overflow warning is noise and is silenced here; the result is
    unchanged."""
    import heapq

    import numpy as np

    heap = []
    with np.errstate(over="ignore"):
        for i, (pld, count) in enumerate(plds):
            heap.append((int(count), i, pld.self_compose(count) if count > 1 else pld))
        if not heap:
            return None
        heapq.heapify(heap)
        tick = len(heap)
        while len(heap) > 1:
            n_a, _, a = heapq.heappop(heap)
            n_b, _, b = heapq.heappop(heap)
            heapq.heappush(heap, (n_a + n_b, tick, a.compose(b)))
            tick += 1
    return heap[0][2]


def epsilon_for_delta(pld, delta: float) -> float:
    """``pld.get_epsilon_for_delta(delta)`` (dp_accounting), recomputed by :func:`_pmf_epsilon`
    where it returns +inf: its scan divides by a sum of p exp(-loss) that underflows when
    losses reach a few hundred (long compositions of large per-round losses), which turns the
    ratio into +inf and the answer into +inf although a finite epsilon exists."""
    import numpy as np

    with np.errstate(over="ignore", divide="ignore"):
        eps = float(pld.get_epsilon_for_delta(delta))
    if math.isfinite(eps):
        return eps
    pmfs = [pld._pmf_remove] + ([] if pld._symmetric else [pld._pmf_add])  # noqa: SLF001
    return max(_pmf_epsilon(pmf, delta) for pmf in pmfs)


def compose_profiles(profiles: Sequence[tuple[np.ndarray, int]], *, gap: float,
                     delta_target: float) -> float:
    """Total epsilon at ``delta_target`` of rounds given by their profiles on the common grid.

    Parameters
    ----------
    profiles : (delta at eps_i = i gap for i = 0..points, repetitions) per distinct
        round; upper bounds on a symmetric pair's profile. Beyond the last point the
        remaining mass is left as infinite privacy loss (pessimistic).
    gap : the grid's interval (the PLD's discretisation).
    delta_target : total delta, in (0, 1).

    Returns
    -------
    epsilon : float (0 when there is no round; +inf when the grid reaches beyond
    :data:`MAX_GRID_EPS`, rounds leaking so much that the PLD is not worth building).
    """
    import numpy as np
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    if any(gap * (len(pos) - 1) > MAX_GRID_EPS for pos, _ in profiles):
        return math.inf

    pmfs: list = [None] * len(profiles)
    by_length: dict[int, list] = {}
    for i, (pos, _) in enumerate(profiles):
        by_length.setdefault(len(pos), []).append(i)
    for members in by_length.values():  # each round's connect-the-dots PLD, all rounds of a length at once
        for i, pmf in zip(members, round_pmfs(np.stack([np.asarray(profiles[i][0], dtype=np.float64) for i in members]),
                                              gap, tail=_TAIL)):
            pmfs[i] = pmf
    total = compose_dense_counted(((PrivacyLossDistribution(pmf), count) for pmf, (_, count) in zip(pmfs, profiles)),
                                  _TAIL, trimmed=True)
    if total is None:
        return 0.0
    eps = epsilon_for_delta(total, delta_target)
    return eps if math.isfinite(eps) else math.inf


MAX_PLD_POINTS = 1e7
"""Largest PLD (estimated loss-grid points, :func:`pld_points`) that the ``steps``
accountants compose with ``pld``; also at most the memory limit over
:data:`PLD_BYTES_PER_POINT`. Larger compositions (small step noise, many steps or rounds)
are composed with ``rdp`` instead, and the fallback is noted (:func:`take_notes`).
Measured: 9e6 points take ~1.1 GB and 7 s, 8e7 points ~6 GB and a minute."""

MAX_STEP_POINTS = 1e6
"""Largest single-step PLD (loss-grid points) built with ``pld``: dp_accounting builds it
in a Python loop, ~6 s per million points (step noise z ~ 0.12)."""

PLD_BYTES_PER_POINT = 128
"""Peak bytes per grid point of a dp_accounting composition (FFT buffers and copies; measured)."""

_NOTES: list[str] = []


def take_notes() -> list[str]:
    """The fallbacks taken since the last call (one line each), and forget them."""
    out = list(dict.fromkeys(_NOTES))
    _NOTES.clear()
    return out


def pld_points(rounds, gap: float) -> float:
    """Estimated loss-grid points of the composed PLD of (StepRound, count) pairs (about 2x
    the measured sizes): the loss range of n Gaussian(z) steps after tail truncation,
    sum 1/(2 z^2) + 10 sqrt(sum 1/z^2), plus one step's range (1 + 20 z) / (2 z^2) + 1."""
    mean = var = step = 0.0
    for r, count in rounds:
        for z, n in ((r.noise_multiplier, count * (r.steps - 1)), (r.last, count)):
            if n > 0 and not math.isinf(z) and z > 0:
                mean += n / (2.0 * z * z)
                var += n / (z * z)
                step = max(step, (1.0 + 20.0 * z) / (2.0 * z * z) + 1.0)
    return (mean + 10.0 * math.sqrt(var) + step) / gap


def step_points(rounds, gap: float) -> float:
    """Loss-grid points of the widest single step among the (StepRound, count) pairs."""
    zs = [z for r, _ in rounds for z in (r.noise_multiplier, r.last) if z > 0 and not math.isinf(z)]
    return max(((1.0 + 20.0 * z) / (2.0 * z * z) + 1.0 for z in zs), default=0.0) / gap


_MEMORY_BUDGET: list[float] = []


def set_memory_budget(nbytes: float | None) -> None:
    """The memory limit (bytes) that caps a PLD's size (:func:`pld_cap`); set by the layers
    that know it (``otafl.limits``: ``otafl --memory-limit``). None: no limit but the fixed cap."""
    _MEMORY_BUDGET[:] = [] if nbytes is None else [float(nbytes)]


def pld_cap() -> float:
    """:data:`MAX_PLD_POINTS`, or fewer under a low memory limit (:func:`set_memory_budget`)."""
    return min([MAX_PLD_POINTS] + [b / PLD_BYTES_PER_POINT for b in _MEMORY_BUDGET])


def pld_fits(rounds, gap: float) -> bool:
    """Whether the PLD of the (StepRound, count) pairs fits under :func:`pld_cap`; if not, the
    fallback to ``rdp`` is noted (:func:`take_notes`) and False returned."""
    points, cap = pld_points(rounds, gap), pld_cap()
    if points <= cap and step_points(rounds, gap) <= MAX_STEP_POINTS:
        return True
    if points <= cap:
        _NOTES.append(f"steps: one step's PLD would have about {step_points(rounds, gap):.2g} grid points (small step "
                      f"noise), over the cap of {MAX_STEP_POINTS:.2g}; composed with rdp instead (an upper bound, "
                      f"looser than pld)")
        return False
    _NOTES.append(f"steps: a PLD of about {points:.2g} grid points (~{points * PLD_BYTES_PER_POINT / 2**30:.3g} GiB) "
                  f"is over the cap of {cap:.2g}; composed with rdp instead (an upper bound, looser than pld)")
    return False

