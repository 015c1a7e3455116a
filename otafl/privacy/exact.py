r"""The ``exact`` accountant: the numerically integrated leakage of one over-the-air round.

No closed form and no published tool covers this mechanism, so the per-round privacy
profile delta(eps) is integrated numerically, as an *upper bound* with explicit error
control. Everything here is pure, batched and float64 on the device of its inputs.

Model (spec ``privacy.md``, section Accountant ``exact``)
---------------------------------------------------------
User k participates with probability ``p``; n of the other users participate
(n is independent of user k's coin). In gradient units the server sees

    y / c = 1{k in K_t} g_k + sum_{j in K_t, j != k} (g_j + n_j) + 1{k in K_t} n_k + m / c,

The other users' gradients are known to the adversary (worst case) and subtracted. We
take the worst-case neighbouring pair to be antipodal, g_k = +a e and g_k' = -a e with
||a|| = Delta / 2 (for minibatch clipping Delta = 2L, the only pair at distance 2L in the
L-ball). Conditioned on n, the two output laws are

    P_n = (1 - p) N(0, w I_d) + p N(+a e, W I_d),   Q_n = same with -a e,
    w = v_n = n sigma_o^2 + N0 / c^2,   W = w + sigma_k^2,

and by joint convexity of the hockey-stick divergence (revealing n only helps the
adversary)

    delta(eps) <= sum_n P(n) delta_n(eps),   delta_n(eps) = H_eps(P_n || Q_n).          (1)

Heterogeneous noise: the others' noise variance is replaced by the smallest one,
sigma_o^2 = min_j sigma_j^2. Given the set S of the other participants, P_S is P_{|S|}
(with sigma_min) convolved with the data-independent N(0, (v_S - v_|S|) I); by
post-processing H_eps(P_S || Q_S) <= H_eps(P_|S| || Q_|S|), so (1) stays an upper bound.
The same argument, P_{n+1} = P_n * N(0, sigma_o^2 I), shows delta_{n+1} <= delta_n: the
profile is non-increasing in n, which lets us lump neighbouring n into blocks safely.

Reduction to one dimension plus an expectation
----------------------------------------------
Both laws depend on y only through u (the component along e) and s (the squared norm of
the other d - 1 components): s ~ w chi2_{d-1} without user k, s ~ W chi2_{d-1} with it.
Since the law of s is the *same* mixture under P_n and Q_n, conditioning on s gives

    delta_n(eps) = E_s[ h_eps(pi(s)) ],   pi(s) = P(k participates | s),
    logit pi(s) = logit p - (d - 1)/2 log(W / w) + s (1/w - 1/W) / 2,                 (2)

where h_eps(pi) is the hockey-stick divergence of the one-dimensional pair
(1 - pi) N(0, w) + pi N(+a, W) versus (1 - pi) N(0, w) + pi N(-a, W).

* h_eps in closed form up to one root: for eps >= 0 and w < W the set where the density
  difference is positive is a half-line (u_1, inf) with u_1 > eps W / (2a) (the
  likelihood ratio is increasing there), so

      h_eps(pi) = pi Qbar((u_1 - a)/sqrt W) - pi e^eps Qbar((u_1 + a)/sqrt W)
                  - (1 - pi)(e^eps - 1) Qbar(u_1 / sqrt w).                            (3)

  u_1 is found by bracketed Newton iteration. For any bracket lo <= u_1 <= hi, (3) at lo
  is a lower bound and (3) at hi plus (hi - lo) max_{[lo, hi]} pi phi_W(u - a) is an upper
  bound (the integrand is at most pi phi_W(u - a)): this is what we report.
* Convexity in pi: (P_pi, Q_pi) is affine in pi and the hockey-stick divergence is
  jointly convex, so h_eps(pi) is convex with h(0) = 0; hence also r(pi) = h(pi) / pi is
  non-decreasing. Since pi(s) dM(s) = p dG_W(s) (M the mixture law of s, G_W the law
  W chi2_{d-1} of s when k participates),

      delta_n(eps) = int h(pi(s)) dM(s) = p E_{s ~ G_W}[ r(pi(s)) ].                     (4)

  On a cell [s_j, s_{j+1}] (pi runs from pi_j to pi_{j+1}), h lies below its chord
  alpha + beta pi, so the cell contributes at most alpha M(cell) + beta p G_W(cell); it
  also contributes at most p r(pi_{j+1}) G_W(cell). We report the smaller, summed over
  cells: a rigorous upper bound whose error falls like 1 / cells^2. Lower bounds (for
  error reporting) come from the neighbouring chords extended (convexity) and
  p r(pi_j) G_W(cell). The cells (:class:`CellGrid`) are quantiles of G_W plus points
  uniform in pi; their masses under both branches come from scipy's regularised
  incomplete gamma function. The last cell reaches s = +inf, where pi = 1 and
  h(1) is the Gaussian mechanism's profile (Balle & Wang 2018, Thm 8).

Conditioning on the total count instead (eq. 5)
-----------------------------------------------
Revealing n makes s informative: given n, the variances with and without user k differ
by sigma_k^2. The total count m = n + 1{k takes part} is another data-independent
variable to condition on (:func:`total_count_law`): given m, k took part with probability
pi_m = p P_o(m-1) / P(m), and both branches have m participants' noise, so with equal
sigma's s is ancillary and each term is a 1-D subsampled-Gaussian pair. Both (1) and (5)
bound the same delta; :func:`round_delta` reports the smaller (``conditioning="best"``).
At the paper's preset (5) is far tighter (it keeps the amplification by sampling); (1)
wins when the others' count is very concentrated relative to the signal or for LDP.

Error control (every source is on the safe side)
------------------------------------------------
1. Cells in s: the chord/monotone upper bound above (the gap to the lower bound, about
   1e-3 relative at the default grid, is returned as ``lower``). Refining a grid by
   adding edges never raises the bound (nested grids; checked in the tests).
2. Root bracketing for u_1: the explicit bracket term above (relative size ~1e-12).
3. Truncation of the law of n to a window holding all but ``tail_mass``: the dropped
   mass is added to delta (delta_n <= 1).
4. Blocks of consecutive n (only when n > 1 / block_rel_width, i.e. very many users): the
   block's weight times delta at its smallest n (monotonicity in n); (5) is then skipped.
Floating-point rounding (relative ~1e-15 of the terms) is not bounded separately.

Worst-case pair: antipodal +-Delta/2 around the no-participation mean. For Delta = 2L
(minibatch clipping, the paper's setting) no other pair in the L-ball is farther apart;
that no closer pair leaks more was checked numerically in d = 1 (all pairs on an
11 x 11 grid of [-L, L]^2, 40 random (p, w, W, eps)), not proven. With per-sample
clipping (Delta < 2L) the spec asks for a supremum over the pair's offset, which this
module does not compute (the accountant interface carries Delta, not L).

Local DP is the same computation with n = 0 always (only k's own noise and the channel
protect it): w = N0 / c^2. When w = 0 (N0 = 0) the no-participation branch is a point mass
at 0, whose contribution (1 - p)(1 - e^eps)_+ vanishes for eps >= 0, so
delta = p * Gaussian(W = sigma_k^2).

Dimension d = 1 has no s statistic: delta_n = h_eps(p). ``dim=None`` is the dimension-free
limit d -> inf (the norm reveals k's participation; delta_n = p h(1)), an upper bound for
every d because a lower-dimensional output is a post-processing of a higher one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from otafl.errors import OtaflInputError, check_range

_LOG2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_DT = torch.float64


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------

def _log_ndtr_upper(z: torch.Tensor) -> torch.Tensor:
    """log Qbar(z) = log P(N(0,1) > z), accurate in both tails."""
    return torch.special.log_ndtr(-z)


def _log_diff(log_pos: torch.Tensor, log_neg: torch.Tensor) -> torch.Tensor:
    """exp(log_pos) - exp(log_neg), computed without overflow (may be negative)."""
    gap = (log_neg - log_pos).clamp(max=700.0)
    out = torch.exp(log_pos) * -torch.expm1(gap)
    return torch.where(torch.isneginf(log_pos) & torch.isneginf(log_neg),
                       torch.zeros_like(out), out)


def gaussian_hockey_stick(eps: torch.Tensor, half_sensitivity: torch.Tensor,
                          noise_var: torch.Tensor) -> torch.Tensor:
    r"""Profile of the Gaussian mechanism N(+a, W) vs N(-a, W) (Balle & Wang 2018, Thm 8).

        delta(eps) = Phi(a/s - eps s/(2a)) - e^eps Phi(-a/s - eps s/(2a)),  s = sqrt(W).

    Parameters
    ----------
    eps : [...], float64, >= 0.
    half_sensitivity : [...], float64, a = Delta / 2 > 0 (gradient units).
    noise_var : [...], float64, W >= 0 (gradient units squared). W = 0 gives delta = 1.

    Returns
    -------
    delta : [...], float64 (broadcast shape).
    """
    eps, a, W = torch.broadcast_tensors(*(torch.as_tensor(x, dtype=_DT) for x in
                                          (eps, half_sensitivity, noise_var)))
    s = W.sqrt()
    z1 = a / s - eps * s / (2 * a)
    z2 = -a / s - eps * s / (2 * a)
    out = _log_diff(torch.special.log_ndtr(z1), eps + torch.special.log_ndtr(z2))
    return torch.where(W > 0, out.clamp(min=0.0), torch.ones_like(out))


def _likelihood_ratio(u, eps, log_pi, log_1mpi, w, W, a):
    """G(u) = L(u) - eps and dG/du, L the log likelihood ratio of the 1-D mixtures."""
    A = log_1mpi - u * u / (2 * w) - 0.5 * torch.log(w)
    B = log_pi - (u - a) ** 2 / (2 * W) - 0.5 * torch.log(W)
    C = log_pi - (u + a) ** 2 / (2 * W) - 0.5 * torch.log(W)
    G = torch.logaddexp(A, B) - torch.logaddexp(A, C) - eps
    dA, dB, dC = -u / w, -(u - a) / W, -(u + a) / W
    sAB = torch.sigmoid(A - B)
    sAC = torch.sigmoid(A - C)
    dG = (sAB * dA + (1 - sAB) * dB) - (sAC * dA + (1 - sAC) * dC)
    return G, dG


def _tail_excess(u, eps, log_pi, log_1mpi, w, W, a):
    """F(u) = int_u^inf (p_P - e^eps p_Q) for the 1-D mixtures, eq. (3) (may be < 0)."""
    sW = W.sqrt()
    log_pos = log_pi + _log_ndtr_upper((u - a) / sW)
    log_neg1 = log_pi + eps + _log_ndtr_upper((u + a) / sW)
    log_neg0 = log_1mpi + torch.log(torch.expm1(eps)) + _log_ndtr_upper(u / w.sqrt())
    return _log_diff(log_pos, torch.logaddexp(log_neg1, log_neg0))


def mixture_hockey_stick(eps: torch.Tensor, log_odds: torch.Tensor, absent_var: torch.Tensor,
                         present_var: torch.Tensor, half_sensitivity: torch.Tensor,
                         *, max_iter: int = 200, rtol: float = 1e-13
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Bounds on h_eps(pi) for (1-pi) N(0, w) + pi N(+a, W) vs (1-pi) N(0, w) + pi N(-a, W).

    Eq. (3) of the module docstring with the root u_1 of L(u) = eps bracketed by Newton
    steps safeguarded by bisection. The initial bracket is explicit: L(eps W / 2a) <= eps
    and L(u) >= B - max(A, C) - log 2 >= eps beyond the larger root of a quadratic.

    Parameters
    ----------
    eps : [...], float64, >= 0 (nats).
    log_odds : [...], float64, logit(pi), may be +inf (pi = 1) but not -inf.
    absent_var : [...], float64, w > 0 (ignored where pi = 1).
    present_var : [...], float64, W >= w, W > 0.
    half_sensitivity : [...], float64, a > 0.

    Returns
    -------
    upper, lower : [...], float64, lower <= h_eps(pi) <= upper.
    """
    eps, lam, w, W, a = torch.broadcast_tensors(*(torch.as_tensor(x, dtype=_DT) for x in
                                                  (eps, log_odds, absent_var, present_var,
                                                   half_sensitivity)))
    full = torch.isposinf(lam)
    w = torch.where(full, torch.ones_like(w), w)  # irrelevant where pi = 1; keeps logs finite
    log_pi = F.logsigmoid(lam)
    log_1mpi = torch.where(full, torch.full_like(lam, -math.inf), F.logsigmoid(-lam))

    u_star = eps * W / (2 * a)
    # Explicit upper bracket: B - C = 2ua/W >= eps + log 2 and B - A >= eps + log 2, the
    # latter a quadratic alpha u^2 + beta u + gamma >= 0 (alpha >= 0, beta > 0).
    alpha = 0.5 / w - 0.5 / W
    beta = a / W
    gamma = lam + 0.5 * torch.log(w / W) - a * a / (2 * W) - eps - _LOG2
    disc = beta * beta - 4 * alpha * gamma
    r_plus = torch.where(disc >= 0, -2 * gamma / (beta + disc.clamp(min=0).sqrt()),
                         torch.full_like(gamma, -math.inf))
    hi = torch.maximum(torch.maximum(u_star, (eps + _LOG2) * W / (2 * a)), r_plus)
    hi = hi + 1e-12 * hi.abs() + 1e-300
    lo = u_star.clone()

    args = (eps, log_pi, log_1mpi, w, W, a)
    lo = torch.where(full, u_star, lo)
    hi = torch.where(full, u_star, hi)
    g_lo, _ = _likelihood_ratio(lo, *args)
    g_hi, _ = _likelihood_ratio(hi, *args)
    g_lo = g_lo.clamp(max=0.0)
    g_hi = g_hi.clamp(min=0.0)

    def secant_or_mid(lo, hi, g_lo, g_hi):
        xs = lo - g_lo * (hi - lo) / (g_hi - g_lo)
        ok = torch.isfinite(xs) & (xs >= lo) & (xs <= hi)
        return torch.where(ok, xs, 0.5 * (lo + hi))

    x = torch.where(full, u_star, secant_or_mid(lo, hi, g_lo, g_hi))
    done = full.clone()
    for _ in range(max_iter):
        # Converged elements are frozen, so each element's result does not depend on
        # what else is in the batch (chunked and whole evaluations agree).
        G, dG = _likelihood_ratio(x, *args)
        pos = G > 0
        upd = ~done & torch.isfinite(G)
        hi = torch.where(upd & pos, x, hi)
        g_hi = torch.where(upd & pos, G, g_hi)
        lo = torch.where(upd & ~pos, x, lo)
        g_lo = torch.where(upd & ~pos, G, g_lo)
        step = G / dG
        x_new = x - step
        bad = ~((x_new >= lo) & (x_new <= hi))
        x_next = torch.where(bad, secant_or_mid(lo, hi, g_lo, g_hi), x_new)
        tol = rtol * (1.0 + x.abs())
        now_done = (step.abs() < tol) | (hi - lo < tol) | (G == 0) | ~torch.isfinite(G)
        x = torch.where(done | now_done, x, x_next)
        done = done | now_done
        if bool(done.all()):
            break
    # Tighten the bracket around the Newton point on both sides.
    tau = 4 * rtol * (1.0 + x.abs())
    for cand in (x - tau, x + tau):
        G, _ = _likelihood_ratio(cand, *args)
        inside = (cand > lo) & (cand < hi) & ~full
        lo = torch.where(inside & (G <= 0), cand, lo)
        hi = torch.where(inside & (G > 0), cand, hi)

    lower = _tail_excess(lo, *args).clamp(min=0.0)
    # Bracket slack: (hi - lo) * max over [lo, hi] of pi phi_W(u - a).
    dist = torch.clamp(torch.maximum(lo - a, a - hi), min=0.0)
    log_slack = (log_pi + torch.log(hi - lo) - dist * dist / (2 * W) - 0.5 * torch.log(W)
                 - _HALF_LOG_2PI)
    upper = _tail_excess(hi, *args).clamp(min=0.0) + torch.exp(log_slack)
    return upper, lower


