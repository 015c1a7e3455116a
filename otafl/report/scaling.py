"""The scaling figure: central leakage vs K on log-log axes, with the fitted slopes.

The curves and the fit come from :func:`otafl.api.scaling.scaling_curves` (or the
``curves`` of :func:`otafl.api.scaling.scaling_grid`); :func:`plot_scaling` draws them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from otafl.api.scaling import THEORY_SLOPES

__all__ = ["plot_scaling"]


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
