"""The scaling figure: central leakage vs K on log-log axes, with the fitted slopes.

The curves and the fit come from :func:`otafl.api.scaling.scaling_curves` (or the
``curves`` of :func:`otafl.api.scaling.scaling_grid`); :func:`plot_scaling` draws them:
one colour per accountant, solid for a fixed p, dashed for p = a K^{-1/2}, the fitted
slopes in the legend, and the theory slopes -1/2 and -3/4 as thin grey reference lines.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from otafl.api.scaling import SCHEMES, THEORY_SLOPES
from otafl.results import atomic_write_bytes

__all__ = ["plot_scaling"]

_STYLE = {"fixed_p": ("-", "o"), "sqrt_p": ("--", "s")}
_COLORS = {"paper": "tab:blue", "tight": "tab:green", "exact": "tab:red"}


def plot_scaling(curves: dict, path: str | Path) -> Path:
    """Log-log figure of :func:`scaling_curves`: each accountant's two curves and their slopes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 5.0))
    labels = {"fixed_p": f"fixed p = {curves['p']:g}", "sqrt_p": f"p = {curves['a']:g} K$^{{-1/2}}$"}
    spare = iter(c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if c not in _COLORS.values())
    anchors: dict[str, tuple[float, float]] = {}
    k_all = np.asarray(curves["users"], dtype=float)
    for name, by_scheme in curves["curves"].items():
        color = _COLORS.get(name) or next(spare, "black")
        K = np.asarray(curves.get("users_of", {}).get(name, curves["users"]), dtype=float)
        for scheme in SCHEMES:
            eps = np.asarray(by_scheme[scheme], dtype=float)
            ok = np.isfinite(eps) & (eps > 0)
            fit = curves["slopes"][name][scheme]
            line, marker = _STYLE[scheme]
            slope = f"{fit['slope']:.3f}" if math.isfinite(fit["slope"]) else "n/a"
            ax.loglog(K[ok], eps[ok], line, marker=marker, ms=3.0, lw=1.4, color=color,
                      label=f"{name}, {labels[scheme]}: slope {slope}")
            if ok.any():
                i = int(np.argmax(ok))
                if K[i] < anchors.get(scheme, (math.inf, 0.0))[0] or (
                        K[i] == anchors[scheme][0] and eps[i] > anchors[scheme][1]):
                    anchors[scheme] = (K[i], eps[i])
    for scheme in SCHEMES:  # theory slopes from 1.5x the highest curve's first point, clear of the curves
        if scheme in anchors:
            k0, e0 = anchors[scheme][0], 1.5 * anchors[scheme][1]
            theory = THEORY_SLOPES[scheme]
            ax.loglog(k_all, e0 * (k_all / k0) ** theory, _STYLE[scheme][0], color="0.55", lw=0.7,
                      label=f"theory slope {theory:g} ({labels[scheme]})")
    ax.set_xlabel("number of users K")
    ax.set_ylabel(r"central leakage $\epsilon_c$ per round (user level)")
    extra = ""
    if "dim" in curves:
        extra = rf", d = {curves['dim']}, $N_0$ = {curves['n0']:g}"
    ax.set_title(rf"$\sigma^2$ = {curves['sigma2']:g}, L = {curves['clip']:g}, "
                 rf"$\delta_\ell$ = {curves['delta_l']:g}, $\delta'$ = {curves['delta_prime']}{extra}", fontsize=10)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7.5, loc="lower left")
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=150, format=Path(path).suffix[1:].lower() or "png")
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())  # whole file or none (a full disk: one line)
