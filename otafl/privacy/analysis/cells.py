r"""Cells of the norm statistic s and the conditional profile delta_n(eps) of one round.

Given n other participants, the server's output in d dimensions depends on user k only
through u (the component along the gradient) and s (the squared norm of the other d - 1
components): s ~ w chi2_{d-1} without user k, W chi2_{d-1} with it (w = n sigma_o^2 +
N0/c^2, W = w + sigma_k^2). The law of s is the same mixture under both neighbours, so

    delta_n(eps) = E_s[h_eps(pi(s))],                                                  (2)
    logit pi(s) = logit p - (d - 1)/2 log(W / w) + s (1/w - 1/W) / 2,

with h_eps the 1-D mixture profile of :mod:`otafl.privacy.analysis.mixture`. h is convex
in pi with h(0) = 0 (joint convexity), and pi(s) dM(s) = p dG_W(s) (M the mixture law of
s, G_W the law W chi2_{d-1}), so

    delta_n(eps) = p E_{s ~ G_W}[r(pi(s))],   r(pi) = h_eps(pi) / pi non-decreasing.     (4)

On cells of s, h lies below its chords: summing the smaller of the chord and the
monotone bound over cells gives a rigorous upper bound whose error falls like
1 / cells^2 (the gap to the matching lower bound, about 1e-3 relative at the default
grid, is reported). Refining a grid by adding edges never raises the bound. Cell masses
come from scipy's regularised incomplete gamma function. Derivation: docs/privacy/exact.md#exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from otafl.privacy.analysis.gaussian import gaussian_hockey_stick
from otafl.privacy.analysis.mixture import equal_variance_upper, mixture_hockey_stick, zero_eps_value

__all__ = ["CellGrid", "DEFAULT_GRID", "SCells", "s_cells", "conditional_delta", "equal_noise_upper"]

_DT = torch.float64


@dataclass(frozen=True)
class CellGrid:
    """Cells of the s axis used for eq. (4), fixed per (n, round), independent of eps.

    Edges are the union of (a) ``quantile_cells + 1`` quantiles of W chi2_{d-1} (the law of
    s when user k participates) at levels sigmoid(t), t uniform on [-t_max, t_max], and
    (b) ``posterior_cells - 1`` points where pi(s) is uniform on the range pi takes over
    the central part (levels 1e-7 ... 1 - 1e-7) of both branches; plus s = 0 and +inf.
    Doubling either count refines the grid (nested edges), which never raises the bound.
    """

    quantile_cells: int = 64
    posterior_cells: int = 128
    t_max: float = 30.0


DEFAULT_GRID = CellGrid()


@dataclass(frozen=True)
class SCells:
    """Cells of eq. (4) for a batch of (user, n) rows; all float64, leading shape [...].

    Attributes
    ----------
    log_odds : [..., J + 1], logit pi at the edges (last edge s = inf: +inf).
    present_mass : [..., J], P(s in cell | k participates) (law W chi2_{d-1}).
    mixture_mass : [..., J], P(s in cell) under the mixture (1 - p) w chi2 + p W chi2.
    """

    log_odds: torch.Tensor
    present_mass: torch.Tensor
    mixture_mass: torch.Tensor


def _cell_masses(x, dof):
    """P(chi2_dof in [x_j, x_{j+1}]) for sorted x [..., J+1] (numpy), accurate side."""
    import numpy as np
    from scipy.special import gammainc, gammaincc

    cdf = gammainc(dof / 2.0, x / 2.0)
    sf = gammaincc(dof / 2.0, x / 2.0)
    lower = cdf[..., 1:] - cdf[..., :-1]
    upper = sf[..., :-1] - sf[..., 1:]
    return np.clip(np.where(cdf[..., 1:] <= 0.5, lower, upper), 0.0, None)


def s_cells(*, participation_prob: torch.Tensor, absent_var: torch.Tensor,
            own_noise_var: torch.Tensor, dim: int, grid: CellGrid = DEFAULT_GRID) -> SCells:
    """Build the cells of eq. (4) (on the CPU with scipy's incomplete gamma; then moved).

    Parameters
    ----------
    participation_prob, absent_var, own_noise_var : [...], float64, with 0 < p < 1,
        w > 0 and sigma_k^2 >= 0 (gradient units^2). dim >= 2.

    Cell masses come from scipy's regularised incomplete gamma function (accurate to
    ~1e-15 relative); torch's ``gammainc`` is ~1e-10 off for large shapes, too coarse for
    a bound meant to hold at delta ~ 1e-10.
    """
    import numpy as np
    from scipy.special import expit, gammainccinv, gammaincinv, logit

    p, w, s2 = torch.broadcast_tensors(*(torch.as_tensor(t, dtype=_DT) for t in
                                         (participation_prob, absent_var, own_noise_var)))
    dev = p.device
    shape = p.shape
    p_, w_, s2_ = (t.detach().cpu().reshape(-1).numpy() for t in (p, w, s2))
    k = dim - 1
    rho = s2_ / w_  # W / w - 1
    base = logit(p_) - 0.5 * k * np.log1p(rho)
    t = np.linspace(-grid.t_max, grid.t_max, grid.quantile_cells + 1)
    half = k / 2.0
    xq = 2.0 * np.where(t <= 0, gammaincinv(half, expit(np.minimum(t, 0))),
                        gammainccinv(half, expit(-np.maximum(t, 0))))
    R = p_.shape[0]
    # x = s / W; pi(x) = sigmoid(base + rho x / 2). Central x range of both branches:
    x_lo = 2.0 * gammaincinv(half, 1e-7) / (1 + rho)
    x_hi = np.full(R, 2.0 * gammainccinv(half, 1e-7))
    pi_lo = expit(base + 0.5 * rho * x_lo)
    pi_hi = expit(base + 0.5 * rho * x_hi)
    frac = np.linspace(0.0, 1.0, grid.posterior_cells + 1)[1:-1]
    pis = pi_lo[:, None] + (pi_hi - pi_lo)[:, None] * frac[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        xp = (logit(pis) - base[:, None]) / (0.5 * rho[:, None])
    xp = np.where(np.isfinite(xp) & (xp > 0), xp, xq[0])  # rho = 0: pi is constant
    x = np.concatenate([np.zeros((R, 1)), np.broadcast_to(xq, (R, len(xq))), xp,
                        np.full((R, 1), np.inf)], axis=1)
    x.sort(axis=1)
    present = _cell_masses(x, k)
    absent = _cell_masses(x * (1 + rho)[:, None], k)
    mixture = (1 - p_)[:, None] * absent + p_[:, None] * present
    with np.errstate(invalid="ignore"):
        lam = base[:, None] + 0.5 * rho[:, None] * x
    lam[:, -1] = np.where(rho > 0, np.inf, base)
    lam = np.where(rho[:, None] > 0, lam, base[:, None])
    J = x.shape[1] - 1
    to = lambda v, n: torch.as_tensor(v, dtype=_DT).reshape(*shape, n).to(dev)  # noqa: E731
    return SCells(log_odds=to(lam, J + 1), present_mass=to(present, J),
                  mixture_mass=to(mixture, J))


def _cell_integral(eps, p, w, s2, a, gauss, cells: SCells, with_lower: bool = True):
    r"""Bounds on eq. (4) from convexity of h in pi; inputs [...], cells [..., J(+1)].

    h is convex in pi (the hockey-stick divergence is jointly convex and (P_pi, Q_pi) is
    affine in pi), h(0) = 0, and pi(s) dM(s) = p dG_W(s). On a cell with end values
    (pi_j, h_j), (pi_{j+1}, h_{j+1}):

    * upper: h <= chord alpha + beta pi, so int h dM <= alpha M_j + beta p G_j; also
      <= p r_{j+1} G_j (r = h / pi non-decreasing). The smaller is used.
    * lower: h >= the neighbouring cells' chords extended (convexity), and >= p r_j G_j.
    Upper chords use upper bounds of h at both ends; extended chords (one negative
    weight) use the upper bound at the far end and the lower bound at the near end.
    Without ``with_lower`` the lower bound is left out (None).
    """
    lam = cells.log_odds
    col = lambda t: t.unsqueeze(-1)  # noqa: E731
    h_up, h_lo = mixture_hockey_stick(col(eps), log_odds=lam, absent_var=col(w), present_var=col(w + s2),
                                      half_sensitivity=col(a), lower=with_lower)
    full = torch.isposinf(lam)
    g = col(gauss).expand_as(h_up)
    h_up = torch.where(full, g, h_up)
    pi = torch.sigmoid(lam)
    log_pi = F.logsigmoid(lam)
    r_up = torch.exp(torch.log(h_up) - log_pi)
    G, M, pc = cells.present_mass, cells.mixture_mass, col(p)

    dpi = pi[..., 1:] - pi[..., :-1]
    ok = dpi > 0
    safe = torch.where(ok, dpi, torch.ones_like(dpi))
    beta = (h_up[..., 1:] - h_up[..., :-1]) / safe
    alpha = h_up[..., :-1] - beta * pi[..., :-1]
    chord_up = alpha * M + beta * pc * G
    mono_up = pc * r_up[..., 1:] * G
    cell_up = torch.where(ok, torch.minimum(chord_up, mono_up), mono_up)
    upper = cell_up.clamp(min=0.0).sum(-1)
    if not with_lower:
        return upper, None
    h_lo = torch.where(full, g, h_lo)
    r_lo = torch.exp(torch.log(h_lo) - log_pi)

    # Lower bounds: chord of cell j-1 extended over cell j, chord of cell j+1 extended back.
    b_lo = (h_lo[..., 1:] - h_up[..., :-1]) / safe  # slope through (j, up) -> (j+1, lo)
    ext_fwd_beta = b_lo[..., :-1]                 # for cell j from cell j-1 (j >= 1)
    ext_fwd_alpha = h_lo[..., 1:-1] - ext_fwd_beta * pi[..., 1:-1]
    b_lo2 = (h_up[..., 1:] - h_lo[..., :-1]) / safe  # through (j, lo) -> (j+1, up)
    ext_bwd_beta = b_lo2[..., 1:]                 # for cell j from cell j+1 (j <= J-2)
    ext_bwd_alpha = h_lo[..., 1:-1] - ext_bwd_beta * pi[..., 1:-1]
    mono_lo = pc * r_lo[..., :-1] * G
    fwd = torch.where(ok[..., :-1], ext_fwd_alpha * M[..., 1:] + ext_fwd_beta * pc * G[..., 1:],
                      torch.zeros_like(mono_lo[..., 1:]))
    bwd = torch.where(ok[..., 1:], ext_bwd_alpha * M[..., :-1] + ext_bwd_beta * pc * G[..., :-1],
                      torch.zeros_like(mono_lo[..., :-1]))
    cell_lo = mono_lo.clone()
    cell_lo[..., 1:] = torch.maximum(cell_lo[..., 1:], fwd)
    cell_lo[..., :-1] = torch.maximum(cell_lo[..., :-1], bwd)
    lower = torch.minimum(cell_lo, cell_up).clamp(min=0.0).sum(-1)
    return upper, lower


def conditional_delta(eps: torch.Tensor, *, participation_prob: torch.Tensor,
                      absent_var: torch.Tensor, own_noise_var: torch.Tensor,
                      half_sensitivity: torch.Tensor, dim: int,
                      grid: CellGrid = DEFAULT_GRID, cells: SCells | None = None, lower: bool = True,
                      upper: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    r"""Upper and lower bounds on delta_n(eps) = H_eps(P_n || Q_n), eq. (4).

    Parameters
    ----------
    eps : [...], float64, >= 0.
    participation_prob : [...], float64, p in [0, 1] of the user under attack.
    absent_var : [...], float64, w = v_n = n sigma_o^2 + N0/c^2 >= 0 (gradient units^2).
    own_noise_var : [...], float64, sigma_k^2 >= 0 (W = w + sigma_k^2; W = 0 gives 1).
    half_sensitivity : [...], float64, a = Delta / 2 > 0.
    dim : int, model dimension d >= 1, or None for the dimension-free bound d -> inf:
        the norm statistic then reveals participation, delta_n = p h(1) (an upper bound
        for every d, since a lower-dimensional output is a post-processing).
    grid : how to build the s cells (d >= 2).
    cells : prebuilt ``s_cells`` for exactly these (p, w, sigma_k^2) rows (shape
        [..., J(+1)] matching the broadcast shape); built on the fly when None.
    lower : False leaves the lower bound out (None; the upper bound is the same).
    upper : False (with ``lower``) returns None for the upper bound; where s is ancillary (d = 1)
        the 1-D mixtures then skip their brackets (:func:`mixture_hockey_stick`'s ``upper``),
        elsewhere the lower bound is the same.

    Returns
    -------
    upper, lower : [...], float64 (broadcast shape), lower <= delta_n(eps) <= upper.
    """
    eps, p, w, s2, a = torch.broadcast_tensors(*(torch.as_tensor(x, dtype=_DT) for x in
                                                 (eps, participation_prob, absent_var,
                                                  own_noise_var, half_sensitivity)))
    shape = eps.shape
    eps, p, w, s2, a = (t.reshape(-1) for t in (eps, p, w, s2, a))
    W = w + s2
    point_mass = w <= 0
    never = p <= 0
    todo = ~point_mass & ~never & (p < 1)
    # s is ancillary when both branches have the same variance (or d = 1): a 1-D problem
    # for every d, including the dimension-free limit (dim=None).
    flat = todo & ((s2 == 0) | (dim == 1))
    cell = todo & ~flat & (dim is not None)
    # h(1), the Gaussian at W: the point-mass case, p = 1 (pi = 1 everywhere), the
    # dimension-free limit and the cells' last edge; not needed where the 1-D mixture is.
    gauss = torch.zeros_like(eps)
    rest = ~flat
    if bool(rest.all()):
        gauss = gaussian_hockey_stick(epsilon=eps, sensitivity=2 * a, noise_std=W.sqrt())
    elif bool(rest.any()):
        gauss[rest] = gaussian_hockey_stick(epsilon=eps[rest], sensitivity=2 * a[rest], noise_std=W[rest].sqrt())
    up = p * gauss
    lo = up.clone() if lower else None
    if bool(rest.any()) and bool(flat.any()):
        sel = lambda t: t[flat]  # noqa: E731
        u1, l1 = mixture_hockey_stick(sel(eps), log_odds=torch.logit(sel(p)), absent_var=sel(w),
                                      present_var=sel(W), half_sensitivity=sel(a), lower=lower, upper=upper)
        if upper:
            up = up.masked_scatter(flat, u1)
        if lower:
            lo = lo.masked_scatter(flat, l1)
    elif bool(flat.any()):  # every element (eq. (5)'s profiles): no gathers or scatters
        up, lo = mixture_hockey_stick(eps, log_odds=torch.logit(p), absent_var=w, present_var=W,
                                      half_sensitivity=a, lower=lower, upper=upper)
        if up is None:
            up = torch.zeros_like(eps)  # not returned (upper=False)
    if bool(cell.any()):
        every = bool(cell.all())  # eq. (1)'s d-dimensional profiles: no gathers or scatters
        sel = (lambda t: t) if every else (lambda t: t[cell])  # noqa: E731
        if cells is None:
            c = s_cells(participation_prob=sel(p), absent_var=sel(w), own_noise_var=sel(s2), dim=dim, grid=grid)
        else:
            c = SCells(*(sel(t.expand(*shape, t.shape[-1]).reshape(-1, t.shape[-1]))
                         for t in (cells.log_odds, cells.present_mass, cells.mixture_mass)))
        u1, l1 = _cell_integral(sel(eps), sel(p), sel(w), sel(s2), sel(a), sel(gauss), c, lower)
        up = u1 if every else up.masked_scatter(cell, u1)
        if lower:
            lo = l1 if every else lo.masked_scatter(cell, l1)
    up = torch.where(never, torch.zeros_like(up), up.clamp(max=1.0))
    if not lower:
        return up.reshape(shape), None
    lo = torch.where(never, torch.zeros_like(lo), lo)
    return (up.reshape(shape) if upper else None), lo.reshape(shape)


def equal_noise_upper(e: torch.Tensor, share: torch.Tensor, w: torch.Tensor, a: torch.Tensor, dim
                      ) -> torch.Tensor:
    """Eq. (5)'s terms' upper bounds [R, E, M] where every term has equal noises on both branches
    (:func:`conditional_delta`'s upper bound, no extra noise; eq. (5) of
    :func:`~otafl.privacy.analysis.ota_round.round_delta`): :func:`equal_variance_upper` on the
    broadcast shapes (e [R, E, 1]; share, w [R, 1, M]; a [R, 1, 1]); where it certifies no root,
    conditional_delta's closed forms on those shapes (pi_m = 0: 0; pi_m = 1: the Gaussian at W;
    eps = 0: the total variation, :func:`zero_eps_value`), else conditional_delta itself."""
    R, E, M = e.shape[0], e.shape[1], share.shape[2]
    lam = torch.logit(share)
    up, ok = equal_variance_upper(e, lam, w, a)
    if bool(ok.all()):
        return up.clamp(max=1.0)
    a3 = a.expand(R, 1, 1)
    none, full = share <= 0, share >= 1  # [R, 1, M]
    done = ok | none
    up = torch.where(none, torch.zeros((), dtype=_DT), up)
    r, j = torch.nonzero(full.reshape(R, M), as_tuple=True)
    if r.numel():  # pi_m = 1: the Gaussian mechanism, at every eps of the row
        up[r, :, j] = gaussian_hockey_stick(epsilon=e[r, :, 0], sensitivity=2 * a3[r, 0], noise_std=w[r, 0, j, None].sqrt())
        done = done | full
    r, i = torch.nonzero((e == 0).reshape(R, E), as_tuple=True)
    if r.numel():  # eps = 0, 0 < pi_m < 1: the total variation
        inner = ~none[r, 0] & ~full[r, 0]
        tv = zero_eps_value(lam[r, 0], w[r, 0], w[r, 0], a3[r, 0])
        up[r, i] = torch.where(inner, tv, up[r, i])
        done[r, i] = done[r, i] | inner
    if not bool(done.all()):
        bad = torch.nonzero(~done.reshape(-1)).reshape(-1)
        r, i, j = bad // (E * M), (bad // M) % E, bad % M
        u, _ = conditional_delta(e[r, i, 0], participation_prob=share[r, 0, j], absent_var=w[r, 0, j],
                                 own_noise_var=torch.zeros_like(bad, dtype=_DT),
                                 half_sensitivity=a3[r, 0, 0], dim=dim, lower=False)
        up = up.reshape(-1).index_put((bad,), u).reshape(R, E, M)
    return up.clamp(max=1.0)
