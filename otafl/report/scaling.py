"""How the central leakage scales with the number of users K (the paper's O(1/K^{3/4})).

With uniform p = a K^{-1/2} (a above sqrt(ln(2/delta')/2)) the ``paper`` bound falls as
K^{-3/4}; with a fixed p as K^{-1/2} (spec privacy.md, section O(1/K^{3/4})). Sketch:
m_t = K(p - beta) grows as K (fixed p) or as sqrt(K) (p = a/sqrt(K)), the central noise
std as its square root, so eps_0 ~ K^{-1/2} or K^{-1/4}; amplification multiplies by
q ~ p, constant or K^{-1/2}.

:func:`scaling_curves` evaluates both on a log grid of K and fits log-log slopes;
:func:`plot_scaling` draws them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants import get_accountant

__all__ = ["fit_loglog_slope", "scaling_curves", "plot_scaling", "THEORY_SLOPES"]

THEORY_SLOPES = {"fixed_p": -0.5, "sqrt_p": -0.75}
"""The asymptotic exponents: fixed p -> K^{-1/2}, p = a K^{-1/2} -> K^{-3/4}."""


def fit_loglog_slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, int]:
    """Least-squares line through (log x, log y) over the finite, positive points.

    Returns
    -------
    (slope, intercept, points used); slope and intercept are nan with fewer than 2 points.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(y) & (y > 0) & (x > 0)
    if ok.sum() < 2:
        return math.nan, math.nan, int(ok.sum())
    slope, intercept = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)
    return float(slope), float(intercept), int(ok.sum())


def scaling_curves(*, users: Sequence[float], p: float = 0.5, a: float = 5.0, sigma2: float = 10.0,
                   clip: float = 1.0, delta_l: float = 1e-5, delta_prime: float | str = "auto",
                   accountants: Sequence[str] = ("paper",), device: str | torch.device = "cpu") -> dict:
    """Central epsilon vs K for a fixed p and for p = a / sqrt(K), with fitted slopes.

    The channel noise is left out (N0 = 0), as in the paper's central bound.

    Parameters
    ----------
    users : the K values (integers >= 1; a log grid such as 10^2 ... 10^6).
    p : the fixed participation probability, in (0, 1].
    a : the coefficient of p = a K^{-1/2}; a / sqrt(min K) must be <= 1.
    sigma2, clip, delta_l, delta_prime : as in the accountants (sensitivity 2 * clip).
    accountants : registry names.

    Returns
    -------
    dict with ``users`` (list), and per accountant A: ``curves[A]["fixed_p"]`` and
    ``curves[A]["sqrt_p"]`` (lists of epsilon, +inf where undefined) and
    ``slopes[A]["fixed_p"|"sqrt_p"]`` = {"slope", "intercept", "points"}; plus the inputs.
    """
    check_range("p", p, lo=0.0, hi=1.0, lo_open=True)
    check_range("a", a, lo=0.0, lo_open=True)
    check_range("sigma2", sigma2, lo=0.0, lo_open=True)
    check_range("clip", clip, lo=0.0, lo_open=True)
    K = torch.as_tensor(np.round(np.asarray(users, dtype=float)), dtype=torch.float64, device=torch.device(device))
    if K.numel() < 2:
        raise OtaflInputError(f"users has {K.numel()} value(s); the slope needs at least 2")
    if a / math.sqrt(float(K.min())) > 1:
        raise OtaflInputError(f"a = {a!r} gives p = a/sqrt(K) > 1 at K = {int(K.min())}; "
                              f"allowed range: a <= sqrt(min K) = {math.sqrt(float(K.min())):.4g}")
    out = {"users": [int(k) for k in K.tolist()], "p": p, "a": a, "sigma2": sigma2, "clip": clip,
           "delta_l": delta_l, "delta_prime": delta_prime, "curves": {}, "slopes": {}}
    for name in accountants:
        acc = get_accountant(name)
        kw = dict(users=K, noise_var=sigma2, sensitivity=2 * clip, alignment_gain=1.0, n0=0.0, delta_l=delta_l,
                  delta_prime=delta_prime)
        curves = {"fixed_p": acc.bound(participation_prob=torch.full_like(K, p), **kw).epsilon_central,
                  "sqrt_p": acc.bound(participation_prob=a / torch.sqrt(K), **kw).epsilon_central}
        out["curves"][name] = {k: v.tolist() for k, v in curves.items()}
        out["slopes"][name] = {}
        for scheme, eps in out["curves"][name].items():
            slope, intercept, used = fit_loglog_slope(out["users"], eps)
            out["slopes"][name][scheme] = {"slope": slope, "intercept": intercept, "points": used}
    return out


def plot_scaling(curves: dict, path: str | Path) -> Path:
    """Log-log figure of :func:`scaling_curves`: points, fitted lines and their slopes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    K = np.asarray(curves["users"], dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    styles = {"fixed_p": ("o", f"fixed p = {curves['p']:g}"),
              "sqrt_p": ("s", f"p = {curves['a']:g} K$^{{-1/2}}$")}
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    for name, by_scheme in curves["curves"].items():
        for scheme, eps in by_scheme.items():
            marker, label = styles[scheme]
            color = next(colors)
            eps = np.asarray(eps, dtype=float)
            ok = np.isfinite(eps) & (eps > 0)
            fit = curves["slopes"][name][scheme]
            ax.loglog(K[ok], eps[ok], marker, ms=3.5, color=color, alpha=0.8,
                      label=f"{name}, {label}: slope {fit['slope']:.3f} (theory {THEORY_SLOPES[scheme]:g})")
            if math.isfinite(fit["slope"]):
                ax.loglog(K, np.exp(fit["intercept"]) * K ** fit["slope"], "-", color=color, lw=1.0)
    ax.set_xlabel("number of users K")
    ax.set_ylabel(r"central leakage $\epsilon_c$ per round")
    ax.set_title(rf"$\sigma^2$ = {curves['sigma2']:g}, L = {curves['clip']:g}, "
                 rf"$\delta_\ell$ = {curves['delta_l']:g}, $\delta'$ = {curves['delta_prime']}", fontsize=10)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
