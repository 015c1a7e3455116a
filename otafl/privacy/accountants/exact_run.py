r"""The ``exact`` accountant over a whole run: cached per-round epsilons and PLD totals.

A run's rounds are turned into rows, described by hashable, pessimistically rounded keys
(:mod:`otafl.privacy.accountants.exact_rows`; docs/privacy/exact.md#exact-caching). Rows with
equal keys are computed once:

- :func:`row_epsilons`: each distinct row's epsilon at its target delta, batched, kept in
  a module-level LRU (across runs);
- :func:`compose_exact_rounds`: the run's total epsilon by privacy-loss distributions,
  each distinct round (its rows' pointwise-maximum profile) composed with its
  multiplicity (:mod:`otafl.privacy.analysis.pld`). ``otafl audit --rounds`` and
  :func:`~otafl.privacy.accountants.run.account_run` both call it, so they agree.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

import torch

from otafl.privacy.accountants.exact_rows import (  # noqa: F401 (re-exported: the names of the run's rows)
    DEFAULT_RESOLUTION,
    EXACT_WINDOW,
    NO_ROUNDING,
    Resolution,
    _batches,
    _law,
    _pmf,
    _rows_of,
    _sampling_rows,
    _spec,
    clear_laws,
    round_row_keys,
    run_row_keys,
)
from otafl.privacy.analysis.cells import CellGrid
from otafl.privacy.analysis.concentration import clear_poisson_binomial_cache
from otafl.privacy.analysis.count_law import total_count_law
from otafl.privacy.analysis.ota_round import RoundSpec, round_epsilon, take_rows
from otafl.privacy.facts import RoundFacts

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Resolution", "DEFAULT_RESOLUTION", "NO_ROUNDING", "round_row_keys", "run_row_keys", "row_epsilons",
           "exact_round_epsilons", "compose_exact_rounds", "clear_caches"]

_DT = torch.float64
OTHERS_STRIDE = 1
"""Eq. (1) (d-dimensional cells, the costly bound) at every ``OTHERS_STRIDE``-th of a row's PLD
sample points, chords in e^eps between (sound: the profile is convex in e^eps). 1: every
point. Measured (issue 31): 4 saves 2.3x of the profile time on the Table II(a) run
(p = 0.5, 1000 rounds) for +0.12 % local and +0.00002 % central, but costs +1.2 % central
and +2.3 % local on small random heterogeneous rounds at d = 30, over the 0.5 % allowed;
refining where the chords undercut eq. (5) gives every point's totals back but not the time."""
PROFILE_GRID = CellGrid(quantile_cells=8, posterior_cells=16)
"""The s cells of eq. (1) in the totals' profiles: an eighth of :data:`DEFAULT_GRID`'s edges,
nested in them (so never below its bound). Measured (issue 31): the local total +0.017 % on
the paper preset's 1000-round run and +0.10 % on ``large-k.toml``'s at K = 10^4, for 0.35-0.6x
of the local totals' time; the central totals unchanged (eq. (1) does not enter them there)."""
ROW_GRIDS = {"c": CellGrid(quantile_cells=16, posterior_cells=32), "l": CellGrid(quantile_cells=32, posterior_cells=64)}
"""The s cells of eq. (1) for a run's per-round epsilons, by row kind: nested in
:data:`DEFAULT_GRID` (``otafl bound``'s), so never below its epsilon. Measured on the paper
preset's 1000-round run (issue 31): central rows at most +0.02 % (a third of the time),
local rows at most +0.12 % (about half); a quarter grid would cost local rows +0.49 %."""
SCREEN_SLACK = 1e-3
"""Largest relative share of a run's total that the screen of
:func:`compose_exact_rounds` lets eq. (1) (d-dimensional, costly) leave unclaimed."""
FLOOR_FIRST = True
"""The screen's d = 1 floor first at the points its quick look reads (every 4th grid point),
at the others only where they decide something (:func:`compose_exact_rounds`); False: at
every point at once. The same totals either way; measured (issue 31) about 60 % fewer floor
evaluations on the Table II(a) runs."""
OWN_REACH = True
"""Eq. (1) enters each row's profile up to the row's own reach only (the points of its stride
group reach the group's largest; beyond its own reach a row's eq. (5) is below 1e-3 delta / T
already). False: at every point of the group."""
QUIET_SHARE = 0.1
"""Share of a run's rounds (the quietest, by reach) that :func:`compose_exact_rounds` does not
size its grid for: they get a coarser, still pessimistic, PLD. Measured (issue 31; figures in
docs/privacy/composition.md#pld-composition): the paper preset's 1000-round run 2.99 -> 2.13 ms
a round for totals +0.03 % central, +0.04 % local; nine runs within -0.11 % ... +0.07 %."""


