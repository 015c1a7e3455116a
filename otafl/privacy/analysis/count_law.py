"""Laws of the number of participants that the ``exact`` accountant conditions on.

The leakage of user k in one round is bounded by conditioning on a data-independent
count (joint convexity of the hockey-stick divergence; docs/privacy/exact.md#exact):

- n, the number of *other* participants: :class:`CountLaw` (binomial for uniform p,
  Poisson-binomial otherwise, n = 0 for local DP), windowed to all but a tail mass that
  is charged to delta, and lumped into blocks of consecutive n only for very many users
  (safe: the conditional profile is non-increasing in n);
- m = n + 1{k takes part}, the *total* count: :class:`TotalLaw`.

All tensors are float64; batches are rows [B, ...].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from otafl.privacy.analysis.concentration import poisson_binomial_pmf

__all__ = [
    "CountLaw",
    "TotalLaw",
    "binomial_count_law",
    "poisson_binomial_count_law",
    "local_count_law",
    "lump_counts",
    "pmf_count_law",
    "total_count_law",
    "tail_blocks",
    "stack_laws",
]

_DT = torch.float64


@dataclass(frozen=True)
class CountLaw:
    """Blocks of the law of n (number of *other* participants), padded to a common width.

    Attributes
    ----------
    n_first, n_last : [B, N], float64. Block i covers n_first..n_last (inclusive).
    weight : [B, N], float64. P(n in block i); 0 on padding.
    dropped : [B], float64. Mass outside every block (added to delta as delta_n <= 1).
    """

    n_first: torch.Tensor
    n_last: torch.Tensor
    weight: torch.Tensor
    dropped: torch.Tensor


def _law_from_windows(starts: list[int], windows: list[torch.Tensor], dropped: torch.Tensor,
                      block_rel_width: float, exact_window: int = 0) -> CountLaw:
    """CountLaw from per-row windows: row b has P(n = starts[b] + i) = windows[b][i].

    Inside a window n is exact up to n = 1 / block_rel_width; beyond, consecutive n are
    lumped into blocks of width floor(block_rel_width * n) (safe by monotonicity in n),
    unless the window holds at most ``exact_window`` counts (then it stays exact: a law
    with blocks has no total-count view, eq. (5)).
    """
    dev = dropped.device
    rows = []
    for lb, pw in zip(starts, windows):
        hb = lb + len(pw) - 1
        if block_rel_width * hb < 1.0 or len(pw) <= exact_window:
            n = torch.arange(lb, hb + 1, dtype=_DT, device=dev)
            rows.append((n, n, pw))
            continue
        firsts = []
        n = lb
        while n <= hb:
            firsts.append(n)
            n += max(1, int(block_rel_width * n))
        first = torch.tensor(firsts, dtype=torch.long, device=dev)
        last = torch.cat([first[1:] - 1, first.new_tensor([hb])])
        block = torch.searchsorted(first, torch.arange(lb, hb + 1, device=dev), right=True) - 1
        weight = pw.new_zeros(len(firsts)).index_add_(0, block, pw)
        rows.append((first.to(_DT), last.to(_DT), weight))
    N = max(len(r[0]) for r in rows)

    def pad(t, val):
        return torch.cat([t, t.new_full((N - len(t),), val)])

    return CountLaw(n_first=torch.stack([pad(r[0], float(r[0][-1])) for r in rows]),
                    n_last=torch.stack([pad(r[1], float(r[1][-1])) for r in rows]),
                    weight=torch.stack([pad(r[2].clamp(min=0.0), 0.0) for r in rows]),
                    dropped=dropped.clamp(min=0.0))


def _blocks_from_pmf(pmf: torch.Tensor, tail_mass, block_rel_width: float, exact_window: int = 0) -> CountLaw:
    """Window each row of ``pmf`` [B, M] to all but ``tail_mass`` and lump into blocks.

    The window of row b is [lo_b, hi_b] with P(n < lo_b) <= tail_mass / 2 and
    P(n > hi_b) <= tail_mass / 2 (tails summed from their own ends, so small masses stay
    exact). ``tail_mass`` is a float or a [B] tensor.
    """
    return _law_from_windows(*_windows(pmf, tail_mass), block_rel_width, exact_window)


def _windows(pmf: torch.Tensor, tail_mass) -> tuple[list, list, torch.Tensor]:
    """The windows of :func:`_blocks_from_pmf`: (starts, windows, dropped mass [B])."""
    B, M = pmf.shape
    dev = pmf.device
    tm = torch.as_tensor(tail_mass, dtype=_DT, device=dev).expand(B)[:, None] / 2
    cdf = torch.cumsum(pmf, -1)  # P(n <= i), accurate in the lower tail
    sf = torch.flip(torch.cumsum(torch.flip(pmf, [-1]), -1), [-1])  # P(n >= i), upper tail
    ar = torch.arange(M, device=dev)
    lo = torch.where(cdf > tm, ar, M).amin(-1).clamp(max=M - 1)
    hi = torch.where(sf > tm, ar, -1).amax(-1).clamp(min=0)
    lo, hi = torch.minimum(lo, hi), torch.maximum(lo, hi)
    zero = pmf.new_zeros(B)
    below = torch.where(lo > 0, cdf.gather(1, (lo - 1).clamp(min=0)[:, None])[:, 0], zero)
    above = torch.where(hi + 1 < M, sf.gather(1, (hi + 1).clamp(max=M - 1)[:, None])[:, 0], zero)
    starts = lo.tolist()
    windows = [pmf[b, lb:hb + 1] for b, (lb, hb) in enumerate(zip(starts, hi.tolist()))]
    return starts, windows, below + above


def binomial_count_law(participation_prob: torch.Tensor, num_others, *,
                       tail_mass=1e-12, block_rel_width: float = 1e-3, exact_window: int = 0) -> CountLaw:
    """Law of n ~ Binomial(num_others, p) for uniform participation, without users.

    Only the window [ppf(tail/2), isf(tail/2)] is materialised; its pmf and the two tail
    masses come from scipy's binomial distribution (Boost's accurate pmf and incomplete
    beta), so K = 10^6 users costs a window of ~10^4 counts, not 10^6.

    Parameters
    ----------
    participation_prob : [B], float, p in [0, 1].
    num_others : int or [B] integer tensor, K - 1 >= 0.
    tail_mass : float or [B]: mass the window may leave out (it is added to delta).
    block_rel_width : blocks n..n + floor(rel n) are lumped (exact below n = 1 / rel).
    exact_window : a window of at most this many counts is never lumped.
    """
    import warnings

    import numpy as np
    from scipy.stats import binom

    p = torch.as_tensor(participation_prob, dtype=_DT).reshape(-1)
    dev = p.device
    B = p.shape[0]
    N = torch.as_tensor(num_others, dtype=_DT).reshape(-1).expand(B).cpu().numpy().astype(np.int64)
    tm = torch.as_tensor(tail_mass, dtype=_DT).reshape(-1).expand(B).cpu().numpy()
    pn = p.cpu().numpy()
    with warnings.catch_warnings():  # Boost's "Unable to bracket root" at tiny p (issue 32): its nearest
        warnings.simplefilter("ignore", RuntimeWarning)  # value is kept, the tails below/above are exact anyway
        lo = np.maximum(np.nan_to_num(binom.ppf(tm / 2, N, pn), nan=0.0), 0).astype(np.int64)
        hi = np.minimum(np.nan_to_num(binom.isf(tm / 2, N, pn), nan=N.astype(float)), N).astype(np.int64)
    hi = np.maximum(hi, lo)
    below = np.where(lo > 0, binom.cdf(lo - 1, N, pn), 0.0)
    above = np.where(hi < N, binom.sf(hi, N, pn), 0.0)
    windows = [torch.as_tensor(binom.pmf(np.arange(lb, hb + 1), n, q), dtype=_DT, device=dev)
               for lb, hb, n, q in zip(lo, hi, N, pn)]
    return _law_from_windows(lo.tolist(), windows,
                             torch.as_tensor(below + above, dtype=_DT, device=dev), block_rel_width, exact_window)


def poisson_binomial_count_law(others_prob: torch.Tensor, *, tail_mass: float = 1e-12,
                               block_rel_width: float = 1e-3) -> CountLaw:
    """Law of n = sum of independent Bernoulli(others_prob) (exact Poisson-binomial).

    Parameters
    ----------
    others_prob : [B, K - 1], float, participation probabilities of the other users.
    """
    q = torch.as_tensor(others_prob, dtype=_DT)
    if q.dim() == 1:
        q = q[None]
    return _blocks_from_pmf(poisson_binomial_pmf(q), tail_mass, block_rel_width)


def pmf_count_law(pmf: torch.Tensor, *, tail_mass: float = 1e-12, block_rel_width: float = 1e-3,
                  exact_window: int = 0) -> CountLaw:
    """CountLaw of a given pmf [B, M] of n (as :func:`poisson_binomial_count_law` does with its pmf)."""
    return _blocks_from_pmf(torch.as_tensor(pmf, dtype=_DT).reshape(-1, pmf.shape[-1]), tail_mass, block_rel_width,
                            exact_window)


def pmf_count_laws(pmf: torch.Tensor, *, tail_mass: float = 1e-12, block_rel_width: float = 1e-3,
                   exact_window: int = 0) -> list[CountLaw]:
    """:func:`pmf_count_law` of each row of ``pmf`` [B, M] on its own (each law as wide as its
    own window), the windows found for all rows at once."""
    starts, windows, dropped = _windows(torch.as_tensor(pmf, dtype=_DT).reshape(-1, pmf.shape[-1]), tail_mass)
    return [_law_from_windows([s], [w], dropped[i:i + 1], block_rel_width, exact_window)
            for i, (s, w) in enumerate(zip(starts, windows))]


def lump_counts(law: CountLaw, width: int) -> CountLaw:
    """Merge each ``width`` consecutive blocks of a one-row law into one block.

    Safe for eq. (1) (the conditional profile is non-increasing in n, and a block is
    charged at its smallest n); not for the total count m of eq. (5).
    """
    if width <= 1 or law.weight.shape[1] <= 1:
        return law
    N = law.weight.shape[1]
    starts = torch.arange(0, N, width, device=law.weight.device)
    ends = (starts + width - 1).clamp(max=N - 1)
    group = torch.arange(N, device=law.weight.device) // width
    weight = law.weight.new_zeros(law.weight.shape[0], len(starts)).index_add_(1, group, law.weight)
    return CountLaw(n_first=law.n_first[:, starts], n_last=law.n_last[:, ends], weight=weight,
                    dropped=law.dropped)


def local_count_law(batch: int, device=None) -> CountLaw:
    """n = 0 with probability one (local DP: the others may collude with the server)."""
    z = torch.zeros(batch, 1, dtype=_DT, device=device)
    return CountLaw(n_first=z, n_last=z, weight=torch.ones_like(z),
                    dropped=torch.zeros(batch, dtype=_DT, device=device))


def stack_laws(laws: list[CountLaw]) -> CountLaw:
    """Concatenate CountLaws along B, padding N with zero-weight copies of the last block."""
    N = max(law.weight.shape[1] for law in laws)

    def pad(t, fill_last):
        if t.shape[1] == N:
            return t
        extra = t[:, -1:].expand(-1, N - t.shape[1]) if fill_last else \
            t.new_zeros(t.shape[0], N - t.shape[1])
        return torch.cat([t, extra], 1)

    return CountLaw(n_first=torch.cat([pad(l.n_first, True) for l in laws]),
                    n_last=torch.cat([pad(l.n_last, True) for l in laws]),
                    weight=torch.cat([pad(l.weight, False) for l in laws]),
                    dropped=torch.cat([l.dropped for l in laws]))


@dataclass(frozen=True)
class TotalLaw:
    """The round seen through the *total* count m = n + 1{k takes part} (eq. (5) of
    :mod:`otafl.privacy.analysis.ota_round`).

    Attributes ([B, M], float64): ``m`` counts, ``weight`` P(m), ``share`` pi_m =
    P(k takes part | m); ``dropped`` [B] the mass outside (added to delta).
    """

    m: torch.Tensor
    weight: torch.Tensor
    share: torch.Tensor
    dropped: torch.Tensor


TAIL_BLOCK_MASS = 1e-6
"""Counts of the total count's law in its tails (mass at most this beyond and including them,
on either side) are merged into blocks of :data:`TAIL_BLOCK_WIDTH` (:func:`total_count_law`).
Measured (issue 31): about 40 % fewer terms of eq. (5) at K = 200 (its profiles of a
channel-aware Table II(a) run's central total 5.5 -> 2.7 s); the central ``exact`` totals of
the paper preset's 1000-round run +0.00005 %, its p = 0.1 run's +0.003 %, the channel-aware
run's +0.00002 %."""
TAIL_BLOCK_WIDTH = 16
"""Counts per block in the tails of the total count's law (:data:`TAIL_BLOCK_MASS`)."""
TOTAL_LUMP = 1e-3
"""Relative width of the blocks of the total count's law (:func:`total_count_law`): blocks
of ``floor(TOTAL_LUMP * m)`` consecutive counts (from m about 2000 on, K about 4000 at
p = 0.5; none at the paper preset's K = 200)."""


def total_count_law(law: CountLaw, participation_prob: torch.Tensor, lump: float | None = None) -> TotalLaw | None:
    r"""Law of the total count m = n + 1{k takes part} and P(k in | m), from the others' window.

        P(m) = (1 - p) P_o(m) + p P_o(m - 1),   pi_m = p P_o(m - 1) / P(m),

    P_o the law of the others (``law``), p = ``participation_prob`` [B] of user k. Only
    outcomes with n in the window [lo, hi] enter (m in [lo, hi + 1]; at m = lo only
    "k absent" is in the window, pi = 0; at m = hi + 1 only "k present", pi = 1); the rest
    is the law's dropped mass. None when the law lumps blocks (or is empty).

    With ``lump`` > 0 (None: :data:`TOTAL_LUMP`), consecutive m (all but the first and last) are merged into blocks of
    width floor(lump * smallest m) when that is at least 2, each block carried by its
    smallest m (the least noise, w_m = m sigma_o^2 + ch) with its largest pi_m and its total
    weight. Sound for eq. (5): its term h_m(pi) is non-decreasing in pi (convex, h(0) = 0)
    and non-increasing in w_m at a fixed extra variance (more noise on both branches is a
    post-processing), so the block's term is at least each member's. Every variance of the
    bound moves by at most a relative ``lump`` and pi by about as much (pi_m is about m / K).
    """
    if not torch.equal(law.n_first, law.n_last) or law.n_first.shape[1] < 1:
        return None
    p = participation_prob.to(_DT)[:, None]
    wt = law.weight  # P_o(lo + j), j = 0..N-1 (zero on padding)
    zero = wt.new_zeros(wt.shape[0], 1)
    absent = (1 - p) * torch.cat([wt, zero], 1)   # k absent, n = m
    present = p * torch.cat([zero, wt], 1)        # k present, n = m - 1
    weight = absent + present
    share = torch.where(weight > 0, present / weight.clamp(min=1e-300), torch.zeros_like(weight))
    m = law.n_first[:, :1] + torch.arange(wt.shape[1] + 1, dtype=_DT, device=wt.device)
    total = TotalLaw(m=m, weight=weight, share=share, dropped=law.dropped.clamp(max=1.0))
    lump = TOTAL_LUMP if lump is None else lump
    width = int(lump * float(m[:, 0].min())) if lump > 0 and m.shape[0] else 0
    M = m.shape[1]
    if width >= 2 and M > 2 + width:
        # Blocks of the inner counts 1..M-2; the first and last m stay single (pi = 0 and 1).
        inner = torch.arange(1, M - 1, device=wt.device)
        group = torch.cat([torch.zeros(1, dtype=torch.long, device=wt.device), 1 + (inner - 1) // width,
                           torch.tensor([2 + (M - 3) // width], device=wt.device)])
        total = _merge_blocks(total, group.expand_as(weight))
    return tail_blocks(total)


def _merge_blocks(total: TotalLaw, group: torch.Tensor) -> TotalLaw:
    """``total`` with the counts of each row merged by ``group`` [B, M] (block indices,
    non-decreasing along a row, from 0): each block carried by its smallest m with its largest
    pi_m and its total weight (sound for eq. (5): its term is non-decreasing in pi and
    non-increasing in w_m). A row with fewer blocks than the longest gets zero-weight blocks
    at its last count."""
    B, G = group.shape[0], int(group.max()) + 1
    w = total.weight
    weight = w.new_zeros(B, G).scatter_add_(1, group, w)
    share = w.new_zeros(B, G).scatter_reduce_(1, group, total.share, reduce="amax")
    m = total.m[:, -1:].expand(B, G).clone().scatter_reduce_(1, group, total.m, reduce="amin")
    return TotalLaw(m=m, weight=weight, share=share, dropped=total.dropped)


def tail_blocks(total: TotalLaw, mass: float | None = None, width: int | None = None) -> TotalLaw:
    """``total`` with the counts of its two tails merged into blocks of ``width`` consecutive counts.

    A count is in a tail when the law's mass at and beyond it, on its side, is at most
    ``mass``, and 0 < pi_m < 1 (the counts at pi_m = 0 and 1, at the window's ends, stay
    single; zero-weight padding joins the count before it). Blocks are counted outwards from
    where each tail begins; each is carried, as :func:`total_count_law`'s blocks, by its smallest
    m with its largest pi_m and its total weight (:func:`_merge_blocks`). So the tails, where the terms are many and their weights
    tiny, cost a few terms of eq. (5) each instead of one per count. ``mass`` / ``width``:
    None for :data:`TAIL_BLOCK_MASS` / :data:`TAIL_BLOCK_WIDTH`; ``mass`` <= 0 or ``width``
    < 2: unchanged.
    """
    mass = TAIL_BLOCK_MASS if mass is None else mass
    width = TAIL_BLOCK_WIDTH if width is None else width
    w = total.weight
    B, M = w.shape
    if mass <= 0 or width < 2 or M < 4:
        return total
    j = torch.arange(M, device=w.device).expand(B, M)
    inner = (w > 0) & (total.share > 0) & (total.share < 1)
    left = inner & (torch.cumsum(w, 1) <= mass)
    right = inner & ~left & (torch.flip(torch.cumsum(torch.flip(w, [1]), 1), [1]) <= mass)
    if not bool((left | right).any()):
        return total
    l_end = torch.where(left, j, torch.full_like(j, -1)).max(1, keepdim=True).values
    r_start = torch.where(right, j, torch.full_like(j, M)).min(1, keepdim=True).values
    # Labels, non-decreasing along a row: a block's is its count nearest the middle, any other
    # count's its own index; a zero-weight count (the padding of a shorter row's window) joins
    # the count before it (it adds nothing, and the block keeps its m and pi).
    label = torch.where(left, l_end - (l_end - j) // width * width,
                        torch.where(right, r_start + (j - r_start) // width * width, j))
    label = torch.where(w > 0, label, torch.full_like(label, -1)).cummax(1).values.clamp(min=0)
    start = torch.ones_like(left)
    start[:, 1:] = label[:, 1:] != label[:, :-1]
    return _merge_blocks(total, torch.cumsum(start.to(torch.long), 1) - 1)
