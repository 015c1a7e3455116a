r"""Dense composition of pessimistic privacy-loss distributions (dp_accounting's, vectorised).

The same operations as dp_accounting's ``DensePLDPmf`` (FFT self-composition and
composition, tails of mass 1e-15 per operation charged to the infinite loss, pessimistic
connect-the-dots PLDs on a fixed gap), with the Python loops replaced by array code:
truncation bounds as one matrix product, cut points by cumulative sums, the connect-the-dots
masses built as an array (dp_accounting goes through a dict per PLD), and the distinct
rounds composed in a tree of groups (:data:`GROUP` at a time by one batched FFT, then the
groups' results) instead of one after the other, so each FFT is about as long as its result
rather than the whole run's, and 1000 distinct rounds take ~70 FFT calls, not ~1000. Used by
:func:`otafl.privacy.analysis.pld.compose_profiles`.
"""

from __future__ import annotations

import math

__all__ = ["connect_dots_pmf", "round_pmfs", "lower_convex_envelopes", "dense_arrays", "compose_dense_counted"]


GROUP = 16
"""Pmfs composed at once (one batched FFT, :func:`_compose_group`) in each node of the tree of
:func:`compose_dense_counted`."""
SHORT_POWER = 16
"""Self-compositions of at most this many copies keep their whole support (no tail cut):
the Chernoff bounds' 40 log-MGFs over the pmf cost more than the at most 16x longer FFT they
save, and an uncut power is exact (its tail is still charged, pessimistically)."""


def connect_dots_pmf(gap: float, points: int, deltas):
    """dp_accounting's ``create_pmf_pessimistic_connect_dots_fixed_gap(gap, -points, points,
    deltas)`` as a ``DensePLDPmf`` (the same masses, without its dict round trip).

    ``deltas``: [2 points + 1] non-increasing values in [0, 1] at eps_i = i gap,
    i = -points..points (points >= 1)."""
    import numpy as np
    from dp_accounting.pld.pld_pmf import DensePLDPmf

    deltas = np.minimum.accumulate(np.asarray(deltas, dtype=np.float64))
    if deltas.min() < 0 or deltas.max() > 1:
        raise ValueError(f"deltas are not between 0 and 1: deltas={deltas}")
    return DensePLDPmf(gap, -points, _connect_dots_masses(gap, deltas), float(deltas[-1]), True)


def _connect_dots_masses(gap: float, deltas):
    """The connect-the-dots masses of non-increasing deltas [..., 2 points + 1] (the last axis),
    clipped at 0: dp_accounting's fixed-gap formula."""
    import numpy as np

    diffs = np.diff(deltas, axis=-1)
    probs = np.zeros_like(deltas)
    probs[..., 0] = 1 - deltas[..., 0] + diffs[..., 0] / math.expm1(gap)
    probs[..., 1:-1] = (diffs[..., 1:] - diffs[..., :-1] * math.exp(gap)) / math.expm1(gap)
    probs[..., -1] = diffs[..., -1] / math.expm1(-gap)
    return np.maximum(0.0, probs)


