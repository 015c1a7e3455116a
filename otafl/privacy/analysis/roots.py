r"""The safeguarded root finder of :func:`~otafl.privacy.analysis.ota_round.round_epsilon`, batched.

Each row has a bracket lo < root <= hi of a function that is > 0 below its root and <= 0 from
it on (the sign of delta(eps) - target, :func:`sign_gap`); :func:`bracketed_root` shrinks every
bracket to a relative width ``xtol`` and returns its upper end, where the function is <= 0.
"""

from __future__ import annotations

import torch

__all__ = ["bracketed_root", "sign_gap"]


def sign_gap(delta: torch.Tensor, root_target: torch.Tensor) -> torch.Tensor:
    """sqrt(-log target) - sqrt(-log delta): the sign of delta - target (> 0 where the target is
    missed), as :func:`~otafl.privacy.analysis.ota_round.round_epsilon` gives it to
    :func:`bracketed_root`. For a Gaussian-like profile -log delta grows like eps^2, so this is
    nearly linear in eps and secant steps close in fast (on log delta - log target, nearly
    quadratic, the paper preset's run took about a quarter more evaluations)."""
    return root_target - torch.sqrt(-torch.log(delta).clamp(max=0.0))


def bracketed_root(evaluate, lo: torch.Tensor, hi: torch.Tensor, f_lo: torch.Tensor, f_hi: torch.Tensor,
                   active: torch.Tensor, xtol: float) -> torch.Tensor:
    """The upper ends of the brackets [lo, hi] ([B] float64, f_lo > 0 >= f_hi on the ``active``
    rows) once each active row's is at most ``xtol`` (1 + hi) wide; inactive rows keep their hi.

    ``evaluate(mask, x)``: the function at x [B] for the rows in ``mask`` (anything elsewhere).
    Secant steps through the last two points evaluated, safeguarded by the Illinois variant of
    regula falsi (where a secant step leaves the bracket) and by bisection (where a bracket has
    not halved for three steps); a point is never closer than half the tolerance to an end,
    so a step that lands next to the root closes the bracket with the next one.
    """
    B = lo.shape[0]
    side = torch.zeros(B, dtype=torch.int8, device=lo.device)  # which end moved last: -1 lo, +1 hi
    xa, fa, xb, fb = lo, f_lo, hi, f_hi  # the last two points evaluated (the secant's)
    stall = torch.zeros(B, dtype=torch.int8, device=lo.device)  # iterations since the bracket last halved
    width_then = hi - lo
    for _ in range(200):
        gap = xtol * (1 + hi)
        active = active & (hi - lo > gap)  # converged rows are frozen
        if not bool(active.any()):
            break
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        ok = torch.isfinite(x) & (x > lo) & (x < hi)
        x = torch.where(ok, x, 0.5 * (lo + hi))
        # The secant through the last two points (superlinear where the Illinois steps above
        # stall on one side), inside the bracket and at least half the tolerance from its ends
        # (a point that close to the root then closes the bracket); the midpoint where the
        # bracket has not halved for three steps.
        xs = xb - fb * (xb - xa) / (fb - fa)
        x = torch.where(torch.isfinite(xs) & (xs > lo) & (xs < hi), xs, x)
        x = torch.where(stall >= 3, 0.5 * (lo + hi), x)
        x = torch.minimum(torch.maximum(x, lo + 0.5 * gap), hi - 0.5 * gap)
        fx = evaluate(active, x)
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
        xa, fa = torch.where(active, xb, xa), torch.where(active, fb, fa)
        xb, fb = torch.where(active, x, xb), torch.where(active, fx, fb)
        halved = hi - lo <= 0.5 * width_then
        width_then = torch.where(halved, hi - lo, width_then)
        stall = torch.where(halved, torch.zeros_like(stall), stall + 1)
    return hi
