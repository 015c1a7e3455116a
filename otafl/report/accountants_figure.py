"""Figure: per-round central epsilon vs p for the ``paper``, ``tight`` and ``exact`` accountants.

Draws the curves of :func:`otafl.api.curves.accountant_curves` (the paper's preset by
default). ``paper`` points whose classic Gaussian step is outside its validity range
(eps_0 > 1) are drawn hollow: there the classic formula is not a theorem. Each legend
entry states the accountant's per-round delta (one value, or its range over p: paper's and
tight's grow as p falls); points whose delta is above 1/K are ringed.

    otafl plot-accountants --out figures/accountants.png
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["accountants_figure", "delta_range", "plot_accountants"]


def delta_range(deltas) -> str:
    """``δ = 1e-05`` or ``δ = 1.5e-05–0.0366`` (the finite deltas' range), ``δ = n/a`` if none."""
    ds = sorted({float(d) for d in deltas if np.isfinite(d)})
    if not ds:
        return "δ = n/a"
    return f"δ = {ds[0]:.3g}" + (f"–{ds[-1]:.3g}" if len(ds) > 1 else "")


def plot_accountants(curves: dict, out: str | Path) -> Path:
    """:func:`accountants_figure` written to ``out``."""
    import matplotlib

    from otafl.report.plots import STYLE, save_figure

    with matplotlib.rc_context(STYLE):  # a bare Figure: the caller's pyplot backend is left alone
        return save_figure(accountants_figure(curves), out)


def accountants_figure(curves: dict):
    """Log-scale eps_c vs p, one line per accountant, its delta in the legend (hollow paper
    markers: classic step invalid; rings: delta above 1/K). Call inside the plot style."""
    from matplotlib.figure import Figure

    from otafl.privacy.accountants.result import delta_too_large
    from otafl.report.plots import ACCOUNTANT_STYLE

    p = np.asarray(curves["p"])
    rings: list[tuple[float, float]] = []  # (p, eps) of points whose delta is above 1/K
    fig = Figure(figsize=(8.0, 5.4))
    ax = fig.subplots()
    for name in ("paper", "tight", "exact"):
        color, marker = ACCOUNTANT_STYLE[name]
        eps = np.asarray(curves[name]["epsilon"], dtype=float)
        ok = np.isfinite(eps)
        delta = np.asarray(curves[name]["delta"], dtype=float)
        label = {"paper": "paper (Hoeffding, classic Gaussian)",
                 "tight": "tight (exact quantile, analytic Gaussian)",
                 "exact": "exact (numerical)"}[name] + f", {delta_range(delta[ok])}"
        ax.plot(p[ok], eps[ok], "-", color=color, label=label)
        big = ok & np.array([delta_too_large(d, curves["users"]) for d in delta], dtype=bool)
        rings += list(zip(p[big], eps[big]))
        if name == "paper":
            valid = np.asarray(curves["paper_classic_valid"], dtype=bool)
            ax.plot(p[ok & valid], eps[ok & valid], marker, color=color, ls="none")
            ax.plot(p[ok & ~valid], eps[ok & ~valid], marker, color=color, ls="none", mfc="white",
                    label=r"paper: classic step invalid ($\epsilon_0$ > 1)" if (~valid & ok).any() else None)
        else:
            ax.plot(p[ok], eps[ok], marker, color=color, ls="none")
    if rings:  # last: the legend lists the accountants first
        ax.plot(*zip(*rings), "o", ms=15, mfc="none", mec="0.35", mew=1.2, ls="none",
                label=rf"$\delta$ > 1/K = {1 / curves['users']:.3g}: $\epsilon$ means little")
    ax.set_yscale("log")
    ax.set_xlabel("participation probability p")
    ax.set_ylabel(r"central leakage $\epsilon_c$ per round (user level)")
    ax.set_title(rf"K = {curves['users']}, $\sigma^2$ = {curves['sigma2']:g}, L = {curves['clip']:g}, "
                 rf"$\delta_\ell$ = {curves['delta_l']:g}, N0 = {curves['n0']:g}, d = {curves['dim']}",
                 fontsize=12)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=10, loc="upper right")
    fig.tight_layout()
    return fig