def lower_convex_envelopes(x, Y):
    """:func:`otafl.privacy.analysis.pld.lower_convex_envelope` of every row of ``Y`` [R, N] over
    the common increasing ``x`` [N], all rows at once: the same passes (every kept point on or
    above the segment between its kept neighbours dropped at once, until none is), then the
    chords between kept points as ``np.interp`` draws them, floored at the row's minimum."""
    import numpy as np

    R, N = Y.shape
    idx = np.arange(N)
    rows = np.arange(R)[:, None]
    keep = np.ones((R, N), dtype=bool)

    def neighbours(keep):  # per point, the nearest kept index at or before it, at or after it
        before = np.maximum.accumulate(np.where(keep, idx, -1), axis=1)
        after = np.minimum.accumulate(np.where(keep, idx, N)[:, ::-1], axis=1)[:, ::-1]
        return before, after

    while N > 2:
        before, after = neighbours(keep)
        a = np.full((R, N), -1)
        a[:, 1:] = before[:, :-1]
        c = np.full((R, N), N)
        c[:, :-1] = after[:, 1:]
        cand = keep & (a >= 0) & (c < N)
        if not cand.any():
            break
        a, c = np.where(cand, a, 0), np.where(cand, c, 0)
        ya, yc = Y[rows, a], Y[rows, c]
        above = cand & ((Y - ya) * (x[c] - x[a]) >= (yc - ya) * (x[None, :] - x[a]))
        if not above.any():
            break
        keep &= ~above
    a, c = neighbours(keep)
    ya, yc = Y[rows, a], Y[rows, c]
    with np.errstate(invalid="ignore", divide="ignore"):
        chord = (yc - ya) / (x[c] - x[a]) * (x[None, :] - x[a]) + ya
    return np.maximum(np.where(a == idx, Y, chord), Y.min(axis=1, keepdims=True))


def round_pmfs(profiles, gap: float, tail: float = 0.0) -> list:
    """The pessimistic connect-the-dots pmfs (``DensePLDPmf``) of symmetric rounds' profiles
    [R, points + 1] (upper bounds at eps_i = i gap), all rows at once: the running minimum,
    the greatest convex minorant in e^eps (:func:`lower_convex_envelopes`), delta(-eps_i) =
    1 - e^-eps_i + e^-eps_i delta(eps_i), and the masses of :func:`connect_dots_pmf`; with
    ``tail`` > 0 each cut as :func:`_trim` cuts (prefix and suffix of mass at most tail / 2,
    the prefix's mass onto the first kept loss, the suffix's to the infinite loss)."""
    import numpy as np
    from dp_accounting.pld.pld_pmf import DensePLDPmf

    pos = np.nan_to_num(np.asarray(profiles, dtype=np.float64), nan=1.0)  # an undefined value: the worst
    points = pos.shape[1] - 1
    e_np = gap * np.arange(points + 1)
    pos = np.minimum.accumulate(np.clip(pos, 0.0, 1.0), axis=1)
    pos = lower_convex_envelopes(np.exp(e_np), pos)
    neg = 1.0 - np.exp(-e_np) + np.exp(-e_np) * pos  # delta(-eps_i)
    # Rounding above can break monotonicity or [0, 1] by an ulp: the running minimum (of upper
    # bounds on a non-increasing profile: still an upper bound on it) and the clip mend it.
    deltas = np.minimum.accumulate(np.clip(np.concatenate([neg[:, ::-1], pos[:, 1:]], axis=1), 0.0, 1.0), axis=1)
    probs = _connect_dots_masses(gap, deltas)
    if not tail > 0:
        return [DensePLDPmf(gap, -points, row, float(last), True) for row, last in zip(probs, deltas[:, -1])]
    n = probs.shape[1]
    head = np.cumsum(probs, axis=1)
    back = np.cumsum(probs[:, ::-1], axis=1)
    over, over_back = head > tail / 2, back > tail / 2
    left = np.where(over.any(1), over.argmax(1), n)
    right = np.maximum(n - np.where(over_back.any(1), over_back.argmax(1), n), left + 1)
    out = []
    for row, last, lo, hi in zip(probs, deltas[:, -1].tolist(), left.tolist(), right.tolist()):
        kept = row[lo:hi].copy()
        kept[0] += float(np.sum(row[:lo]))
        out.append(DensePLDPmf(gap, -points + lo, kept, last + float(np.sum(row[hi:])), True))
    return out


def dense_arrays(pmf):
    """(losses [N], masses [N], infinity mass) of one direction of a dp_accounting PLD, from
    its dense pmf (dp_accounting has no public accessor for them)."""
    import numpy as np

    dense = pmf.to_dense_pmf()
    probs = np.asarray(dense._probs, dtype=np.float64)  # noqa: SLF001
    losses = (np.arange(probs.size) + dense._lower_loss) * dense._discretization  # noqa: SLF001
    return losses, probs, float(dense._infinity_mass)  # noqa: SLF001


