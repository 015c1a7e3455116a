r"""The hockey-stick divergence of one-dimensional Gaussian mixtures (the ``exact`` accountant's kernel).

For a user who takes part with probability pi, the server's output along the direction
of the user's gradient is the pair

    P = (1 - pi) N(0, w) + pi N(+a, W)    vs    Q = (1 - pi) N(0, w) + pi N(-a, W),

w <= W: the noise without and with the user's own noise, a = Delta / 2 (gradient units).
For eps >= 0 and w < W the set where p_P - e^eps p_Q > 0 is a half-line (u_1, inf),
u_1 > eps W / (2a), so

    h_eps(pi) = pi Qbar((u_1 - a)/sqrt W) - pi e^eps Qbar((u_1 + a)/sqrt W)
                - (1 - pi)(e^eps - 1) Qbar(u_1 / sqrt w),                              (3)

with u_1 the root of the log likelihood ratio L(u) = eps, found by bracketed Newton
steps. For any bracket lo <= u_1 <= hi, (3) at lo is a lower bound and (3) at hi plus
(hi - lo) max_{[lo, hi]} pi phi_W(u - a) an upper bound (the integrand is at most
pi phi_W(u - a)). At pi = 1 the pair is the Gaussian mechanism (Balle & Wang 2018, Thm 8;
:func:`otafl.privacy.analysis.gaussian.gaussian_hockey_stick`). Derivation: see
docs/privacy/exact.md#exact. Pure, batched, float64 on the device of the inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from otafl.privacy.analysis.gaussian import exp_diff, log_expm1

__all__ = ["mixture_hockey_stick", "equal_variance_upper", "zero_eps_value"]

_LOG2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_DT = torch.float64
NEWTON_NEAR = 1e-6
"""Relative Newton step below which :func:`mixture_hockey_stick` stops iterating and takes the
step unevaluated (the next error, about the step squared, is below the 4 rtol bracket the
tightening certifies). Measured on the paper preset's run (issue 31): a quarter fewer Newton
evaluations (3.86 -> 2.87 million), 2.5 % more tightening ones, the same bounds."""


def _log_ndtr_upper(z: torch.Tensor) -> torch.Tensor:
    """log Qbar(z) = log P(N(0,1) > z), accurate in both tails."""
    return torch.special.log_ndtr(-z)


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
    log_neg0 = log_1mpi + log_expm1(eps) + _log_ndtr_upper(u / w.sqrt())
    return exp_diff(log_pos, torch.logaddexp(log_neg1, log_neg0))


def _ratio_consts(cA, cB, iw, iW, a):
    """(k0, k1, ka) of :func:`_ratio_terms` from cA = log(1 - pi) - log(w) / 2, cB = log(pi) -
    log(W) / 2, iw = 1 / w, iW = 1 / W: with A, B, C the log-densities of the absent branch and
    the present ones at +a and -a, A - (B + C) / 2 = k0 + k1 u^2 and (B - C) / 2 = ka u."""
    return cA - cB + 0.5 * a * a * iW, 0.5 * (iW - iw), a * iW


def _softplus(x):
    """log(1 + e^x), exact in both tails (torch's softplus turns linear above a threshold)."""
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))


def _ratio_terms(u, eps, k0, k1, ka):
    """G(u) = L(u) - eps and dG/du: the Newton loop's kernel. With D = A - (B + C) / 2 and
    t = (B - C) / 2, L = log(e^A + e^B) - log(e^A + e^C) = 2 t + softplus(D - t) - softplus(D + t),
    and dL/du = sigmoid(D - t) (2 k1 u - ka) - sigmoid(D + t) (2 k1 u + ka) + 2 ka
    (:func:`_likelihood_ratio` in fewer operations)."""
    D = k0 + k1 * (u * u)
    t = ka * u
    x1, x2 = D - t, D + t
    G = 2 * t + _softplus(x1) - _softplus(x2) - eps
    v = 2 * k1 * u
    dG = torch.sigmoid(x1) * (v - ka) - torch.sigmoid(x2) * (v + ka) + 2 * ka
    return G, dG


def _ratio_value(u, eps, k0, k1, ka):
    """G(u) = L(u) - eps alone (:func:`_ratio_terms` without the derivative): where only its sign
    is read (bracket ends)."""
    D = k0 + k1 * (u * u)
    t = ka * u
    return 2 * t + _softplus(D - t) - _softplus(D + t) - eps