# --------------------------------------------------------------------------------------
# Cells in s and the convex-chord bounds of eq. (4)
# --------------------------------------------------------------------------------------

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


def s_cells(participation_prob: torch.Tensor, absent_var: torch.Tensor,
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


def _s_integral(eps, p, w, s2, a, gauss, cells: SCells):
    r"""Bounds on eq. (4) from convexity of h in pi; inputs [...], cells [..., J(+1)].

    h is convex in pi (the hockey-stick divergence is jointly convex and (P_pi, Q_pi) is
    affine in pi), h(0) = 0, and pi(s) dM(s) = p dG_W(s). On a cell with end values
    (pi_j, h_j), (pi_{j+1}, h_{j+1}):

    * upper: h <= chord alpha + beta pi, so int h dM <= alpha M_j + beta p G_j; also
      <= p r_{j+1} G_j (r = h / pi non-decreasing). The smaller is used.
    * lower: h >= the neighbouring cells' chords extended (convexity), and >= p r_j G_j.
    Upper chords use upper bounds of h at both ends; extended chords (one negative
    weight) use the upper bound at the far end and the lower bound at the near end.
    """
    lam = cells.log_odds
    col = lambda t: t.unsqueeze(-1)  # noqa: E731
    h_up, h_lo = mixture_hockey_stick(col(eps), lam, col(w), col(w + s2), col(a))
    full = torch.isposinf(lam)
    g = col(gauss).expand_as(h_up)
    h_up = torch.where(full, g, h_up)
    h_lo = torch.where(full, g, h_lo)
    pi = torch.sigmoid(lam)
    log_pi = F.logsigmoid(lam)
    r_up = torch.exp(torch.log(h_up) - log_pi)
    r_lo = torch.exp(torch.log(h_lo) - log_pi)
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


# --------------------------------------------------------------------------------------
# delta_n(eps): the conditional profile, eq. (4)
# --------------------------------------------------------------------------------------

def conditional_delta(eps: torch.Tensor, *, participation_prob: torch.Tensor,
                      absent_var: torch.Tensor, own_noise_var: torch.Tensor,
                      half_sensitivity: torch.Tensor, dim: int,
                      grid: CellGrid = DEFAULT_GRID, cells: SCells | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
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
    gauss = gaussian_hockey_stick(eps, a, W)  # h(1): the Gaussian mechanism at W
    point_mass = w <= 0
    never = p <= 0
    up = p * gauss  # the point-mass case, and p = 1 (pi = 1 everywhere)
    lo = up.clone()
    todo = ~point_mass & ~never & (p < 1)
    # s is ancillary when both branches have the same variance (or d = 1): a 1-D problem
    # for every d, including the dimension-free limit (dim=None).
    flat = todo & ((s2 == 0) | (dim == 1))
    cell = todo & ~flat & (dim is not None)
    if bool(flat.any()):
        sel = lambda t: t[flat]  # noqa: E731
        u1, l1 = mixture_hockey_stick(sel(eps), torch.logit(sel(p)), sel(w), sel(W), sel(a))
        up = up.masked_scatter(flat, u1)
        lo = lo.masked_scatter(flat, l1)
    if bool(cell.any()):
        sel = lambda t: t[cell]  # noqa: E731
        if cells is None:
            c = s_cells(sel(p), sel(w), sel(s2), dim, grid)
        else:
            c = SCells(*(t.expand(*shape, t.shape[-1]).reshape(-1, t.shape[-1])[cell]
                         for t in (cells.log_odds, cells.present_mass, cells.mixture_mass)))
        u1, l1 = _s_integral(sel(eps), sel(p), sel(w), sel(s2), sel(a), sel(gauss), c)
        up = up.masked_scatter(cell, u1)
        lo = lo.masked_scatter(cell, l1)
    up = torch.where(never, torch.zeros_like(up), up.clamp(max=1.0))
    lo = torch.where(never, torch.zeros_like(lo), lo)
    return up.reshape(shape), lo.reshape(shape)


# --------------------------------------------------------------------------------------
# The law of n, the number of other participants
# --------------------------------------------------------------------------------------

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
                      block_rel_width: float) -> CountLaw:
    """CountLaw from per-row windows: row b has P(n = starts[b] + i) = windows[b][i].

    Inside a window n is exact up to n = 1 / block_rel_width; beyond, consecutive n are
    lumped into blocks of width floor(block_rel_width * n) (safe by monotonicity in n).
    """
    dev = dropped.device
    rows = []
    for lb, pw in zip(starts, windows):
        hb = lb + len(pw) - 1
        if block_rel_width * hb < 1.0:
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


def _blocks_from_pmf(pmf: torch.Tensor, tail_mass, block_rel_width: float) -> CountLaw:
    """Window each row of ``pmf`` [B, M] to all but ``tail_mass`` and lump into blocks.

    The window of row b is [lo_b, hi_b] with P(n < lo_b) <= tail_mass / 2 and
    P(n > hi_b) <= tail_mass / 2 (tails summed from their own ends, so small masses stay
    exact). ``tail_mass`` is a float or a [B] tensor.
    """
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
    return _law_from_windows(starts, windows, below + above, block_rel_width)


def binomial_count_law(participation_prob: torch.Tensor, num_others, *,
                       tail_mass=1e-12, block_rel_width: float = 1e-3) -> CountLaw:
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
    """
    import numpy as np
    from scipy.stats import binom

    p = torch.as_tensor(participation_prob, dtype=_DT).reshape(-1)
    dev = p.device
    B = p.shape[0]
    N = torch.as_tensor(num_others, dtype=_DT).reshape(-1).expand(B).cpu().numpy().astype(np.int64)
    tm = torch.as_tensor(tail_mass, dtype=_DT).reshape(-1).expand(B).cpu().numpy()
    pn = p.cpu().numpy()
    lo = np.maximum(binom.ppf(tm / 2, N, pn), 0).astype(np.int64)
    hi = np.minimum(binom.isf(tm / 2, N, pn), N).astype(np.int64)
    hi = np.maximum(hi, lo)
    below = np.where(lo > 0, binom.cdf(lo - 1, N, pn), 0.0)
    above = np.where(hi < N, binom.sf(hi, N, pn), 0.0)
    windows = [torch.as_tensor(binom.pmf(np.arange(lb, hb + 1), n, q), dtype=_DT, device=dev)
               for lb, hb, n, q in zip(lo, hi, N, pn)]
    return _law_from_windows(lo.tolist(), windows,
                             torch.as_tensor(below + above, dtype=_DT, device=dev), block_rel_width)


def poisson_binomial_count_law(others_prob: torch.Tensor, *, tail_mass: float = 1e-12,
                               block_rel_width: float = 1e-3) -> CountLaw:
    """Law of n = sum of independent Bernoulli(others_prob) (exact Poisson-binomial).

    Parameters
    ----------
    others_prob : [B, K - 1], float, participation probabilities of the other users.
    """
    from otafl.privacy.concentration import poisson_binomial_pmf

    q = torch.as_tensor(others_prob, dtype=_DT)
    if q.dim() == 1:
        q = q[None]
    return _blocks_from_pmf(poisson_binomial_pmf(q), tail_mass, block_rel_width)


# --------------------------------------------------------------------------------------
# delta(eps) and eps(delta) of one round
# --------------------------------------------------------------------------------------

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
    """

    participation_prob: torch.Tensor
    own_noise_var: torch.Tensor
    others_noise_var: torch.Tensor
    channel_noise_var: torch.Tensor
    half_sensitivity: torch.Tensor
    law: CountLaw
    dim: int | None


def _col(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, 1)


@dataclass(frozen=True)
class TotalLaw:
    """The round seen through the *total* count m = n + 1{k takes part} (eq. 5).

    Attributes ([B, M], float64): ``m`` counts, ``weight`` P(m), ``share`` pi_m =
    P(k takes part | m); ``dropped`` [B] the mass outside (added to delta).
    """

    m: torch.Tensor
    weight: torch.Tensor
    share: torch.Tensor
    dropped: torch.Tensor


def total_count_law(spec: RoundSpec) -> TotalLaw | None:
    r"""Law of the total count m and P(k in | m), from the window of the others' law.

    Conditioning on m instead of n is the other natural use of joint convexity (the law
    of m does not depend on the data either):

        P = sum_m P(m) [(1 - pi_m) N(0, w_m) + pi_m N(+a, W_m)],                        (5)
        w_m = m sigma_o^2 + N0/c^2,  W_m = w_m + sigma_k^2 - sigma_o^2,
        P(m) = (1 - p) P_o(m) + p P_o(m - 1),  pi_m = p P_o(m - 1) / P(m),

    P_o the law of the others. With sigma_k = sigma_o both branches have the same
    variance: s no longer tells whether k took part, and (5) is a family of 1-D
    subsampled-Gaussian pairs with rate pi_m (about p) and all m participants' noise.
    Only outcomes with n in the window [lo, hi] enter (m in [lo, hi + 1]; at m = lo
    only "k absent" is in the window, pi = 0; at m = hi + 1 only "k present", pi = 1);
    the rest is the same dropped mass as for eq. (1). None when the law lumps blocks.
    """
    law = spec.law
    if not torch.equal(law.n_first, law.n_last) or law.n_first.shape[1] < 1:
        return None
    p = spec.participation_prob.to(_DT)[:, None]
    wt = law.weight  # P_o(lo + j), j = 0..N-1 (zero on padding)
    zero = wt.new_zeros(wt.shape[0], 1)
    absent = (1 - p) * torch.cat([wt, zero], 1)   # k absent, n = m
    present = p * torch.cat([zero, wt], 1)        # k present, n = m - 1
    weight = absent + present
    share = torch.where(weight > 0, present / weight.clamp(min=1e-300), torch.zeros_like(weight))
    m = law.n_first[:, :1] + torch.arange(wt.shape[1] + 1, dtype=_DT, device=wt.device)
    return TotalLaw(m=m, weight=weight, share=share, dropped=law.dropped.clamp(max=1.0))


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
                conditioning: str = "best") -> RoundCells:
    """Build the eps-independent s cells of a round once (reused by every eps)."""
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
        return s_cells(pb, wb, sb, spec.dim, grid)

    first = last = None
    if conditioning in ("best", "others"):
        first = build(p, w_first, s2)
        last = first if torch.equal(spec.law.n_first, spec.law.n_last) else build(p, w_last, s2)
    total = total_count_law(spec) if conditioning in ("best", "total") else None
    tcells = None
    if total is not None:
        share, w, extra = _total_params(spec, total)
        if bool((extra > 0).any()):
            tcells = build(share, w, extra)
    return RoundCells(first, last, tcells)