def _self_convolve_bounds(probs, num_times: int, tail: float) -> tuple[int, int]:
    """dp_accounting's Chernoff truncation bounds of ``probs`` self-convolved ``num_times``
    times (``common.compute_self_convolve_bounds``: the same orders and formula), with the
    40 log-MGFs as one matrix product instead of one logsumexp call per order."""
    import numpy as np

    n = len(probs)
    upper, lower = (n - 1) * num_times, 0
    if tail == 0 or num_times <= SHORT_POWER:
        return lower, upper
    orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
    # |i * order| <= 20: the moment generating functions need no log-sum-exp shift.
    with np.errstate(divide="ignore"):
        log_mgfs = np.log(np.exp(np.arange(n)[:, None] * orders[None, :]).T @ np.asarray(probs, dtype=np.float64))
    for order, log_mgf in zip(orders.tolist(), log_mgfs.tolist()):
        bound = (num_times * log_mgf + math.log(2 / tail)) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, upper


def _self_compose_dense(pmf, num_times: int, tail: float = 1e-15):
    """``DensePLDPmf.self_compose`` (dp_accounting; FFT power, truncated tails charged to the
    infinite loss) with :func:`_self_convolve_bounds`."""
    import numpy as np
    from dp_accounting.pld.pld_pmf import DensePLDPmf
    from scipy import fft

    probs = pmf._probs  # noqa: SLF001
    lo, hi = _self_convolve_bounds(probs, num_times, tail)
    out_len = hi - lo + 1
    fast = fft.next_fast_len(max(out_len, len(probs)), real=True)
    with np.errstate(over="ignore", invalid="ignore"):
        # Real FFTs (the pmf is real): the same circular power as dp_accounting's complex
        # fft / ifft, at about half the cost.
        conv = fft.irfft(fft.rfft(probs, fast) ** num_times, fast)
    out = np.array(np.roll(conv, -lo)[:out_len])
    inf_prob = tail - math.expm1(num_times * math.log1p(-pmf._infinity_mass))  # noqa: SLF001
    return DensePLDPmf(pmf._discretization, pmf._lower_loss * num_times + lo, out, inf_prob,  # noqa: SLF001
                       pmf._pessimistic_estimate)  # noqa: SLF001


def compose_dense_counted(plds, tail: float = 1e-15, trimmed: bool = False):
    """The composition of symmetric PLDs (remove pmf only) given as (pld, count) pairs, on
    their dense pmfs: each self-composed ``count`` times (FFT power), then all composed in a
    tree of groups of :data:`GROUP` (:func:`_compose_group`: each FFT about as long as its
    result, where composing them one after the other made every FFT as long as the running
    total), each node cutting tails of at most ``tail`` to the pessimistic side as
    dp_accounting's operations do. Measured (issue 31): the five compositions of a channel-aware
    Table II(a) run's totals (1000 distinct central rounds) 2.3 s with pairs, 0.9 s in groups;
    the totals the same to 1e-9. ``trimmed``: the pmfs' tails are cut already (:func:`round_pmfs`).
    Returns a PrivacyLossDistribution or None."""
    import numpy as np
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    level = []
    with np.errstate(over="ignore"):
        for pld, count in plds:
            pmf = pld._pmf_remove.to_dense_pmf()  # noqa: SLF001
            pmf = pmf if trimmed else _trim(pmf, tail)
            level.append(_self_compose_dense(pmf, count, tail) if count > 1 else pmf)
        while len(level) > 1:
            level = [_compose_group(level[i:i + GROUP], tail) for i in range(0, len(level), GROUP)]
    return PrivacyLossDistribution(level[0]) if level else None