def mixture_hockey_stick(eps: torch.Tensor, *, log_odds: torch.Tensor, absent_var: torch.Tensor,
                         present_var: torch.Tensor, half_sensitivity: torch.Tensor,
                         max_iter: int = 200, rtol: float = 1e-13, quick: bool = True,
                         lower: bool = True, upper: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    r"""Bounds on h_eps(pi) for (1-pi) N(0, w) + pi N(+a, W) vs (1-pi) N(0, w) + pi N(-a, W).

    Eq. (3) of the module docstring with the root u_1 of L(u) = eps bracketed by Newton
    steps safeguarded by bisection. The initial bracket is explicit: L(eps W / 2a) <= eps
    and L(u) >= B - max(A, C) - log 2 >= eps beyond the larger root of a quadratic.
    The iterations run on the elements not yet converged only (compacted), so a batch
    costs its elements' own iterations, not its slowest element's times its size. The last
    Newton step, once below :data:`NEWTON_NEAR`, is taken without evaluating its point; the
    tightening certifies the bracket as for every element, so each element's bounds are those
    of :func:`mixture_hockey_stick_reference` up to rounding (its bracket's width the same).

    Parameters
    ----------
    eps : [...], float64, >= 0 (nats).
    log_odds : [...], float64, logit(pi), may be +inf (pi = 1) but not -inf.
    absent_var : [...], float64, w > 0 (ignored where pi = 1).
    present_var : [...], float64, W >= w, W > 0.
    half_sensitivity : [...], float64, a > 0.

    Where w = W (eq. (5) with equal noises) the root is the closed form of
    :func:`_equal_variances`, certified by the sign of L(u) - eps on both sides of it, and
    the bracketed iteration runs only where that fails (``quick=False``: never skipped).

    ``lower=False`` leaves the lower bound out (returned as None; the upper bound is the
    same): the profiles and roots of the accountants read the upper bound only.
    ``upper=False`` (with ``lower``) leaves the upper bound out (None) and takes the lower
    bound at the Newton point itself, uncertified: eq. (3) at *any* u is at most h_eps (u_1
    maximises it), so no bracket is needed, and the tightening is skipped (the d = 1 floors
    that screen eq. (1) read the lower bound only).

    Returns
    -------
    upper, lower : [...], float64, lower <= h_eps(pi) <= upper (lower None with ``lower=False``).
    """
    eps, lam, w, W, a = torch.broadcast_tensors(*(torch.as_tensor(x, dtype=_DT) for x in
                                                  (eps, log_odds, absent_var, present_var,
                                                   half_sensitivity)))
    shape = eps.shape
    eps, lam, w, W, a = (t.reshape(-1) for t in (eps, lam, w, W, a))
    if not upper and not lower:
        raise ValueError("mixture_hockey_stick: at least one of upper and lower is needed")
    if quick:
        got = _equal_variances(eps, lam, w, W, a, rtol, lower)
        if got is not None:
            sel, upper_q, lower_q = got
            if sel is None:  # every element certified by the closed form
                return (upper_q.reshape(shape) if upper else None), (lower_q.reshape(shape) if lower else None)
            rest = torch.ones_like(eps, dtype=torch.bool)
            rest[sel] = False
            upper_all = torch.empty_like(eps)
            low = torch.empty_like(eps) if lower else None
            upper_all[sel] = upper_q
            if lower:
                low[sel] = lower_q
            if bool(rest.any()):
                u_r, l_r = mixture_hockey_stick(
                    eps[rest], log_odds=lam[rest], absent_var=w[rest], present_var=W[rest],
                    half_sensitivity=a[rest], max_iter=max_iter, rtol=rtol, quick=False, lower=lower, upper=upper)
                if upper:
                    upper_all[rest] = u_r
                if lower:
                    low[rest] = l_r
            return (upper_all.reshape(shape) if upper else None), (low.reshape(shape) if lower else None)
    full = torch.isposinf(lam)
    w = torch.where(full, torch.ones_like(w), w)  # irrelevant where pi = 1; keeps logs finite
    log_pi = F.logsigmoid(lam)
    log_1mpi = torch.where(full, torch.full_like(lam, -math.inf), F.logsigmoid(-lam))

    u_star = eps * W / (2 * a)
    alpha = 0.5 / w - 0.5 / W
    beta = a / W
    gamma = lam + 0.5 * torch.log(w / W) - a * a / (2 * W) - eps - _LOG2
    disc = beta * beta - 4 * alpha * gamma
    r_plus = torch.where(disc >= 0, -2 * gamma / (beta + disc.clamp(min=0).sqrt()),
                         torch.full_like(gamma, -math.inf))
    hi = torch.maximum(torch.maximum(u_star, (eps + _LOG2) * W / (2 * a)), r_plus)
    hi = hi + 1e-12 * hi.abs() + 1e-300
    lo = torch.where(full, u_star, u_star.clone())
    hi = torch.where(full, u_star, hi)

    k0, k1, ka = _ratio_consts(log_1mpi - 0.5 * torch.log(w), log_pi - 0.5 * torch.log(W), 1.0 / w, 1.0 / W, a)
    g_lo = _ratio_value(lo, eps, k0, k1, ka)
    g_hi = _ratio_value(hi, eps, k0, k1, ka)
    g_lo = g_lo.clamp(max=0.0)
    g_hi = g_hi.clamp(min=0.0)

    def secant_or_mid(lo, hi, g_lo, g_hi):
        xs = lo - g_lo * (hi - lo) / (g_hi - g_lo)
        ok = torch.isfinite(xs) & (xs >= lo) & (xs <= hi)
        return torch.where(ok, xs, 0.5 * (lo + hi))

    x = torch.where(full, u_star, secant_or_mid(lo, hi, g_lo, g_hi))
    equal = (w == W) & ~full
    if bool(equal.any()):
        x_eq = _closed_form_root(eps, log_pi, log_1mpi, W, a)
        x = torch.where(equal & torch.isfinite(x_eq) & (x_eq >= lo) & (x_eq <= hi), x_eq, x)

    # Newton on the elements not yet converged (converged ones are frozen, as in the reference);
    # at eps = 0 the root is u = 0 (by symmetry; set below), nothing to iterate.
    iterate = ~full & (eps > 0)
    idx = torch.nonzero(iterate).reshape(-1)
    par = [t[idx] for t in (eps, k0, k1, ka)]
    xs, los, his, gls, ghs = (t[idx] for t in (x, lo, hi, g_lo, g_hi))
    log_e = torch.log(par[0])  # log eps, compacted with par
    for _ in range(max_iter):
        if idx.numel() == 0:
            break
        G, dG = _ratio_terms(xs, *par)
        pos = G > 0
        upd = torch.isfinite(G)
        up_pos, up_neg = upd & pos, upd & ~pos
        his = torch.where(up_pos, xs, his)
        ghs = torch.where(up_pos, G, ghs)
        los = torch.where(up_neg, xs, los)
        gls = torch.where(up_neg, G, gls)
        # Newton on log L(u) - log eps (same root and sign where L > 0): L grows like
        # exp(c u^2) where user k's branch is rare, and Newton on L itself then crawls
        # (steps of about 1 / (2 c u)); on its log it converges in a few steps.
        L = G + par[0]
        plain = G / dG
        step = torch.where((L > 0) & (par[0] > 0), L * (torch.log(L) - log_e) / dG, plain)
        step = torch.where(torch.isfinite(step), step, plain)
        x_new = xs - step
        bad = ~((x_new >= los) & (x_new <= his))
        x_next = torch.where(bad, secant_or_mid(los, his, gls, ghs), x_new)
        tol = rtol * (1.0 + xs.abs())
        now_done = (step.abs() < tol) | (his - los < tol) | (G == 0) | ~torch.isfinite(G)
        # A Newton step below NEWTON_NEAR lands within the final bracket's width of the root
        # (quadratic convergence): taken without evaluating G there, the tightening below
        # certifies its bracket (or widens it, as for any point).
        near = (step.abs() < NEWTON_NEAR * (1.0 + xs.abs())) & ~bad & ~now_done
        if bool(near.any()):
            now_done = now_done | near
            xs = torch.where(near, x_new, xs)
        if bool(now_done.any()):
            # Integer indices once (a boolean mask is turned into indices by every gather).
            done_i = torch.nonzero(now_done).reshape(-1)
            keep = torch.nonzero(~now_done).reshape(-1)
            fin = idx[done_i]
            x[fin], lo[fin], hi[fin] = xs[done_i], los[done_i], his[done_i]
            idx = idx[keep]
            par = [t[keep] for t in par]
            log_e = log_e[keep]
            xs, los, his, gls, ghs = x_next[keep], los[keep], his[keep], gls[keep], ghs[keep]
        else:
            xs = x_next
    if idx.numel():  # max_iter reached: the current brackets
        x[idx], lo[idx], hi[idx] = xs, los, his
    if not upper:  # eq. (3) at the Newton point: a lower bound wherever that point is (see above)
        x = torch.where((eps == 0) & ~full, torch.zeros_like(x), x)
        low = _tail_excess(x, eps, log_pi, log_1mpi, w, W, a).clamp(min=0.0)
        return None, low.reshape(shape)

    # Tighten the bracket around the Newton point on both sides (see the reference); only
    # the elements whose bracket is still wider than 2.5 tau are iterated again.
    idx = torch.nonzero(iterate).reshape(-1)
    par = [t[idx] for t in (eps, k0, k1, ka)]
    xs, los, his = x[idx], lo[idx], hi[idx]
    tau = 4 * rtol * (1.0 + xs.abs())
    for _ in range(40):
        for cand in (xs - tau, xs + tau):
            G = _ratio_value(cand, *par)
            inside = (cand > los) & (cand < his)
            los = torch.where(inside & (G <= 0), cand, los)
            his = torch.where(inside & (G > 0), cand, his)
        wide = his - los > 2.5 * tau
        lo[idx], hi[idx] = los, his
        if not bool(wide.any()):
            break
        wide = torch.nonzero(wide).reshape(-1)
        idx = idx[wide]
        par = [t[wide] for t in par]
        xs, los, his, tau = xs[wide], los[wide], his[wide], 4 * tau[wide]
    zero = (eps == 0) & ~full
    lo = torch.where(zero, torch.zeros_like(lo), lo)
    hi = torch.where(zero, torch.zeros_like(hi), hi)

    upper, low = _bracket_bounds(lo, hi, eps, log_pi, log_1mpi, w, W, a, lower)
    return upper.reshape(shape), (low.reshape(shape) if lower else None)


def _bracket_bounds(lo, hi, eps, log_pi, log_1mpi, w, W, a, with_lower: bool = True):
    """Eq. (3) at ``lo`` (a lower bound) and at ``hi`` plus (hi - lo) max pi phi_W(u - a)
    over the bracket (an upper bound), for any bracket lo <= u_1 <= hi (lower None
    without ``with_lower``)."""
    args = (eps, log_pi, log_1mpi, w, W, a)
    lower = _tail_excess(lo, *args).clamp(min=0.0) if with_lower else None
    dist = torch.clamp(torch.maximum(lo - a, a - hi), min=0.0)
    log_slack = (log_pi + torch.log(hi - lo) - dist * dist / (2 * W) - 0.5 * torch.log(W)
                 - _HALF_LOG_2PI)
    upper = _tail_excess(hi, *args).clamp(min=0.0) + torch.exp(log_slack)
    return upper, lower


def _equal_variances(eps, lam, w, W, a, rtol, with_lower: bool = True):
    """The elements with w = W, pi < 1 and eps > 0 whose closed-form root is certified, and
    their bounds: (index, upper, lower), or None when there are none.

    With equal variances L(u) is increasing in u (the ratio of pi e^{ua/W} + const to
    pi e^{-ua/W} + const) and its root is W log z / a, z the positive root of a quadratic
    (as in :func:`mixture_hockey_stick`'s start). The bracket [x - tau, x + tau], tau =
    4 rtol (1 + |x|) (the reference's final bracket width), is accepted where L - eps <= 0
    at its lower end and > 0 at its upper end; the root is then inside, and
    :func:`_bracket_bounds` gives the same bounds as the iteration's bracket would. The
    index is None where every element is (the bounds then in the elements' order)."""
    mask = (w == W) & ~torch.isposinf(lam) & (eps > 0) & (W > 0) & (a > 0)
    whole = bool(mask.all())  # every element (eq. (5)'s profiles): no gathers, index None
    cand = None if whole else torch.nonzero(mask).reshape(-1)
    if cand is not None and cand.numel() == 0:
        return None
    e, la, ww, aa = (eps, lam, W, a) if whole else (eps[cand], lam[cand], W[cand], a[cand])
    log_pi, log_1mpi = F.logsigmoid(la), F.logsigmoid(-la)
    lo, hi, ok = _closed_form_bracket(e, log_pi, log_1mpi, ww, aa, rtol)
    if bool(ok.all()):
        upper, lower = _bracket_bounds(lo, hi, e, log_pi, log_1mpi, ww, ww, aa, with_lower)
        return cand, upper, lower
    if not bool(ok.any()):
        return None
    sub = lambda t: t[ok]  # noqa: E731
    upper, lower = _bracket_bounds(sub(lo), sub(hi), sub(e), sub(log_pi), sub(log_1mpi), sub(ww), sub(ww), sub(aa),
                                   with_lower)
    return (torch.nonzero(ok).reshape(-1) if cand is None else cand[ok]), upper, lower


def _closed_form_root(eps, log_pi, log_1mpi, W, a):
    """The root of L(u) = eps where w = W: W log z / a, z the positive root of the quadratic in
    exp(u a / W) (:func:`_equal_variances`)."""
    log_2a = _LOG2 + log_pi - a * a / (2 * W)
    b = log_1mpi + log_expm1(eps)
    k = log_2a + eps / 2
    return W * (torch.logaddexp(b, 0.5 * torch.logaddexp(2 * b, 2 * k)) - log_2a) / a


def _closed_form_bracket(eps, log_pi, log_1mpi, W, a, rtol):
    """The certified bracket of :func:`_equal_variances` (w = W): (lo, hi, ok), [x - tau, x + tau]
    around the closed-form root x, ok where x is finite and L - eps is <= 0 at lo and > 0 at
    hi. Elementwise on broadcast shapes."""
    x = _closed_form_root(eps, log_pi, log_1mpi, W, a)
    tau = 4 * rtol * (1.0 + x.abs())
    half_log_W = 0.5 * torch.log(W)
    k0, k1, ka = _ratio_consts(log_1mpi - half_log_W, log_pi - half_log_W, 1.0 / W, 1.0 / W, a)
    lo, hi = x - tau, x + tau
    g_lo = _ratio_value(lo, eps, k0, k1, ka)
    g_hi = _ratio_value(hi, eps, k0, k1, ka)
    return lo, hi, torch.isfinite(x) & (g_lo <= 0) & (g_hi > 0)


def equal_variance_upper(eps: torch.Tensor, log_odds: torch.Tensor, var: torch.Tensor, half_sensitivity: torch.Tensor,
                         rtol: float = 1e-13) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mixture_hockey_stick`'s upper bound where w = W (eq. (5) with equal noises), on
    broadcast shapes: the terms that depend on pi and w alone (``log_odds``, ``var``:
    [R, 1, M], say) or on eps alone ([R, E, 1]) are computed once at their own shape, not
    at every (eps, count) element, and nothing is gathered.

    The same closed-form bracket (:func:`_closed_form_bracket`) and bounds
    (:func:`_bracket_bounds`) as :func:`_equal_variances`. Returns ``(upper, certified)``,
    both of the broadcast shape: ``upper`` is that bound where ``certified`` (0 < pi < 1,
    w > 0, eps > 0, a > 0, the bracket checked) and undefined elsewhere: the caller computes
    those elements another way.
    """
    lam, w, a = log_odds, var, half_sensitivity
    log_pi, log_1mpi = F.logsigmoid(lam), F.logsigmoid(-lam)
    lo, hi, ok = _closed_form_bracket(eps, log_pi, log_1mpi, w, a, rtol)
    upper, _ = _bracket_bounds(lo, hi, eps, log_pi, log_1mpi, w, w, a, with_lower=False)
    return upper, ok & (eps > 0) & (w > 0) & (a > 0) & torch.isfinite(lam)


def zero_eps_value(log_odds: torch.Tensor, absent_var: torch.Tensor, present_var: torch.Tensor,
                   half_sensitivity: torch.Tensor) -> torch.Tensor:
    """h_0(pi), the total variation distance of the pair, for 0 < pi < 1: eq. (3) at its root
    u_1 = 0 (p_P - p_Q = pi (phi_W(u - a) - phi_W(u + a)) is > 0 exactly for u > 0, whatever w),
    so pi (1 - 2 Qbar(a / sqrt W)). The value :func:`mixture_hockey_stick` gives at eps = 0 (its
    bracket is [0, 0] there), without its iterations; broadcast shapes."""
    lam = torch.as_tensor(log_odds, dtype=_DT)
    zero = torch.zeros((), dtype=_DT)
    return _tail_excess(zero, zero, F.logsigmoid(lam), F.logsigmoid(-lam), torch.as_tensor(absent_var, dtype=_DT),
                        torch.as_tensor(present_var, dtype=_DT), torch.as_tensor(half_sensitivity, dtype=_DT)
                        ).clamp(min=0.0)