# ---------------------------------------------------------------- per-round epsilon


_EPS_CACHE: OrderedDict = OrderedDict()
_EPS_CACHE_SIZE = 4096


def clear_caches() -> None:
    """Forget every cached row epsilon and count law (for timing the uncached path)."""
    _EPS_CACHE.clear()
    clear_laws()
    clear_poisson_binomial_cache()
    _sampling_rows.cache_clear()


def row_epsilons(keys: Sequence[tuple], delta_l: float, *, grid: CellGrid | None = None) -> dict:
    """Epsilon of each distinct row key at its target (delta_l central, p delta_l local).

    The law of n keeps all but min(1e-12, 1e-6 delta_l) (as :func:`exact_round`). Results
    are kept in a module-level LRU of 4096 rows, so repeated rows (within and across runs)
    are computed once. ``grid``: the s cells of eq. (1); None: :data:`ROW_GRIDS` by kind.
    """
    out, missing = {}, []
    for k in dict.fromkeys(keys):
        g = grid or ROW_GRIDS[k[0]]
        hit = _EPS_CACHE.get((k, delta_l, g))
        if hit is None:
            missing.append(k)
        else:
            _EPS_CACHE.move_to_end((k, delta_l, g))
            out[k] = hit
    tail = min(1e-12, 1e-6 * delta_l)
    for batch in _batches(missing):
        spec = _spec(batch, tail)
        g = grid or ROW_GRIDS[batch[0][0]]
        target = torch.full((len(batch),), delta_l, dtype=_DT)
        if batch[0][0] == "l":
            target = target * spec.participation_prob
        for k, e in zip(batch, round_epsilon(target, spec, grid=g).tolist()):
            out[k] = e
            _EPS_CACHE[(k, delta_l, g)] = e
    while len(_EPS_CACHE) > _EPS_CACHE_SIZE:
        _EPS_CACHE.popitem(last=False)
    return out


def exact_round_epsilons(facts: Sequence[RoundFacts], *, delta_l: float, kind: str,
                         resolution: Resolution = DEFAULT_RESOLUTION, grid: CellGrid | None = None
                         ) -> list[float]:
    """Per-round epsilon (worst row; 0 for a round without rows) of ``kind`` central|local."""
    keys = run_row_keys(facts, kind, resolution)
    eps = row_epsilons([k for ks in keys for k in ks], delta_l, grid=grid)
    return [max((eps[k] for k in ks), default=0.0) for ks in keys]


# ---------------------------------------------------------------- totals


def _eps_max(spec: RoundSpec, floor: float, grid: CellGrid) -> torch.Tensor:
    """Per row, an eps where an upper bound on delta is at most ``floor`` (eq. (5) where it
    holds: it is above min(eq. (1), eq. (5)), so the profile is below floor there too; eq. (1)
    elsewhere). [R] float64."""
    R = spec.participation_prob.shape[0]
    ok = spec.total_ok if spec.total_ok is not None else torch.ones(R, dtype=torch.bool)
    if total_count_law(spec.law, spec.participation_prob) is None:
        ok = torch.zeros(R, dtype=torch.bool)
    out = torch.zeros(R, dtype=_DT)
    for rows, cond in ((torch.nonzero(ok).reshape(-1), "total"), (torch.nonzero(~ok).reshape(-1), "others")):
        if rows.numel():
            target = torch.full((rows.numel(),), floor, dtype=_DT)
            out[rows] = round_epsilon(target, take_rows(spec, rows), grid=grid, conditioning=cond, xtol=1e-3)
    return out