def _compose_group(pmfs, tail: float):
    """The composition of a few dense pmfs (one :data:`GROUP` of a tree level) by one batched real
    FFT: their spectra multiplied (no tail cut between them, so exact up to the FFTs' rounding),
    the result's tails cut once as :func:`_compose_dense` cuts a pair's (:func:`_cut`,
    pessimistic). Where a tree of pairs made one Python-level convolution per pair."""
    import numpy as np
    from scipy import fft

    if len(pmfs) == 1:
        return pmfs[0]
    if len(pmfs) == 2:
        return _compose_dense(pmfs[0], pmfs[1], tail)
    assert all(p._pessimistic_estimate for p in pmfs)  # noqa: SLF001 (connect-the-dots, pessimistic)
    sizes = [len(p._probs) for p in pmfs]  # noqa: SLF001
    out_len = sum(sizes) - len(pmfs) + 1
    fast = fft.next_fast_len(out_len, real=True)
    stack = np.zeros((len(pmfs), fast))
    for row, p in zip(stack, pmfs):
        row[:len(p._probs)] = p._probs  # noqa: SLF001
    probs = fft.irfft(np.prod(fft.rfft(stack, axis=1), axis=0), fast)[:out_len]
    inf_mass = -math.expm1(sum(math.log1p(-p._infinity_mass) for p in pmfs))  # noqa: SLF001
    lower = sum(p._lower_loss for p in pmfs)  # noqa: SLF001
    return _cut(probs, pmfs[0]._discretization, lower, inf_mass, tail, True)  # noqa: SLF001


def _cut(probs, discretization: float, lower_loss: int, infinity_mass: float, tail: float, pessimistic: bool):
    """The dense pmf of ``probs`` (losses from ``lower_loss`` times ``discretization``) with its
    longest prefix and suffix of mass at most ``tail / 2`` each cut, the prefix's mass added to
    the first kept loss and the suffix's to the infinite loss: dp_accounting's pessimistic
    truncation, with the cut points found by cumulative sums instead of its Python loop."""
    import numpy as np
    from dp_accounting.pld.pld_pmf import DensePLDPmf

    half = tail / 2

    def prefix(arr):  # the first index whose prefix sum exceeds half (len(arr) if none)
        # Cumulative sums over growing windows from the end cut: the cut is usually within a
        # few hundred points of it, so the whole array is rarely summed.
        start, size, n = 0, 256, len(arr)
        acc = 0.0
        while start < n:
            part = np.cumsum(arr[start:start + size]) + acc
            over = part > half
            if over.any():
                return start + int(over.argmax())
            acc = float(part[-1])
            start += size
            size *= 4
        return n

    left, right = prefix(probs), len(probs) - prefix(probs[::-1])
    right = max(right, left + 1)
    kept = probs[left:right].copy()
    kept[0] += float(np.sum(probs[:left]))
    return DensePLDPmf(discretization, lower_loss + left, kept, infinity_mass + float(np.sum(probs[right:])),
                       pessimistic)


def _trim(pmf, tail: float):
    """A dense pmf with its tails cut as :func:`_compose_dense` cuts a composition's
    (:func:`_cut`: pessimistic). A quiet round's PLD on the run's common grid is mostly such
    tails (exact zeros above its reach, masses ~e^-loss below), so its self-composition's FFT
    shrinks with it."""
    return _cut(pmf._probs, pmf._discretization, pmf._lower_loss, pmf._infinity_mass, tail,  # noqa: SLF001
                pmf._pessimistic_estimate)  # noqa: SLF001


def _compose_dense(a, b, tail: float):
    """``DensePLDPmf.compose`` (FFT convolution) with its tails cut as dp_accounting's
    pessimistic truncation does (:func:`_cut`)."""
    from scipy import signal

    assert a._pessimistic_estimate and b._pessimistic_estimate  # noqa: SLF001 (connect-the-dots, pessimistic)
    probs = signal.fftconvolve(a._probs, b._probs)  # noqa: SLF001
    inf_mass = a._infinity_mass + b._infinity_mass - a._infinity_mass * b._infinity_mass  # noqa: SLF001
    return _cut(probs, a._discretization, a._lower_loss + b._lower_loss, inf_mass, tail, True)  # noqa: SLF001