def round_delta(eps: torch.Tensor, spec: RoundSpec, *, grid: CellGrid = DEFAULT_GRID,
                cells: RoundCells | None = None, conditioning: str = "best"
                ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Bounds on the round's profile by joint convexity, eq. (1) and eq. (5).

    Parameters
    ----------
    eps : [B] or [B, E], float64, >= 0.
    spec : the round, batched over B.
    grid : s cells (ignored when ``cells`` is given).
    cells : ``round_cells(spec, grid)``, to reuse across calls.
    conditioning : "others" (reveal n, eq. 1), "total" (reveal m, eq. 5) or "best" (the
        smaller of the two; both are upper bounds on the same delta).

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
    if cells is None:
        cells = round_cells(spec, grid, conditioning)
    law = spec.law
    p, s2, a, w_first, w_last = _round_params(spec)
    e = eps[:, :, None]
    upper = lower = None
    if conditioning in ("best", "others"):
        up, lo = conditional_delta(e, participation_prob=p, absent_var=w_first, own_noise_var=s2,
                                   half_sensitivity=a, dim=spec.dim, cells=cells.first)
        if cells.last is not cells.first:
            _, lo = conditional_delta(e, participation_prob=p, absent_var=w_last,
                                      own_noise_var=s2, half_sensitivity=a, dim=spec.dim,
                                      cells=cells.last)
        wgt = law.weight[:, None, :]
        upper = ((wgt * up).sum(-1) + law.dropped[:, None]).clamp(max=1.0)
        lower = (wgt * lo).sum(-1)
    total = total_count_law(spec) if conditioning in ("best", "total") else None
    if total is not None:
        share, w, extra = _total_params(spec, total)
        up, lo = conditional_delta(e, participation_prob=share, absent_var=w, own_noise_var=extra,
                                   half_sensitivity=a, dim=spec.dim, cells=cells.total)
        wgt = total.weight[:, None, :]
        t_up = ((wgt * up).sum(-1) + total.dropped[:, None]).clamp(max=1.0)
        t_lo = (wgt * lo).sum(-1)
        upper = t_up if upper is None else torch.minimum(upper, t_up)
        lower = t_lo if lower is None else torch.minimum(lower, t_lo)
    elif upper is None:
        raise OtaflInputError("conditioning = 'total' needs the law of n per count "
                              "(fewer than 1 / block_rel_width users)")
    if squeeze:
        return upper[:, 0], lower[:, 0]
    return upper, lower


def take_rows(spec: RoundSpec, idx: torch.Tensor) -> RoundSpec:
    """The rows ``idx`` of a batched RoundSpec."""
    law = spec.law
    return RoundSpec(spec.participation_prob[idx], spec.own_noise_var[idx],
                     spec.others_noise_var[idx], spec.channel_noise_var[idx],
                     spec.half_sensitivity[idx],
                     CountLaw(law.n_first[idx], law.n_last[idx], law.weight[idx], law.dropped[idx]),
                     spec.dim)


def round_epsilon(delta_target: torch.Tensor, spec: RoundSpec, *,
                  grid: CellGrid = DEFAULT_GRID, conditioning: str = "best",
                  xtol: float = 1e-9, max_eps: float = 1e4) -> torch.Tensor:
    """Smallest eps (to ``xtol`` relative) whose *upper* bound delta(eps) <= delta_target.

    The profile is non-increasing and convex in eps, so the root of
    log delta(eps) - log delta_target is bracketed and found by the Illinois variant of
    regula falsi (bisection where a step leaves the bracket). The returned value is the
    upper end of the final bracket, so delta(eps) <= delta_target holds there.

    With ``conditioning="best"`` the eps of eq. (5) (cheap: 1-D when the noises are equal)
    is found first; eq. (1) is solved only for rows where its delta at that eps is
    already below the target (then, and only then, its eps is smaller). The result is
    min(eps_(1), eps_(5)), the eps of min(delta_(1), delta_(5)).

    Parameters
    ----------
    delta_target : [B] or scalar, float64 in (0, 1).
    spec : the round, batched over B.
    conditioning : "best", "others" (eq. 1) or "total" (eq. 5).

    Returns
    -------
    eps : [B], float64; 0 where delta(0) <= target; +inf where delta(max_eps) > target.
    """
    B = spec.participation_prob.reshape(-1).shape[0]
    dev = spec.participation_prob.device
    t = torch.as_tensor(delta_target, dtype=_DT, device=dev).expand(B).clone()
    log_t = torch.log(t)
    if conditioning == "best" and total_count_law(spec) is not None:
        kw = dict(grid=grid, xtol=xtol, max_eps=max_eps)
        e_t = round_epsilon(t, spec, conditioning="total", **kw)
        probe = torch.where(torch.isfinite(e_t), e_t, torch.full_like(e_t, max_eps))
        d_o, _ = round_delta(probe, spec, grid=grid, conditioning="others")
        need = torch.nonzero((d_o <= t) | ~torch.isfinite(e_t)).reshape(-1)
        if need.numel():
            e_o = round_epsilon(t[need], take_rows(spec, need), conditioning="others", **kw)
            e_t[need] = torch.minimum(e_t[need], e_o)
        return e_t
    if conditioning == "best":
        conditioning = "others"
    cells = round_cells(spec, grid, conditioning)

    def f(x):
        up, _ = round_delta(x, spec, cells=cells, conditioning=conditioning)
        return torch.log(up) - log_t

    lo = torch.zeros(B, dtype=_DT, device=dev)
    f_lo = f(lo)
    zero = f_lo <= 0
    hi = torch.ones(B, dtype=_DT, device=dev)
    if spec.dim is not None and spec.dim > 1:
        # Start from the dimension-free bound (closed form per n, cheap): it is an upper
        # bound on delta, so its eps brackets ours from above.
        free = RoundSpec(spec.participation_prob, spec.own_noise_var, spec.others_noise_var,
                         spec.channel_noise_var, spec.half_sensitivity, spec.law, None)
        e_free = round_epsilon(t, free, xtol=1e-3, max_eps=max_eps, conditioning=conditioning)
        hi = torch.where(torch.isfinite(e_free) & (e_free > 0), e_free, hi)
    f_hi = f(hi)
    while True:
        grow = (f_hi > 0) & ~zero & (hi < max_eps)
        if not bool(grow.any()):
            break
        lo = torch.where(grow, hi, lo)
        f_lo = torch.where(grow, f_hi, f_lo)
        hi = torch.where(grow, 2 * hi, hi)
        f_hi = torch.where(grow, f(hi), f_hi)
    unbounded = (f_hi > 0) & ~zero
    active = ~zero & ~unbounded
    side = torch.zeros(B, dtype=torch.int8, device=dev)  # which end moved last: -1 lo, +1 hi
    for _ in range(200):
        active = active & (hi - lo > xtol * (1 + hi))  # converged rows are frozen
        if not bool(active.any()):
            break
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        ok = torch.isfinite(x) & (x > lo) & (x < hi)
        x = torch.where(ok, x, 0.5 * (lo + hi))
        fx = f(x)
        below = fx <= 0  # x satisfies the target: new upper end
        hi_new = torch.where(below, x, hi)
        lo_new = torch.where(below, lo, x)
        # Illinois: halve the stale end's function value when the same end moves twice.
        f_lo_new = torch.where(below, torch.where(side == 1, f_lo / 2, f_lo), fx)
        f_hi_new = torch.where(below, fx, torch.where(side == -1, f_hi / 2, f_hi))
        side_new = torch.where(below, torch.ones_like(side), -torch.ones_like(side))
        hi = torch.where(active, hi_new, hi)
        lo = torch.where(active, lo_new, lo)
        f_lo = torch.where(active, f_lo_new, f_lo)
        f_hi = torch.where(active, f_hi_new, f_hi)
        side = torch.where(active, side_new, side)
    out = torch.where(zero, torch.zeros_like(hi), hi)
    return torch.where(unbounded, torch.full_like(hi, math.inf), out)


def local_count_law(batch: int, device=None) -> CountLaw:
    """n = 0 with probability one (local DP: the others may collude with the server)."""
    z = torch.zeros(batch, 1, dtype=_DT, device=device)
    return CountLaw(n_first=z, n_last=z, weight=torch.ones_like(z),
                    dropped=torch.zeros(batch, dtype=_DT, device=device))


# --------------------------------------------------------------------------------------
# Rows of a round: central (one per noise group) and local (one per distinct user)
# --------------------------------------------------------------------------------------

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
    group; delta is increasing in p_own and decreasing in n). The others' noise is the
    smallest sigma^2 of the users who can take part. With uniform p and sigma this is
    exactly one row with n ~ Binomial(K - 1, p).
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
    rows, laws, point, target = [], [], [], []
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
            laws.append(law)
            point.append(b)
            target.append(float(delta[b]))
    return RoundRows(spec=_spec(rows, stack_laws(laws), dim, dev),
                     point=torch.tensor(point, dtype=torch.long, device=dev),
                     target=torch.tensor(target, dtype=_DT, device=dev))