def _chord_fill(values: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Upper bounds at every grid point from upper bounds at the points ``idx`` (increasing,
    from 0): the chord in e^eps between sampled points (above the convex true profile), and
    beyond the last sampled point its value (the profile is non-increasing)."""
    import numpy as np

    x = np.exp(eps)
    out = np.interp(x, x[idx], values)
    out[idx[-1]:] = values[-1]
    return out


def compose_exact_rounds(rounds: Sequence[tuple], *, delta_target: float, points: int = 64,
                         max_points: int = 2048, grid: CellGrid = PROFILE_GRID,
                         others_stride: int = OTHERS_STRIDE, slack: float = SCREEN_SLACK,
                         quiet_share: float = QUIET_SHARE) -> dict:
    """Total epsilon at ``delta_target`` of rounds given as tuples of row keys (PLD).

    A round's profile is the pointwise maximum of its rows' upper bounds (it dominates
    every user). Each row has its own reach e_r, the eps where its bound is at most
    1e-3 delta_target / T. The common grid is eps_i = i gap with gap = e_max / N,
    e_max = max_r e_r and N = points e_max / e_small, clipped to [points, max_points],
    e_small the smallest reach of the rounds left when the quietest ``quiet_share`` of the
    rounds (:data:`QUIET_SHARE`, by multiplicity) is set aside: so all but those still get
    about ``points`` intervals over their own reach (a grid sized by the largest round
    alone made quiet rounds' PLDs a few points wide, 4-6 % too pessimistic over fading
    runs; sized by the very quietest round, it cost up to 2048 points where the totals
    did not need them). Each row is
    evaluated at about ``points`` grid points spread over its own reach, and filled in
    between by chords in e^eps (above its convex true profile) and beyond its reach by its
    last value; the rest of each round's mass is left as infinite loss. The law of n keeps
    all but min(1e-15, 1e-6 delta_target). Distinct rounds are composed with their
    multiplicities (:func:`otafl.privacy.analysis.pld.compose_profiles`).

    Eq. (1) in d dimensions (the costly bound) is screened on the whole run first: the
    rows' profiles are built from eq. (5) alone (``others="skip"``) and, as a floor, from
    the smaller of eq. (5) and eq. (1)'s d = 1 lower bound (below every d-dimensional
    eq. (1) bound: composition is monotone in the profiles, so no use of eq. (1) can bring
    the total below the floor's total; computed first at the quick look's points, the others
    only where they decide something: :data:`FLOOR_FIRST`). Where the floor's total is within a relative
    ``slack`` of eq. (5)'s, eq. (5)'s total is stated (an upper bound either way; about
    ``slack`` looser than with eq. (1), not guaranteed: the floor lowers only the rows the
    probe picks, and a two-noise-group run measured +0.48 %); otherwise eq. (1) enters the
    rows where its floor is below eq. (5), at every ``others_stride``-th of a row's points
    (chords in e^eps between) and only where its probe says it helps
    (:func:`~otafl.privacy.analysis.pld.round_profile`), with the s cells of ``grid``
    (:data:`PROFILE_GRID`: coarser than the per-round epsilons', nested in them, so never
    lower).

    Returns
    -------
    dict: ``epsilon`` (float; +inf if a row's bound never reaches the floor, 0 without
    rows), ``gap`` (nan when no PLD was built), ``points`` (N, when a PLD was built),
    ``distinct_rounds``, ``distinct_rows``, ``screened`` (True when eq. (1) was left out by
    the screen).
    """
    import numpy as np

    from otafl.privacy.analysis.pld import (MAX_GRID_EPS, compose_profiles, others_floor, probe_rows, profile_grid,
                                            round_profile, total_upper)

    counts: dict[tuple, int] = {}
    for r in rounds:
        counts[r] = counts.get(r, 0) + 1
    T = len(rounds)
    rows = list(dict.fromkeys(k for r in counts for k in r))
    info = {"distinct_rounds": len(counts), "distinct_rows": len(rows)}
    if not rows:
        return {"epsilon": 0.0, "gap": math.nan, **info}
    tail = min(1e-15, 1e-6 * delta_target)
    specs = [(batch, _spec(batch, tail)) for batch in _batches(rows)]
    reach = {}
    for batch, spec in specs:
        reach.update(zip(batch, _eps_max(spec, 1e-3 * delta_target / T, grid).tolist()))
    e_max = max(reach.values())
    if not e_max <= MAX_GRID_EPS:
        return {"epsilon": math.inf, "gap": math.nan, **info}
    round_reach = sorted((max(reach[k] for k in r), c) for r, c in counts.items() if r)
    e_small, seen, quiet = e_max, 0, quiet_share * sum(c for _, c in round_reach)
    for e, c in round_reach:  # the reach of the quietest round beyond the quietest quiet_share of all
        seen += c
        if e > 0 and seen > quiet:
            e_small = e
            break
    n = int(min(max_points, max(points, math.ceil(points * e_max / max(e_small, 1e-300)))))
    gap, eps = profile_grid(e_max, n)
    eps_np = eps.numpy()
    skip, floor, later, pending = {}, {}, [], []
    for batch, spec in specs:
        # Rows are evaluated in groups sharing one set of points: each row's stride (about
        # its reach / points grid steps) is rounded down to a power of two, and its group
        # is evaluated every stride points up to the group's largest reach. So every row
        # gets at least ``points`` samples over its reach, as with a stride of its own, and
        # a fading run's many distinct rows (each with its own reach) take a few batched
        # calls instead of one each.
        by: dict[int, list] = {}
        tops = {}
        for i, k in enumerate(batch):
            tops[i] = top = min(n, max(1, math.ceil(reach[k] / gap)))
            by.setdefault(1 << max(0, (top // points).bit_length() - 1), []).append(i)
        for stride, members in by.items():
            top = max(tops[i] for i in members)
            sel = torch.tensor(members)
            ix = np.asarray(sorted(set(range(0, top + 1, stride)) | {top}))
            sub = take_rows(spec, sel)
            up5 = total_upper(eps[ix], sub) if total_count_law(sub.law, sub.participation_prob) is not None else None
            vals = round_profile(eps[ix], sub, grid=grid, others="skip", upper=up5)
            low = vals
            if up5 is not None and sub.dim is not None and sub.dim > 1:
                # Only the rows that round_profile's probe would give eq. (1) at all.
                cand = probe_rows(eps[ix], sub, up5, delta_target / T, slack)
                if cand.numel():
                    # The floor first at the points the quick look reads (every 4th grid point
                    # and the last); at the others only for rows where those do not show it
                    # below eq. (5) already, and for the rest if the full look is taken.
                    low = vals.clone()
                    first = (ix % 4 == 0) | (ix == ix[-1]) | (not FLOOR_FIRST)
                    look = torch.nonzero(torch.as_tensor(first)).reshape(-1)
                    other = torch.nonzero(torch.as_tensor(~first)).reshape(-1)
                    low[cand[:, None], look] = torch.minimum(vals[cand][:, look],
                                                             others_floor(eps[ix][look], take_rows(sub, cand)))
                    shown = (low[cand][:, look] < vals[cand][:, look]).any(1)
                    open_rows = cand[~shown]
                    if other.numel() and open_rows.numel():
                        low[open_rows[:, None], other] = torch.minimum(vals[open_rows][:, other],
                                                                       others_floor(eps[ix][other], take_rows(sub, open_rows)))
                    helps = cand[(low[cand] < vals[cand]).any(1)]
                    if helps.numel():
                        later.append((sub, ix, members, batch, helps, up5, [tops[members[j]] for j in helps.tolist()]))
                    if other.numel() and bool(shown.any()):
                        pending.append((sub, ix, members, batch, cand[shown], other, low))
            for j, v, lo in zip(members, vals.numpy(), low.numpy()):
                skip[batch[j]] = _chord_fill(v, ix, eps_np)
                floor[batch[j]] = _chord_fill(lo, ix, eps_np)

    def total(prof, step=1):
        return compose_profiles([(np.max([prof[k] for k in r], axis=0)[::step], c) for r, c in counts.items() if r],
                                gap=gap * step, delta_target=delta_target)

    # A quick look on every 4th point first (4x coarser PLDs, from 128 points): where the floor is
    # far below even there, eq. (1) plainly helps and two full-size compositions are spared.
    far = bool(later) and n >= 128 and not total(floor, 4) >= (1 - 10 * slack) * total(skip, 4)
    eps_skip = math.nan if far else total(skip)
    if later and not far:  # the full look reads the floor at every point: the points left out above
        for sub, ix, members, batch, rows, other, low in pending:
            low[rows[:, None], other] = torch.minimum(low[rows][:, other], others_floor(eps[ix][other], take_rows(sub, rows)))
            for j in rows.tolist():
                floor[batch[members[j]]] = _chord_fill(low[j].numpy(), ix, eps_np)
    screened = bool(later)
    if later and (far or not total(floor) >= (1 - slack) * eps_skip):
        screened = False
        for sub, ix, members, batch, helps, up5, own in later:
            # Each row's eq. (1) up to its own reach (its group's points reach the group's largest).
            limit = torch.as_tensor(np.searchsorted(ix, own, side="right"))
            vals = round_profile(eps[ix], take_rows(sub, helps), grid=grid, probe_delta=delta_target / T,
                                 stride=others_stride, upper=up5[helps], limit=limit if OWN_REACH else None)
            for j, v in zip(helps.tolist(), vals.numpy()):
                skip[batch[members[j]]] = _chord_fill(v, ix, eps_np)
        eps_skip = total(skip)
    return {"epsilon": eps_skip, "gap": gap, "points": n, "screened": screened, **info}
