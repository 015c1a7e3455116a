r"""The ``exact`` accountant over a whole run: rounded, cached rounds and PLD totals.

A run's rounds are turned into *rows* (one per noise group of users the adversary might
attack, as in :mod:`otafl.privacy.analysis.ota_rows`), each described by a hashable key.
Quantities that change between rounds are rounded first, in the direction that can only
increase the leakage (:mod:`otafl.privacy.analysis.round_grid`; docs/privacy/exact.md#exact-caching):
the channel noise N0 / c_t^2 down, a local row's own p up; the others' participation
probabilities are never rounded. Rows with equal keys are computed once:

- :func:`row_epsilons`: each distinct row's epsilon at its target delta, batched, kept in
  a module-level LRU (across runs);
- :func:`compose_exact_rounds`: the run's total epsilon by privacy-loss distributions,
  each distinct round (its rows' pointwise-maximum profile) composed with its
  multiplicity (:mod:`otafl.privacy.analysis.pld`). ``otafl audit --rounds`` and
  :func:`~otafl.privacy.accountants.run.account_run` both call it, so they agree.

Central rows: users are grouped by their own sigma_k^2 (among users with p_k > 0); a group
is charged its largest p and the law of the others without that user (which covers every
member, docs/privacy/exact.md#exact-heterogeneous-users). Local rows: n = 0, one per noise group,
charged the group's largest p at target p delta_l (delta / p is non-decreasing in p, so that
row's epsilon covers every member, and its profile dominates every member's pointwise).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch

from otafl.privacy.analysis.cells import CellGrid
from otafl.privacy.analysis.concentration import (
    cached_poisson_binomial_pmf,
    clear_poisson_binomial_cache,
    prefetch_poisson_binomial_pmfs,
)
from otafl.privacy.analysis.count_law import (
    CountLaw,
    binomial_count_law,
    local_count_law,
    pmf_count_law,
    stack_laws,
    total_count_law,
)
from otafl.privacy.analysis.ota_round import RoundSpec, round_epsilon, take_rows
from otafl.privacy.analysis.round_grid import round_probability_up, round_variance_down
from otafl.privacy.facts import RoundFacts

__all__ = ["Resolution", "DEFAULT_RESOLUTION", "NO_ROUNDING", "round_row_keys", "run_row_keys", "row_epsilons",
           "exact_round_epsilons", "compose_exact_rounds", "clear_caches"]

_DT = torch.float64
_FLOOR_TAIL = 1e-12  # tail of the others' law whose smallest count sets the channel grid's floor
EXACT_WINDOW = 8192
"""A law of the others' count whose window holds at most this many counts is kept exact, not
lumped into blocks: a lumped law has no total-count view, so eq. (5) (one-dimensional, and
the tighter bound at large K) would be lost and every round would need eq. (1)'s
d-dimensional cells. The window is about 16 standard deviations of n wide: exact up to
K p (1 - p) of about 2.6e5 (K = 10^6 at p = 0.5 lumps)."""


@dataclass(frozen=True)
class Resolution:
    """Relative steps of the pessimistic grids (0 = no rounding).

    ``channel``: N0 / c_t^2 is rounded down on a geometric grid of ratio 1 + channel (in
    ch + floor, see :func:`~otafl.privacy.analysis.round_grid.round_variance_down`);
    ``probability``: a local row's own p is rounded up on a geometric grid of ratio
    1 + probability. At the defaults a round's epsilon grows by at most ~0.9 % (checked in
    tests/test_privacy_exact_run.py), and the rounds of a paper-preset run fall into a few
    dozen central and a few hundred local cells.
    """

    channel: float = 0.01
    probability: float = 0.005


DEFAULT_RESOLUTION = Resolution()
OTHERS_STRIDE = 1
"""Eq. (1) (d-dimensional cells, the costly bound) at every ``OTHERS_STRIDE``-th of a row's PLD
sample points, chords in e^eps between (sound: the profile is convex in e^eps). 1: every
point. Measured (issue 31): 4 saves 2.3x of the profile time on the Table II(a) run
(p = 0.5, 1000 rounds) for +0.12 % local and +0.00002 % central, but costs +1.2 % central
and +2.3 % local on small random heterogeneous rounds at d = 30, over the 0.5 % allowed;
refining where the chords undercut eq. (5) gives every point's totals back but not the time."""
NO_ROUNDING = Resolution(0.0, 0.0)
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
QUIET_SHARE = 0.1
"""Share of a run's rounds (the quietest, by reach) that :func:`compose_exact_rounds` does not
size its grid for: they get a coarser, still pessimistic, PLD. Measured (issue 31; figures in
docs/privacy/composition.md#pld-composition): the paper preset's 1000-round run 2.99 -> 2.13 ms
a round for totals +0.03 % central, +0.04 % local; nine runs within -0.11 % ... +0.07 %."""


