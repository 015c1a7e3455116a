r"""The leakage of one over-the-air round for one user: delta(eps) and eps(delta), numerically.

User k takes part with probability p; the other users' gradients are known to the
adversary and subtracted, and the worst-case pair is antipodal, g_k = +-a e with
a = Delta / 2. Given n other participants the two output laws are

    P_n = (1 - p) N(0, w I_d) + p N(+a e, W I_d),   Q_n = same with -a e,
    w = n sigma_o^2 + N0 / c^2,   W = w + sigma_k^2   (sigma_o^2: the smallest other noise),

and by joint convexity of the hockey-stick divergence (revealing n only helps the
adversary)

    delta(eps) <= sum_n P(n) delta_n(eps),   delta_n(eps) = H_eps(P_n || Q_n),            (1)

with delta_n from :mod:`otafl.privacy.analysis.cells`. Conditioning on the total count
m = n + 1{k takes part} instead gives the other bound

    delta(eps) <= sum_m P(m) H_eps(P^m || Q^m),                                          (5)
    P^m = (1 - pi_m) N(0, w_m I_d) + pi_m N(+a e, W_m I_d),   Q^m = same with -a e,

w_m = m sigma_o^2 + N0/c^2, W_m = w_m + sigma_k^2 - sigma_o^2, pi_m = P(k in | m)
(:func:`~otafl.privacy.analysis.count_law.total_count_law`);
:func:`round_delta` reports the smaller. Every numerical error is on the safe side:
cells (chord bounds), root brackets, the truncated tail of the count law (added to
delta) and blocks of n (weighted by delta at the block's smallest n). Local DP is the
same computation with n = 0. ``dim=None`` is the dimension-free limit d -> inf, an
upper bound for every d. Derivation and checks: docs/privacy/exact.md#exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from otafl.errors import OtaflInputError
from otafl.privacy.analysis.cells import DEFAULT_GRID, CellGrid, SCells, conditional_delta, equal_noise_upper, s_cells
from otafl.privacy.analysis.count_law import CountLaw, TotalLaw, total_count_law
from otafl.privacy.analysis.roots import bracketed_root, sign_gap

__all__ = ["RoundSpec", "RoundCells", "round_cells", "round_delta", "round_epsilon", "take_rows", "take_cells",
           "with_dim"]

_DT = torch.float64
_MAX_ELEMENTS = 1 << 16  # (row, eps, count, cell) elements per cell-integral batch (memory)


@dataclass(frozen=True)
class RoundSpec:
    """The facts of one round for the user under attack, batched over B settings.

    Attributes (all [B], float64, gradient units)
    ----------
    participation_prob : p of the user under attack.
    own_noise_var : sigma_k^2 of that user.
    others_noise_var : sigma_o^2, the smallest artificial noise variance of the others.
    channel_noise_var : N0 / c^2.
    half_sensitivity : a = Delta / 2.
    law : CountLaw of the number of other participants (``n = 0`` for local DP).
    dim : model dimension d (int), or None for the dimension-free bound (d -> inf).
    total_ok : [B] bool or None (all True): rows where eq. (5) holds. Eq. (5) needs every
        other user who can take part to add exactly sigma_o^2 (and sigma_k^2 >= sigma_o^2):
        given the total count, a larger noise of the others is *not* a post-processing (its
        amount depends on whether user k took part), and the norm would tell which users
        took part. Elsewhere only eq. (1) is used (eq. (5)'s bound is replaced by 1).
    """

    participation_prob: torch.Tensor
    own_noise_var: torch.Tensor
    others_noise_var: torch.Tensor
    channel_noise_var: torch.Tensor
    half_sensitivity: torch.Tensor
    law: CountLaw
    dim: int | None
    total_ok: torch.Tensor | None = None


def _col(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, 1)


@dataclass(frozen=True)
class RoundCells:
    """Prebuilt s cells of a round, rows [B, 1, N]: others' count at n_first (upper) and
    n_last (lower), and the total count (``total``, None when s is ancillary there)."""

    first: SCells | None
    last: SCells | None
    total: SCells | None = None


def _round_params(spec: RoundSpec):
    p, s2, so2, ch, a = (_col(t.to(_DT))[:, :, None] for t in (
        spec.participation_prob, spec.own_noise_var, spec.others_noise_var,
        spec.channel_noise_var, spec.half_sensitivity))
    law = spec.law
    w_first = law.n_first[:, None, :] * so2 + ch
    w_last = law.n_last[:, None, :] * so2 + ch
    return p, s2, a, w_first, w_last


def _total_params(spec: RoundSpec, total: TotalLaw):
    so2, s2, ch = (_col(t.to(_DT))[:, :, None] for t in (
        spec.others_noise_var, spec.own_noise_var, spec.channel_noise_var))
    w = total.m[:, None, :] * so2 + ch
    extra = (s2 - so2).clamp(min=0.0)
    return total.share[:, None, :], w, extra


def round_cells(spec: RoundSpec, grid: CellGrid = DEFAULT_GRID,
                conditioning: str = "best", lower: bool = True) -> RoundCells:
    """Build the eps-independent s cells of a round once (reused by every eps).

    ``lower=False``: the cells at n_last (read by the lower bound only) are not built
    (``last`` is None where they would differ from ``first``)."""
    if spec.dim is None or spec.dim == 1:
        return RoundCells(None, None)
    p, s2, _, w_first, w_last = _round_params(spec)

    def build(p, w, s2):
        pb, wb, sb = torch.broadcast_tensors(p, w, s2)
        ok = (wb > 0) & (pb > 0) & (pb < 1) & (sb > 0)
        # Rows that conditional_delta does not integrate get harmless placeholders.
        pb = torch.where(ok, pb, torch.full_like(pb, 0.5))
        wb = torch.where(ok, wb, torch.ones_like(wb))
        sb = torch.where(ok, sb, torch.ones_like(sb))
        return s_cells(participation_prob=pb, absent_var=wb, own_noise_var=sb, dim=spec.dim, grid=grid)

    first = last = None
    if conditioning in ("best", "others"):
        first = build(p, w_first, s2)
        if torch.equal(spec.law.n_first, spec.law.n_last):
            last = first
        elif lower:
            last = build(p, w_last, s2)
    total = total_count_law(spec.law, spec.participation_prob) if conditioning in ("best", "total") else None
    tcells = None
    if total is not None:
        share, w, extra = _total_params(spec, total)
        # Cells only where some count has 0 < pi_m < 1 with extra noise: at pi_m in {0, 1}
        # (local rows: m = 0 or 1) conditional_delta reads no cells.
        if bool(((extra > 0) & (share > 0) & (share < 1)).any()):
            tcells = build(share, w, extra)
    return RoundCells(first, last, tcells)


def round_delta(eps: torch.Tensor, spec: RoundSpec, *, grid: CellGrid = DEFAULT_GRID,
                cells: RoundCells | None = None, conditioning: str = "best", lower: bool = True,
                upper: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    r"""Bounds on the round's profile by joint convexity, eq. (1) and eq. (5).

    Parameters
    ----------
    eps : [B] or [B, E], float64, >= 0.
    spec : the round, batched over B.
    grid : s cells (ignored when ``cells`` is given).
    cells : ``round_cells(spec, grid)``, to reuse across calls.
    conditioning : "others" (reveal n, eq. 1), "total" (reveal m, eq. 5) or "best" (the
        smaller of the two; both are upper bounds on the same delta).
    lower : False leaves the lower bound out (None; the upper bound is the same, at less
        cost: profiles and roots read the upper bound only).
    upper : False (``conditioning="others"`` only): eq. (1)'s lower bound alone (upper None),
        cheaper in d = 1 (the floors that screen eq. (1): :func:`conditional_delta`'s ``upper``).

    Returns
    -------
    upper : same shape as ``eps``: the reported upper bound (block weights times delta
        at each block's smallest n, plus the dropped mass).
    lower : lower bound on the same sum (not on the true leakage), for error reporting.
    """
    if conditioning not in ("best", "others", "total"):
        raise OtaflInputError(f"conditioning = {conditioning!r} is outside the allowed range "
                              "{best, others, total}")
    eps = torch.as_tensor(eps, dtype=_DT)
    squeeze = eps.dim() == 1
    if squeeze:
        eps = eps[:, None]
    if not upper and (conditioning != "others" or not lower):
        raise OtaflInputError("round_delta(upper=False) needs conditioning='others' and lower=True")
    if cells is None:
        cells = round_cells(spec, grid, conditioning, lower)
    B, E = eps.shape[0], eps.shape[1]
    cell_count = max((c.log_odds.shape[-1] for c in (cells.first, cells.total) if c is not None), default=1)
    per_row = E * (spec.law.weight.shape[1] + 1) * cell_count
    if B > 1 and B * per_row > _MAX_ELEMENTS:
        # Chunks of rows keep the temporaries of the cell integrals to a few MB each.
        step = max(1, _MAX_ELEMENTS // per_row)
        parts = [round_delta(eps[i:i + step], take_rows(spec, torch.arange(i, min(B, i + step))),
                             cells=take_cells(cells, torch.arange(i, min(B, i + step))),
                             conditioning=conditioning, lower=lower, upper=upper) for i in range(0, B, step)]
        up_all = torch.cat([u for u, _ in parts]) if upper else None
        lo_all = torch.cat([lo for _, lo in parts]) if lower else None
        if squeeze:
            return (up_all[:, 0] if upper else None), (lo_all[:, 0] if lower else None)
        return up_all, lo_all
    want_lower, want_upper = lower, upper
    law = spec.law
    p, s2, a, w_first, w_last = _round_params(spec)
    e = eps[:, :, None]
    upper = lower = None
    if conditioning in ("best", "others"):
        # The upper bound charges each block at its smallest n, the lower bound at its largest
        # (the terms do not increase with n); one call gives both where the law has no blocks.
        same = torch.equal(law.n_first, law.n_last)
        wgt = law.weight[:, None, :]
        if want_upper:
            up, lo = conditional_delta(e, participation_prob=p, absent_var=w_first, own_noise_var=s2,
                                       half_sensitivity=a, dim=spec.dim, cells=cells.first,
                                       lower=want_lower and same)
            upper = ((wgt * up).sum(-1) + law.dropped[:, None]).clamp(max=1.0)
        if want_lower and not (want_upper and same):  # without the upper bound: the dropped mass left out
            _, lo = conditional_delta(e, participation_prob=p, absent_var=w_last, own_noise_var=s2,
                                      half_sensitivity=a, dim=spec.dim, cells=cells.last, upper=want_upper)
        lower = (wgt * lo).sum(-1) if want_lower else None
    total = total_count_law(spec.law, spec.participation_prob) if conditioning in ("best", "total") else None
    if total is not None:
        share, w, extra = _total_params(spec, total)
        if not want_lower and bool((extra == 0).all()):
            up, lo = equal_noise_upper(e, share, w, a, spec.dim), None
        else:
            up, lo = conditional_delta(e, participation_prob=share, absent_var=w, own_noise_var=extra,
                                       half_sensitivity=a, dim=spec.dim, cells=cells.total, lower=want_lower)
        wgt = total.weight[:, None, :]
        t_up = ((wgt * up).sum(-1) + total.dropped[:, None]).clamp(max=1.0)
        if spec.total_ok is not None:  # rows where eq. (5) does not hold: the trivial bound 1
            t_up = torch.where(spec.total_ok[:, None], t_up, torch.ones_like(t_up))
        upper = t_up if upper is None else torch.minimum(upper, t_up)
        if want_lower:
            t_lo = (wgt * lo).sum(-1)
            if spec.total_ok is not None:
                t_lo = torch.where(spec.total_ok[:, None], t_lo, torch.ones_like(t_lo))
            lower = t_lo if lower is None else torch.minimum(lower, t_lo)
    elif conditioning == "total":
        raise OtaflInputError("conditioning = 'total' needs the law of n per count "
                              "(fewer than 1 / block_rel_width users)")
    if squeeze:
        return (upper[:, 0] if want_upper else None), (lower[:, 0] if want_lower else None)
    return upper, lower


CHECK_LUMP = 2e-3
"""Relative growth of the absent variance over a block of n in :func:`round_epsilon`'s check
of where eq. (1) can beat eq. (5) (:func:`lumped`)."""


def lumped(spec: RoundSpec, rel: float) -> RoundSpec:
    """The rows with their law of n in blocks of a common width, the largest over which every
    row's absent variance n sigma_o^2 + ch grows by at most a relative ``rel`` (unchanged
    below a width of 2). For eq. (1) only: each block is charged at its smallest n (eq. (1)'s
    terms do not increase with n), so the bound is an upper bound on the unlumped one."""
    from otafl.privacy.analysis.count_law import lump_counts

    so2 = spec.others_noise_var
    if rel <= 0 or so2.numel() == 0 or not bool((so2 > 0).all()):
        return spec
    var = spec.law.n_first[:, 0] * so2 + spec.channel_noise_var
    width = int(float((rel * var / so2).min()))
    if width < 2:
        return spec
    return RoundSpec(spec.participation_prob, spec.own_noise_var, spec.others_noise_var, spec.channel_noise_var,
                     spec.half_sensitivity, lump_counts(spec.law, width), spec.dim, spec.total_ok)


def take_rows(spec: RoundSpec, idx: torch.Tensor) -> RoundSpec:
    """The rows ``idx`` of a batched RoundSpec."""
    law = spec.law
    return RoundSpec(spec.participation_prob[idx], spec.own_noise_var[idx],
                     spec.others_noise_var[idx], spec.channel_noise_var[idx],
                     spec.half_sensitivity[idx],
                     CountLaw(law.n_first[idx], law.n_last[idx], law.weight[idx], law.dropped[idx]),
                     spec.dim, None if spec.total_ok is None else spec.total_ok[idx])


def take_cells(cells: RoundCells, idx: torch.Tensor) -> RoundCells:
    """The rows ``idx`` of prebuilt round cells."""
    def sub(c):
        return None if c is None else SCells(c.log_odds[idx], c.present_mass[idx], c.mixture_mass[idx])
    last = cells.last if cells.last is None or cells.last is cells.first else sub(cells.last)
    first = sub(cells.first)
    return RoundCells(first, first if cells.last is cells.first else last, sub(cells.total))


def with_dim(spec: RoundSpec, dim: int | None) -> RoundSpec:
    """The same rows in another dimension (``None``: the dimension-free bound)."""
    return RoundSpec(spec.participation_prob, spec.own_noise_var, spec.others_noise_var,
                     spec.channel_noise_var, spec.half_sensitivity, spec.law, dim, spec.total_ok)


def _total_is_flat(spec: RoundSpec) -> bool:
    """Whether eq. (5) is one-dimensional on every row (every term has equal noises on both
    branches, or pi_m in {0, 1}): then it is the same bound in every dimension."""
    total = total_count_law(spec.law, spec.participation_prob)
    if total is None:
        return False
    _, _, extra = _total_params(spec, total)
    share = total.share[:, None, :]
    return bool(((extra == 0) | (share <= 0) | (share >= 1)).all())


def round_epsilon(delta_target: torch.Tensor, spec: RoundSpec, *,
                  grid: CellGrid = DEFAULT_GRID, conditioning: str = "best",
                  xtol: float = 1e-9, max_eps: float = 1e7, upper_hint=None, slack: float = 1e-3,
                  first_step=None, hint_delta=None, cells: RoundCells | None = None) -> torch.Tensor:
    """Smallest eps (to ``xtol`` relative) whose *upper* bound delta(eps) <= delta_target.

    The profile is non-increasing in eps, so the root of sqrt(-log delta_target) - sqrt(-log
    delta(eps)) (:func:`~otafl.privacy.analysis.roots.sign_gap`: the sign of delta - target) is
    bracketed and found by :func:`~otafl.privacy.analysis.roots.bracketed_root` (secant steps,
    safeguarded). The returned value is the upper end of the final bracket, so
    delta(eps) <= delta_target holds there.

    With ``conditioning="best"`` the eps of eq. (5) (cheap: 1-D when the noises are equal)
    is found first; eq. (1) is solved only for rows where its delta at that eps is
    already below the target (then, and only then, its eps is smaller). The result is
    min(eps_(1), eps_(5)), the eps of min(delta_(1), delta_(5)).

    Parameters
    ----------
    delta_target : [B] or scalar, float64 in (0, 1).
    spec : the round, batched over B.
    conditioning : "best", "others" (eq. 1) or "total" (eq. 5).
    upper_hint : [B] or None, a point where the target is expected to be met (the
        bracket is searched downward from it; a wrong hint only costs evaluations).
    first_step : [B] or None, with ``upper_hint``: the relative distance below the hint of
        the first point tried (default ``xtol``; then 16x farther each time the target is
        still met). Where the root's distance is predicted, a bracket in one evaluation.
    hint_delta : [B] or None, with ``upper_hint``: an upper bound on delta at the hint, at most
        the target (its value there is then not computed again; any such bound brackets).
        The "best" solve passes eq. (1)'s value from its check (law of n in blocks: above it).
    cells : ``round_cells(spec, grid, conditioning, lower=False)`` when the caller has them
        (single conditioning only).
    slack : with "best", eq. (1) is solved only where it could lower eq. (5)'s eps by more
        than this fraction (estimated from eq. (5)'s log-slope); 0 solves it wherever it wins.

    Returns
    -------
    eps : [B], float64; 0 where delta(0) <= target; +inf where delta(max_eps) > target.
    """
    B = spec.participation_prob.reshape(-1).shape[0]
    dev = spec.participation_prob.device
    t = torch.as_tensor(delta_target, dtype=_DT, device=dev).expand(B).clone()
    log_t = torch.log(t)
    if conditioning == "best" and total_count_law(spec.law, spec.participation_prob) is not None:
        kw = dict(grid=grid, xtol=xtol, max_eps=max_eps)
        e_t = round_epsilon(t, spec, conditioning="total", **kw)
        probe = torch.where(torch.isfinite(e_t), e_t, torch.full_like(e_t, max_eps))
        rest = torch.arange(B, device=dev)
        if spec.dim is not None and spec.dim > 1:
            # Screen with d = 1 (1-D, cheap): u alone is a projection of the output, so
            # eq. (1) in d dimensions is at least its d = 1 value, and the d = 1 lower
            # bound exceeding the target means eq. (1)'s computed bound does too at e_t.
            _, low1 = round_delta(probe, with_dim(spec, 1), conditioning="others", upper=False)
            rest = torch.nonzero(~(torch.isfinite(e_t) & (low1 > t))).reshape(-1)
        need, cells_rest = rest[:0], None
        first = torch.full((B,), xtol, dtype=_DT, device=dev)  # the hinted solve's first step down
        if rest.numel():
            # Eq. (1) at eq. (5)'s eps, its law of n in blocks over which the absent variance
            # grows by at most 0.2 % (an upper bound: each block charged at its smallest n):
            # at K = 10^4 a few dozen blocks instead of ~700 counts, each with its own cells.
            sub = take_rows(spec, rest)
            check = lumped(sub, CHECK_LUMP)
            # Unlumped (blocks narrower than 2): the check's cells and value are the solve's own.
            cells_rest = round_cells(sub, grid, "others", lower=False) if check is sub else None
            d_o, _ = round_delta(probe[rest], check, grid=grid, cells=cells_rest, conditioning="others", lower=False)
            need = rest[(d_o <= t[rest]) | ~torch.isfinite(e_t[rest])]
            fin = need[torch.isfinite(e_t[need]) & (e_t[need] > 0)]
            if slack > 0 and fin.numel():
                # What eq. (1) could save, from eq. (5)'s log-slope just below its root: rows
                # where it is no more than ``slack`` of the epsilon keep eq. (5)'s (a sound
                # bound either way; the d-dimensional solve costs ~10x the 1-D one).
                h = 0.01 * e_t[fin]
                below, _ = round_delta(e_t[fin] - h, take_rows(spec, fin), grid=grid, conditioning="total",
                                       lower=False)
                slope = (torch.log(below) - log_t[fin]) / h
                d_fin = d_o[torch.searchsorted(rest, fin)]
                saved = torch.log(t[fin] / d_fin.clamp(min=1e-300)) / slope.clamp(min=1e-300)
                skip = fin[saved <= slack * e_t[fin]]
                need = need[~torch.isin(need, skip)]
                # Eq. (1)'s root is about ``saved`` below e_t (eq. (5)'s slope): the first
                # point tried 1.5 saved below, which brackets it at once when the estimate holds.
                first[fin] = (1.5 * saved / e_t[fin]).nan_to_num(nan=xtol).clamp(min=xtol, max=0.5)
        for rows, hinted in ((need[torch.isfinite(e_t[need])], True), (need[~torch.isfinite(e_t[need])], False)):
            if rows.numel():  # eq. (1) where it can win: from below eq. (5)'s eps, or from scratch
                at = torch.searchsorted(rest, rows)
                e_o = round_epsilon(t[rows], take_rows(spec, rows), conditioning="others",
                                    upper_hint=probe[rows] if hinted else None,
                                    first_step=first[rows] if hinted else None,
                                    hint_delta=d_o[at] if hinted else None,
                                    cells=None if cells_rest is None else take_cells(cells_rest, at), **kw)
                e_t[rows] = torch.minimum(e_t[rows], e_o)
        return e_t
    if conditioning == "best":
        conditioning = "others"
    if conditioning == "total" and spec.dim is not None and spec.dim > 1 and _total_is_flat(spec):
        spec = with_dim(spec, None)  # the same bound, without the detour through the free one
    if cells is None:
        cells = round_cells(spec, grid, conditioning, lower=False)
    root_t = torch.sqrt((-log_t).clamp(min=0.0))
    everyone = torch.arange(B, device=dev)

    def f(x, rows=everyone):
        """log delta(x) - log target for ``rows`` only (x: one value per row)."""
        if rows.numel() == 0:
            return x.clone()
        whole = rows.numel() == B
        sub = spec if whole else take_rows(spec, rows)
        c = cells if whole else take_cells(cells, rows)
        up, _ = round_delta(x, sub, cells=c, conditioning=conditioning, lower=False)
        return sign_gap(up, root_t[rows])

    def update(mask, values, fn, x):
        """values with the rows in mask replaced by fn(x) evaluated on those rows only."""
        rows = torch.nonzero(mask).reshape(-1)
        out = values.clone()
        out[rows] = fn(x[rows], rows)
        return out

    if upper_hint is None:
        lo = torch.zeros(B, dtype=_DT, device=dev)
        f_lo = f(lo)
        zero = f_lo <= 0
        hi = torch.ones(B, dtype=_DT, device=dev)
        if spec.dim is not None and spec.dim > 1:
            # Start from the dimension-free bound (closed form per n, cheap): it is an upper
            # bound on delta, so its eps brackets ours from above.
            e_free = round_epsilon(t, with_dim(spec, None), xtol=1e-3, max_eps=max_eps, conditioning=conditioning)
            hi = torch.where(torch.isfinite(e_free) & (e_free > 0), e_free, hi)
        f_hi = f(hi)
    else:
        # A point expected to meet the target: step down from it by relative steps xtol,
        # 16 xtol, 256 xtol, ... until the target fails. A root within xtol of the hint
        # (eq. (1) barely better than eq. (5)) is then bracketed in two evaluations.
        hi = torch.as_tensor(upper_hint, dtype=_DT, device=dev).expand(B).clone()
        if hint_delta is None:
            f_hi = f(hi)
        else:  # an upper bound at the hint, <= target: the sign f_hi <= 0 holds for ours
            f_hi = sign_gap(torch.as_tensor(hint_delta, dtype=_DT, device=dev).expand(B), root_t)
            f_hi = update(~(f_hi <= 0), f_hi, f, hi)
        frac = torch.full_like(hi, xtol) if first_step is None else \
            torch.as_tensor(first_step, dtype=_DT, device=dev).expand(B).clone()
        lo = hi * (1 - frac)
        f_lo = f(lo)
        for _ in range(64):
            down = (f_lo <= 0) & (f_hi <= 0) & (lo > 0)
            if not bool(down.any()):
                break
            hi, f_hi = torch.where(down, lo, hi), torch.where(down, f_lo, f_hi)
            frac = torch.where(down, frac * 16, frac)
            lo = torch.where(down, hi * (1 - frac).clamp(min=0.0), lo)
            f_lo = update(down, f_lo, f, lo)
        zero = (f_lo <= 0) & (lo <= 0)
        hi = torch.where(f_hi <= 0, hi, torch.maximum(hi, torch.ones_like(hi)))
        f_hi = update(f_hi > 0, f_hi, f, hi)
    while True:
        grow = (f_hi > 0) & ~zero & (hi < max_eps)
        if not bool(grow.any()):
            break
        lo = torch.where(grow, hi, lo)
        f_lo = torch.where(grow, f_hi, f_lo)
        hi = torch.where(grow, 2 * hi, hi)
        f_hi = update(grow, f_hi, f, hi)
    unbounded = (f_hi > 0) & ~zero
    active = ~zero & ~unbounded
    hi = bracketed_root(lambda mask, x: update(mask, torch.zeros_like(x), f, x), lo, hi, f_lo, f_hi, active, xtol)
    out = torch.where(zero, torch.zeros_like(hi), hi)
    return torch.where(unbounded, torch.full_like(hi, math.inf), out)