def local_rows(*, participation_prob: torch.Tensor, noise_var: torch.Tensor,
               channel_noise_var: torch.Tensor, sensitivity: torch.Tensor, dim: int | None,
               delta_l: torch.Tensor, uniform: bool) -> RoundRows:
    """Local-DP rows: one per distinct (p_k, sigma_k^2) with p_k > 0, target p_k delta_l.

    Parameters as in :func:`central_rows` (``uniform``: inputs are [B], one user type).
    n = 0: the other users may collude with the server and cancel their contributions.
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
        pv = torch.stack([participation_prob[b].to(_DT), noise_var[b].to(_DT)], 1)
        pv = pv[pv[:, 0] > 0]
        for p, s2 in (torch.unique(pv, dim=0).tolist() if len(pv) else []):
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


# --------------------------------------------------------------------------------------
# The accountant (interface of otafl.privacy.accountants)
# --------------------------------------------------------------------------------------

def exact_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                delta_prime="auto", users=None, dim=None, grid: CellGrid = DEFAULT_GRID):
    r"""Per-round LDP and central DP by numerical integration (spec: Accountant ``exact``).

    Same arguments as ``paper_round``/``tight_round`` (see
    :func:`otafl.privacy.accountants.prepare_round`). ``dim=None`` gives the
    dimension-free bound (d -> inf, participation revealed by the norm; valid for every
    d, cheap, but without the amplification that a finite d leaves). ``delta_prime`` is
    validated but unused: there is no concentration step.

    - central: eps at delta = delta_l of eq. (1) (worst user group, see
      :func:`central_rows`); ``delta_central`` = delta_l, at most ``tight``'s
      q delta_l + delta'. The per-round numbers are directly comparable.
    - local: for each user, eps at delta = p_k delta_l with n = 0 (only the user's own
      noise and the channel protect it); the worst user is reported, ``delta_local`` =
      max_k p_k delta_l (as ``paper``/``tight``). Unlike ``tight``'s LDP this does not
      assume user k's noise is present when it is absent: in high dimension with little
      channel noise the residual's norm reveals participation and the sampling
      amplification disappears, so ``exact``'s LDP can exceed ``tight``'s.

    The RDP views of :class:`RoundBound` are ``None`` (the sampled-Gaussian view is the
    fixed-noise model that ``exact`` does not assume): compose ``exact`` with
    :func:`compose_exact` (privacy-loss distributions), or basic/advanced composition.
    ``quantile`` is the smallest number of participants (n + 1) the central sum keeps:
    P(|K_t| < quantile) is at most the truncated tail mass, min(1e-12, 1e-6 delta_l),
    which is charged to delta. ``delta_prime`` is 0.
    """
    from otafl.privacy.accountants import (
        REASON_NO_CENTRAL_NOISE,
        REASON_NO_LOCAL_NOISE,
        RoundBound,
        prepare_round,
    )

    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var,
                      alignment_gain=alignment_gain, n0=n0, sensitivity=sensitivity,
                      delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    b = x.batch
    B = math.prod(b)
    dev = x.participation_prob.device

    def flat(t, users_dim=False):
        if users_dim:
            return torch.broadcast_to(t, (*b, t.shape[-1])).reshape(B, t.shape[-1])
        return torch.broadcast_to(t, b).reshape(B)

    if x.uniform:
        p_all, s2_all = flat(x.participation_prob[..., 0]), flat(x.noise_var[..., 0])
        users_flat = flat(x.users)
    else:
        p_all = flat(x.participation_prob, True)
        s2_all = torch.broadcast_to(x.noise_var, p_all.shape) if x.noise_var.shape[-1] == 1 \
            else flat(x.noise_var, True)
        users_flat = None
    ch, sens, dl = flat(x.channel_noise_var), flat(x.sensitivity), flat(x.delta_l)
    dims = flat(x.dim).round().long() if x.dim is not None else torch.zeros(B, dtype=torch.long,
                                                                           device=dev)
    eps_c = torch.zeros(B, dtype=_DT, device=dev)
    eps_l = torch.zeros(B, dtype=_DT, device=dev)
    fewest = torch.zeros(B, dtype=_DT, device=dev)
    for d in torch.unique(dims).tolist():
        idx = torch.nonzero(dims == d).reshape(-1)
        sub = lambda t: None if t is None else t[idx]  # noqa: E731
        dd = None if d == 0 else int(d)
        crow = central_rows(participation_prob=sub(p_all), noise_var=sub(s2_all),
                            channel_noise_var=sub(ch), sensitivity=sub(sens), dim=dd,
                            delta=sub(dl), users=sub(users_flat))
        lrow = local_rows(participation_prob=sub(p_all), noise_var=sub(s2_all),
                          channel_noise_var=sub(ch), sensitivity=sub(sens), dim=dd,
                          delta_l=sub(dl), uniform=x.uniform)
        eps_c[idx], fewest[idx] = rows_epsilon(crow, len(idx), grid=grid)
        eps_l[idx], _ = rows_epsilon(lrow, len(idx), grid=grid)
    shape = lambda t: t.reshape(b)  # noqa: E731
    no_central = (x.min_noise_var == 0) & (x.channel_noise_var == 0)
    no_local = no_central if x.uniform else (
        ((x.noise_var + x.channel_noise_var.unsqueeze(-1)) == 0)
        & (x.participation_prob > 0)).any(-1)
    eps_c, eps_l = shape(eps_c), shape(eps_l)
    reason = (torch.isinf(eps_c) & no_central).long() * REASON_NO_CENTRAL_NOISE \
        + (torch.isinf(eps_l) & no_local).long() * REASON_NO_LOCAL_NOISE
    grid_ = lambda t: torch.broadcast_to(t, b)  # noqa: E731
    true = torch.ones((), dtype=torch.bool, device=dev)
    return RoundBound(
        epsilon_local=eps_l, delta_local=grid_(x.max_participation_prob * x.delta_l),
        epsilon_central=eps_c, delta_central=grid_(x.delta_l), users=grid_(x.users),
        mean_participants=grid_(x.mean_participants),
        delta_prime=grid_(torch.zeros((), dtype=_DT, device=dev)),
        quantile=fewest.reshape(b),
        central_noise_std=None, central_sampling_rate=None, local_noise_std=None,
        local_sampling_rate=None, sensitivity=grid_(x.sensitivity), classic_valid=grid_(true),
        classic_valid_local=grid_(true), reason=grid_(reason))


# --------------------------------------------------------------------------------------
# Composition over rounds: pessimistic privacy-loss distributions (dp_accounting)
# --------------------------------------------------------------------------------------

def _facts_key(f) -> tuple:
    return (tuple(f.participation_prob.tolist()), tuple(f.noise_var.tolist()),
            float(f.alignment_gain), float(f.n0), float(f.sensitivity), int(f.dim))


def _facts_rows(f, kind: str, delta_l: float, delta_target: float) -> RoundRows:
    dev = f.participation_prob.device
    p = f.participation_prob.to(_DT)[None]
    s2 = torch.broadcast_to(f.noise_var.to(_DT), p.shape[1:])[None]
    c = float(f.alignment_gain)
    ch = torch.tensor([0.0 if f.n0 == 0 else f.n0 / (c * c)], dtype=_DT, device=dev)
    sens = torch.tensor([float(f.sensitivity)], dtype=_DT, device=dev)
    tm = min(1e-15, 1e-6 * delta_target)
    if kind == "central":
        return central_rows(participation_prob=p, noise_var=s2, channel_noise_var=ch,
                            sensitivity=sens, dim=int(f.dim), delta=sens.new_tensor([delta_l]),
                            tail_mass=tm)
    return local_rows(participation_prob=p, noise_var=s2, channel_noise_var=ch, sensitivity=sens,
                      dim=int(f.dim), delta_l=sens.new_tensor([delta_l]), uniform=False)


def _lower_convex_envelope(x, y):
    """Greatest convex minorant of the points (x_i, y_i) (x increasing), at the x_i.

    A true privacy profile is convex in x = e^eps; where it lies below every point it
    lies below this envelope too, so replacing min(delta_(1), delta_(5)) (not convex in
    general) by its envelope keeps the connect-the-dots PLD pessimistic.
    """
    import numpy as np

    hull = [0]
    for i in range(1, len(x)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b if it lies on or above the segment a -> i
            if (y[b] - y[a]) * (x[i] - x[a]) >= (y[i] - y[a]) * (x[b] - x[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return np.interp(x, x[hull], y[hull])


def compose_exact(facts, *, delta_target: float, kind: str = "central", rounds: int | None = None,
                  points: int = 64, grid: CellGrid = DEFAULT_GRID, chunk: int = 8) -> dict:
    r"""Total epsilon over rounds of the ``exact`` accountant, via privacy-loss distributions.

    For every distinct round we evaluate the upper bound delta_t(eps) of eq. (1) on the
    fixed-gap grid eps_i = i * gap, i = 0..``points``, up to eps_max where
    delta_t(eps_max) <= 1e-3 * delta_target / T (the rest is left as the PLD's infinite
    mass, which is pessimistic). The round's pair is symmetric (u -> -u swaps P and Q),
    so for eps < 0, delta(eps) = 1 - e^eps + e^eps delta(-eps). With several user groups
    (central) or users (local) in a round, the pointwise maximum of their profiles is
    used: it is again convex in e^eps and dominates every user. From these values
    dp_accounting builds the pessimistic connect-the-dots PLD (Doroshenko, Ghazi, Kamath,
    Kumar & Manurangsi 2022, Alg. 1; ``create_pmf_pessimistic_connect_dots_fixed_gap``),
    whose profile is the chord through the points, above every convex profile through
    (or below) them; the PLDs are composed by FFT and converted at ``delta_target``.
    Since the reported profile is min(delta_(1), delta_(5)), which need not be convex, its
    greatest convex minorant in e^eps is used (still above the true, convex, profile).

    Parameters
    ----------
    facts : a :class:`otafl.privacy.facts.RoundFacts`, or a list of them (one per round).
    delta_target : total delta of the run, in (0, 1).
    kind : "central" (delta_l of the rows is irrelevant here) or "local".
    rounds : with a single RoundFacts, the number of identical rounds T.
    points : grid points on [0, eps_max] (the gap is eps_max / points, common to all
        rounds). The chords make the result pessimistic by ~0.2% in eps at 50 points
        (checked against the Gaussian mechanism composed in closed form).
    chunk : eps points per batched evaluation (memory).

    Returns
    -------
    dict: ``epsilon`` (float), ``delta`` (= delta_target), ``rounds`` (T), ``gap`` (the
    PLD's discretisation interval), ``distinct_rounds``.
    """
    import numpy as np
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    check_range("delta_target", delta_target, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if kind not in ("central", "local"):
        raise OtaflInputError(f"kind = {kind!r} is outside the allowed range {{central, local}}")
    if not isinstance(facts, (list, tuple)):
        facts = [facts] * int(rounds if rounds is not None else 1)
    elif rounds is not None:
        raise OtaflInputError("rounds is only for a single RoundFacts (a list already has its rounds)")
    T = len(facts)
    if T < 1:
        raise OtaflInputError("facts = [] is outside the allowed range (at least one round)")
    counts: dict[tuple, int] = {}
    first: dict[tuple, object] = {}
    for f in facts:
        key = _facts_key(f)
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, f)
    floor = 1e-3 * delta_target / T
    prepared = []
    eps_max = 0.0
    for key, f in first.items():
        rows = _facts_rows(f, kind, delta_target, delta_target)
        if rows.point.numel() == 0:
            continue  # nobody can take part: no leakage
        target = torch.full_like(rows.target, floor)
        e_hi = float(round_epsilon(target, rows.spec, grid=grid, xtol=1e-3).max())
        if not math.isfinite(e_hi):
            return {"epsilon": math.inf, "delta": delta_target, "rounds": T, "gap": math.nan,
                    "distinct_rounds": len(first)}
        eps_max = max(eps_max, e_hi)
        prepared.append((key, rows))
    if not prepared:
        return {"epsilon": 0.0, "delta": delta_target, "rounds": T, "gap": math.nan,
                "distinct_rounds": len(first)}
    gap = max(eps_max, 1e-6) / points
    eps_grid = gap * torch.arange(points + 1, dtype=_DT)
    total = None
    for key, rows in prepared:
        spec = rows.spec
        cells = round_cells(spec, grid)
        R = spec.law.weight.shape[0]
        e_all = eps_grid.to(spec.participation_prob.device)
        pos = torch.cat([round_delta(e_all[i:i + chunk].expand(R, -1), spec, cells=cells)[0].amax(0)
                         for i in range(0, points + 1, chunk)]).cpu().numpy()
        pos = np.minimum.accumulate(np.clip(pos, 0.0, 1.0))
        e_np = eps_grid.numpy()
        pos = _lower_convex_envelope(np.exp(e_np), pos)
        neg = 1.0 - np.exp(-e_np) + np.exp(-e_np) * pos  # delta(-eps_i)
        deltas = np.concatenate([neg[::-1], pos[1:]])
        pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(gap, -points, points, deltas)
        pld = PrivacyLossDistribution(pmf)
        n = counts[key]
        pld = pld.self_compose(n) if n > 1 else pld
        total = pld if total is None else total.compose(pld)
    return {"epsilon": float(total.get_epsilon_for_delta(delta_target)), "delta": delta_target,
            "rounds": T, "gap": gap, "distinct_rounds": len(first)}


round_bound = exact_round
"""The registry's name for :func:`exact_round` (``lazy_round_bound("otafl.privacy.exact:round_bound")``)."""