# ---------------------------------------------------------------- row keys


def _pmf(law_key: tuple) -> torch.Tensor:
    """The Poisson-binomial pmf of a ("pb", others' p) key [1, K + 1] (cached: several tails use it)."""
    return cached_poisson_binomial_pmf(law_key[1])


@lru_cache(maxsize=4096)
def _law(law_key: tuple, tail: float) -> CountLaw:
    """The law of the others' count for a law key (cached; identical to ota_rows' laws)."""
    kind = law_key[0]
    if kind == "none":
        return local_count_law(1)
    if kind == "binom":
        return binomial_count_law(torch.tensor([law_key[2]], dtype=_DT), law_key[1], tail_mass=tail,
                                  exact_window=EXACT_WINDOW)
    return pmf_count_law(_pmf(law_key), tail_mass=tail, exact_window=EXACT_WINDOW)


def _channel_noise(f: RoundFacts) -> float:
    c = float(f.alignment_gain)
    if f.n0 == 0:
        return 0.0
    return math.inf if c == 0 else float(f.n0) / (c * c)


def _arrays(f: RoundFacts):
    """A round's participation probabilities and noise variances as float64 numpy arrays [K]."""
    import numpy as np

    p = np.ascontiguousarray(torch.as_tensor(f.participation_prob).detach().cpu().reshape(-1).numpy(),
                             dtype=np.float64)
    s2 = np.ascontiguousarray(np.broadcast_to(torch.as_tensor(f.noise_var).detach().cpu().reshape(-1).numpy(),
                                              p.shape), dtype=np.float64)
    return p, s2


def _uniform(p, s2) -> bool:
    """Whether every user of a round has the same p and sigma^2 (the arrays of :func:`_arrays`)."""
    return bool(p.size) and bool((p == p[0]).all()) and bool((s2 == s2[0]).all())


def _rows_of(p, s2, kind: str) -> tuple:
    """:func:`_sampling_rows` of the arrays, keyed by (K, p, sigma^2) where every user has the
    same p and sigma^2 (a uniform round: no K-long bytes to hash per round), else by the bytes."""
    if _uniform(p, s2):
        return _sampling_rows(("uniform", int(p.size), float(p[0]), float(s2[0])), None, kind)
    return _sampling_rows(p.tobytes(), s2.tobytes(), kind)


@lru_cache(maxsize=64)
def _sampling_rows(p_bytes, s2_bytes, kind: str) -> tuple:
    """The round's rows as far as the sampling decides them (cached by the raw bytes, or by
    ``("uniform", K, p, sigma^2)`` in ``p_bytes`` for a uniform round).

    Central: (p_own, sigma_own^2, sigma_o^2, law_key, smallest n of the law's window,
    whether eq. (5) holds: every other user who can take part adds exactly sigma_o^2);
    local: (largest p of the noise group, sigma^2).
    """
    import numpy as np

    if isinstance(p_bytes, tuple):
        _, K, p0, v0 = p_bytes
        p, s2 = np.full(K, p0), np.full(K, v0)
    else:
        p, s2 = np.frombuffer(p_bytes), np.frombuffer(s2_bytes)
    active = p > 0
    if kind == "local":
        return tuple((float(p[active & (s2 == v)].max()), float(v)) for v in np.unique(s2[active]).tolist())
    return tuple((pj, v, s_min, law_key, float(_law(law_key, _FLOOR_TAIL).n_first[0, 0]), total_ok)
                 for pj, v, s_min, law_key, total_ok in _central_groups(p, s2))


