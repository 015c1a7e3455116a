r"""Rows of the ``exact`` accountant over a run: each round's rows as hashable, rounded keys.

A run's rounds are turned into *rows* (one per noise group of users the adversary might
attack, as in :mod:`otafl.privacy.analysis.ota_rows`), each described by a hashable key.
Quantities that change between rounds are rounded first, in the direction that can only
increase the leakage (:mod:`otafl.privacy.analysis.round_grid`; docs/privacy/exact.md#exact-caching):
the channel noise N0 / c_t^2 down, a local row's own p up; the others' participation
probabilities are never rounded. :mod:`otafl.privacy.accountants.exact_run` computes each
distinct key once (per-round epsilons and PLD totals).

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

from otafl.privacy.analysis.concentration import cached_poisson_binomial_pmf, prefetch_poisson_binomial_pmfs
from otafl.privacy.analysis.count_law import (
    CountLaw,
    binomial_count_law,
    local_count_law,
    pmf_count_law,
    pmf_count_laws,
    stack_laws,
)
from otafl.privacy.analysis.ota_round import RoundSpec
from otafl.privacy.analysis.round_grid import round_probability_up, round_variance_down
from otafl.privacy.facts import RoundFacts

__all__ = ["Resolution", "DEFAULT_RESOLUTION", "NO_ROUNDING", "round_row_keys", "run_row_keys"]

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
NO_ROUNDING = Resolution(0.0, 0.0)


def _pmf(law_key: tuple) -> torch.Tensor:
    """The Poisson-binomial pmf of a ("pb", others' p) key [1, K + 1] (cached: several tails use it)."""
    return cached_poisson_binomial_pmf(law_key[1])


_LAWS: OrderedDict = OrderedDict()
_LAWS_SIZE = 4096


def _law(law_key: tuple, tail: float) -> CountLaw:
    """The law of the others' count for a law key (cached; identical to ota_rows' laws)."""
    return _laws([law_key], tail)[0]


def _laws(law_keys: Sequence[tuple], tail: float) -> list[CountLaw]:
    """:func:`_law` of each key (an LRU of :data:`_LAWS_SIZE` laws): the Poisson-binomial laws
    not cached yet windowed together (:func:`pmf_count_laws`), one batch per number of users,
    instead of one small windowing per key (a channel-aware run has a law per round)."""
    got: dict = {}
    for k in law_keys:
        if (k, tail) in _LAWS:
            _LAWS.move_to_end((k, tail))
            got[k] = _LAWS[k, tail]
    new: dict = {}
    todo: dict[int, list] = {}
    for k in dict.fromkeys(k for k in law_keys if k not in got):
        if k[0] == "pb":
            todo.setdefault(len(k[1]), []).append(k)
        else:
            new[k] = _one_law(k, tail)
    for keys in todo.values():
        new.update(zip(keys, pmf_count_laws(torch.cat([_pmf(k) for k in keys]), tail_mass=tail,
                                            exact_window=EXACT_WINDOW)))
    got.update(new)
    for k, law in new.items():
        _LAWS[k, tail] = law
    while len(_LAWS) > _LAWS_SIZE:
        _LAWS.popitem(last=False)
    return [got[k] for k in law_keys]


def clear_laws() -> None:
    """Forget the cached laws (:func:`_laws`)."""
    _LAWS.clear()


def _one_law(law_key: tuple, tail: float) -> CountLaw:
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


def round_row_keys(f: RoundFacts, kind: str, resolution: Resolution = DEFAULT_RESOLUTION, arrays=None) -> tuple:
    """The rows of one round as hashable keys (rounded as ``resolution`` says).

    Central key: ``("c", p_own, sigma_own^2, sigma_o^2, ch, a, dim, law_key, total_ok)`` with
    ``law_key`` ``("none",)``, ``("binom", n_others, p)`` or ``("pb", others' p)`` and
    ``total_ok`` whether eq. (5) holds (:class:`~otafl.privacy.analysis.ota_round.RoundSpec`); the
    channel noise ch is rounded down on the grid of ch + sigma_o^2 n_lo (n_lo the smallest
    count in the others' window at tail 1e-12, so every variance of the bound moves by at
    most the resolution). Local key: ``("l", p, sigma^2, ch, a, dim)``, p rounded up and ch
    rounded down. No row when nobody can take part, or when the channel noise is infinite
    (c_t = 0 with N0 > 0: nothing is received). ``arrays``: the round's :func:`_arrays`, when
    the caller has them.
    """
    p, s2 = _arrays(f) if arrays is None else arrays
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
    unique = {id(f): f for f in facts}  # a facts object repeated over rounds is keyed once
    arrays = {i: _arrays(f) for i, f in unique.items()}  # each round's (p, sigma^2), for every use below
    res = Resolution(resolution.channel if len(chs) > 1 else 0.0, 0.0)
    if kind == "local" and resolution.probability > 0:
        ps = set()
        for p, s2 in arrays.values():
            if (p > 0).any():
                ps.update(pk for pk, _ in _rows_of(p, s2, "local"))
        if len(ps) > 1:
            res = Resolution(res.channel, resolution.probability)
    if kind == "central":
        # The others' Poisson-binomial pmfs of the whole run in a few batched recursions
        # (heterogeneous rounds; uniform ones have binomial laws and skip this).
        keys = []
        for p, s2 in arrays.values():
            if (p > 0).any() and not _uniform(p, s2):
                keys.extend(k for *_, k, _ in _central_groups(p, s2) if k[0] == "pb")
        prefetch_poisson_binomial_pmfs([k[1] for k in keys])
        _laws(keys, _FLOOR_TAIL)  # the laws whose smallest count keys the channel grid, windowed together
    keyed = {i: round_row_keys(f, kind, res, arrays[i]) for i, f in unique.items()}
    return [keyed[id(f)] for f in facts]


def _spec(keys: Sequence[tuple], tail: float) -> RoundSpec:
    """One RoundSpec for keys of one kind and one dimension."""
    t = lambda i: torch.tensor([k[i] for k in keys], dtype=_DT)  # noqa: E731
    if keys[0][0] == "c":
        return RoundSpec(participation_prob=t(1), own_noise_var=t(2), others_noise_var=t(3),
                         channel_noise_var=t(4), half_sensitivity=t(5),
                         law=stack_laws(_laws([k[7] for k in keys], tail)), dim=keys[0][6],
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
