"""Figure: per-round central epsilon vs p for the ``paper``, ``tight`` and ``exact`` accountants.

Draws the curves of :func:`otafl.api.curves.accountant_curves` (the paper's preset by
default). ``paper`` points whose classic Gaussian step is outside its validity range
(eps_0 > 1) are drawn hollow: there the classic formula is not a theorem.

    otafl plot-accountants --out figures/accountants.png
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot_accountants"]


def plot_accountants(curves: dict, out: str | Path) -> Path:
    """Log-scale eps_c vs p, one line per accountant (hollow paper markers: classic step invalid)."""
    import matplotlib
    from matplotlib.figure import Figure

    from otafl.report.plots import ACCOUNTANT_STYLE, STYLE, save_figure

    p = np.asarray(curves["p"])
    with matplotlib.rc_context(STYLE):  # a bare Figure: the caller's pyplot backend is left alone
        fig = Figure(figsize=(8.0, 5.4))
        ax = fig.subplots()
        for name in ("paper", "tight", "exact"):
            color, marker = ACCOUNTANT_STYLE[name]
            eps = np.asarray(curves[name]["epsilon"], dtype=float)
            ok = np.isfinite(eps)
            delta = curves[name]["delta"]
            label = {"paper": "paper (Hoeffding, classic Gaussian)",
                     "tight": "tight (exact quantile, analytic Gaussian)",
                     "exact": r"exact (numerical, $\delta$ = " f"{delta[0]:g})"}[name]
            ax.plot(p[ok], eps[ok], "-", color=color, label=label)
            if name == "paper":
                valid = np.asarray(curves["paper_classic_valid"], dtype=bool)
                ax.plot(p[ok & valid], eps[ok & valid], marker, color=color, ls="none")
                ax.plot(p[ok & ~valid], eps[ok & ~valid], marker, color=color, ls="none", mfc="white",
                        label=r"paper: classic step invalid ($\epsilon_0$ > 1)" if (~valid & ok).any() else None)
            else:
                ax.plot(p[ok], eps[ok], marker, color=color, ls="none")
        ax.set_yscale("log")
        ax.set_xlabel("participation probability p")
        ax.set_ylabel(r"central leakage $\epsilon_c$ per round")
        ax.set_title(rf"K = {curves['users']}, $\sigma^2$ = {curves['sigma2']:g}, L = {curves['clip']:g}, "
                     rf"$\delta_\ell$ = {curves['delta_l']:g}, N0 = {curves['n0']:g}, d = {curves['dim']}",
                     fontsize=12)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=10, loc="upper right")
        fig.tight_layout()
        return save_figure(fig, out)