def _central_groups(p, s2) -> list:
    """Per noise group of the users who can take part: (its largest p, sigma^2, the others'
    smallest sigma^2, the law key of the others' count without that user, whether eq. (5)
    holds: every other user who can take part adds exactly that smallest sigma^2)."""
    import numpy as np

    active = p > 0
    s_min = float(s2[active].min())
    out = []
    for v in np.unique(s2[active]).tolist():
        members = np.nonzero(active & (s2 == v))[0]
        j = int(members[np.argmax(p[members])])
        others = np.concatenate([p[:j], p[j + 1:]])
        if others.size == 0:
            law_key: tuple = ("none",)
        elif bool((others == others[0]).all()):
            law_key = ("binom", int(others.size), float(others[0]))
        else:
            law_key = ("pb", tuple(others.tolist()))
        others_s2 = np.concatenate([s2[:j][active[:j]], s2[j + 1:][active[j + 1:]]])
        out.append((float(p[j]), float(v), s_min, law_key, bool((others_s2 == s_min).all())))
    return out


def round_row_keys(f: RoundFacts, kind: str, resolution: Resolution = DEFAULT_RESOLUTION) -> tuple:
    """The rows of one round as hashable keys (rounded as ``resolution`` says).

    Central key: ``("c", p_own, sigma_own^2, sigma_o^2, ch, a, dim, law_key, total_ok)`` with
    ``law_key`` ``("none",)``, ``("binom", n_others, p)`` or ``("pb", others' p)`` and
    ``total_ok`` whether eq. (5) holds (:class:`~otafl.privacy.analysis.ota_round.RoundSpec`); the
    channel noise ch is rounded down on the grid of ch + sigma_o^2 n_lo (n_lo the smallest
    count in the others' window at tail 1e-12, so every variance of the bound moves by at
    most the resolution). Local key: ``("l", p, sigma^2, ch, a, dim)``, p rounded up and ch
    rounded down. No row when nobody can take part, or when the channel noise is infinite
    (c_t = 0 with N0 > 0: nothing is received).
    """
    p, s2 = _arrays(f)
    ch = _channel_noise(f)
    if not bool((p > 0).any()) or math.isinf(ch):
        return ()
    a, dim = 0.5 * float(f.sensitivity), int(f.dim)
    rows = _rows_of(p, s2, kind)
    if kind == "local":
        ch_r = round_variance_down(ch, resolution=resolution.channel)
        return tuple(("l", round_probability_up(pk, resolution=resolution.probability), v, ch_r, a, dim)
                     for pk, v in rows)
    return tuple(("c", pk, v, s_min, round_variance_down(ch, floor=s_min * n_lo, resolution=resolution.channel),
                  a, dim, law_key, ok) for pk, v, s_min, law_key, n_lo, ok in rows)


def run_row_keys(facts: Sequence[RoundFacts], kind: str, resolution: Resolution = DEFAULT_RESOLUTION
                 ) -> list[tuple]:
    """:func:`round_row_keys` of every round, rounding only what varies over the rounds; rounds
    with a gain mismatch (estimated CSI) keyed as the perfect-CSI rounds that dominate them
    (:mod:`otafl.privacy.csi`, docs/privacy/csi.md), so every caller (run totals,
    :func:`exact_round_epsilons`, ``compose_exact``) reads the mismatch.

    A grid only pays where a quantity takes several values: the channel noise is rounded
    only if it is not the same in every round, a local row's p only if the local rows' p
    are not all equal. So identical rounds (``otafl audit --rounds``, or a run with N0 = 0
    and fixed sampling) are not rounded at all, and a run with fixed sampling keeps its p.
    The same facts object is keyed once.
    """
    from otafl.privacy.csi import exact_keys, has_mismatch, target_frame

    if has_mismatch(facts):
        return exact_keys(_run_row_keys([target_frame(f, scale_own=False) for f in facts], kind, resolution),
                          facts, kind)
    return _run_row_keys(facts, kind, resolution)


