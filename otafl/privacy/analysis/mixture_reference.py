"""The previous implementation of :func:`otafl.privacy.analysis.mixture.mixture_hockey_stick`
(every element iterated until the slowest converges), kept as the reference that the tests
compare the compacted one with (tests/test_fast_exact.py). Not used by the accountants."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from otafl.privacy.analysis.gaussian import log_expm1
from otafl.privacy.analysis.mixture import _DT, _HALF_LOG_2PI, _LOG2, _likelihood_ratio, _tail_excess

__all__ = ["mixture_hockey_stick_reference"]


def mixture_hockey_stick_reference(eps: torch.Tensor, *, log_odds: torch.Tensor, absent_var: torch.Tensor,
                         present_var: torch.Tensor, half_sensitivity: torch.Tensor,
                         max_iter: int = 200, rtol: float = 1e-13, lower: bool = True, upper: bool = True
                         ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    r"""The previous (uncompacted) implementation of :func:`mixture_hockey_stick`, kept as
    the reference the tests compare it with.

    Bounds on h_eps(pi) for (1-pi) N(0, w) + pi N(+a, W) vs (1-pi) N(0, w) + pi N(-a, W).

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

    lower : False returns None for the lower bound (as :func:`mixture_hockey_stick`).
    upper : False returns None for the upper bound (the lower bound is the certified one).

    Returns
    -------
    upper, lower : [...], float64, lower <= h_eps(pi) <= upper.
    """
    want_lower, want_upper = lower, upper
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
    # Equal variances (w = W): with z = exp(u a / W), L(u) = eps is the quadratic
    # pi c z^2 - (1 - pi)(e^eps - 1) z - pi c e^eps = 0, c = exp(-a^2 / 2W); its positive root
    # (in log space) starts Newton at the answer, which then only confirms it.
    equal = (w == W) & ~full
    if bool(equal.any()):
        log_2a = _LOG2 + log_pi - a * a / (2 * W)
        b = log_1mpi + log_expm1(eps)  # log((1 - pi)(e^eps - 1)), -inf at eps = 0
        k = log_2a + eps / 2
        log_z = torch.logaddexp(b, 0.5 * torch.logaddexp(2 * b, 2 * k)) - log_2a
        x_eq = W * log_z / a
        x = torch.where(equal & torch.isfinite(x_eq) & (x_eq >= lo) & (x_eq <= hi), x_eq, x)
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
    # Tighten the bracket around the Newton point on both sides. Where L - eps is flat to
    # rounding there (large variances: L(u) ~ 2 u a / W), a step of tau may not change its
    # computed sign; the step then grows by 4x until it does (or reaches the bracket's end),
    # so a stale far end never inflates the slack term below.
    tau = 4 * rtol * (1.0 + x.abs())
    for _ in range(40):
        for cand in (x - tau, x + tau):
            G, _ = _likelihood_ratio(cand, *args)
            inside = (cand > lo) & (cand < hi) & ~full
            lo = torch.where(inside & (G <= 0), cand, lo)
            hi = torch.where(inside & (G > 0), cand, hi)
        if not bool(((hi - lo > 2.5 * tau) & ~full).any()):
            break
        tau = torch.where(hi - lo > 2.5 * tau, 4 * tau, tau)
    # eps = 0: L is odd in u (P and Q are mirror images), so its root is u = 0 exactly.
    zero = (eps == 0) & ~full
    lo = torch.where(zero, torch.zeros_like(lo), lo)
    hi = torch.where(zero, torch.zeros_like(hi), hi)

    lower = _tail_excess(lo, *args).clamp(min=0.0)
    # Bracket slack: (hi - lo) * max over [lo, hi] of pi phi_W(u - a).
    dist = torch.clamp(torch.maximum(lo - a, a - hi), min=0.0)
    log_slack = (log_pi + torch.log(hi - lo) - dist * dist / (2 * W) - 0.5 * torch.log(W)
                 - _HALF_LOG_2PI)
    upper = _tail_excess(hi, *args).clamp(min=0.0) + torch.exp(log_slack)
    return (upper if want_upper else None), (lower if want_lower else None)