def _run_row_keys(facts: Sequence[RoundFacts], kind: str, resolution: Resolution) -> list[tuple]:
    chs = {_channel_noise(f) for f in facts}
    res = Resolution(resolution.channel if len(chs) > 1 else 0.0, 0.0)
    if kind == "local" and resolution.probability > 0:
        ps = set()
        for f in {id(f): f for f in facts}.values():
            p, s2 = _arrays(f)
            if (p > 0).any():
                ps.update(pk for pk, _ in _rows_of(p, s2, "local"))
        if len(ps) > 1:
            res = Resolution(res.channel, resolution.probability)
    if kind == "central":
        # The others' Poisson-binomial pmfs of the whole run in a few batched recursions
        # (heterogeneous rounds; uniform ones have binomial laws and skip this).
        keys = []
        for f in {id(f): f for f in facts}.values():
            p, s2 = _arrays(f)
            if (p > 0).any() and not _uniform(p, s2):
                keys.extend(k for *_, k, _ in _central_groups(p, s2) if k[0] == "pb")
        prefetch_poisson_binomial_pmfs([k[1] for k in keys])
    seen: dict[int, tuple] = {}
    return [seen.setdefault(id(f), round_row_keys(f, kind, res)) for f in facts]


def _spec(keys: Sequence[tuple], tail: float) -> RoundSpec:
    """One RoundSpec for keys of one kind and one dimension."""
    t = lambda i: torch.tensor([k[i] for k in keys], dtype=_DT)  # noqa: E731
    if keys[0][0] == "c":
        return RoundSpec(participation_prob=t(1), own_noise_var=t(2), others_noise_var=t(3),
                         channel_noise_var=t(4), half_sensitivity=t(5),
                         law=stack_laws([_law(k[7], tail) for k in keys]), dim=keys[0][6],
                         total_ok=torch.tensor([k[8] for k in keys], dtype=torch.bool))
    return RoundSpec(participation_prob=t(1), own_noise_var=t(2),
                     others_noise_var=torch.zeros(len(keys), dtype=_DT), channel_noise_var=t(3),
                     half_sensitivity=t(4), law=local_count_law(len(keys)), dim=keys[0][5])


def _batches(keys: Sequence[tuple], size: int = 256):
    """Keys grouped by (kind, dim), in batches of at most ``size``."""
    by: dict[tuple, list] = {}
    for k in keys:
        by.setdefault((k[0], k[6] if k[0] == "c" else k[5]), []).append(k)
    for group in by.values():
        for i in range(0, len(group), size):
            yield group[i:i + size]


# ---------------------------------------------------------------- per-round epsilon


_EPS_CACHE: OrderedDict = OrderedDict()
_EPS_CACHE_SIZE = 4096


def clear_caches() -> None:
    """Forget every cached row epsilon and count law (for timing the uncached path)."""
    _EPS_CACHE.clear()
    _law.cache_clear()
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


def _chord_fill(values: "np.ndarray", idx: "np.ndarray", eps: "np.ndarray") -> "np.ndarray":
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
    the total below the floor's total). Where the floor's total is within a relative
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
    skip, floor, later = {}, {}, []
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
                    low = vals.clone()
                    low[cand] = torch.minimum(vals[cand], others_floor(eps[ix], take_rows(sub, cand)))
                    helps = cand[(low[cand] < vals[cand]).any(1)]
                    if helps.numel():
                        later.append((sub, ix, members, batch, helps, up5))
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
    screened = bool(later)
    if later and (far or not total(floor) >= (1 - slack) * eps_skip):
        screened = False
        for sub, ix, members, batch, helps, up5 in later:
            vals = round_profile(eps[ix], take_rows(sub, helps), grid=grid, probe_delta=delta_target / T,
                                 stride=others_stride, upper=up5[helps])
            for j, v in zip(helps.tolist(), vals.numpy()):
                skip[batch[members[j]]] = _chord_fill(v, ix, eps_np)
        eps_skip = total(skip)
    return {"epsilon": eps_skip, "gap": gap, "points": n, "screened": screened, **info}
