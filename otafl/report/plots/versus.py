"""The ``scaling`` figure: summary metrics of trained runs against a swept numeric key
(default ``data.users``), the trained counterpart of ``otafl scaling``.

Left: final test accuracy (%) against the key; right: the total central epsilon composed
over the run (at the runs' delta_total, stated on the axis) and the worst round's central
epsilon (dashed, its delta in the legend) against the key, log-log where the values span
a factor 20, with the least-squares log-log slope of the per-round epsilon in the legend
(:func:`fit_slopes`; ``otafl plot --kind scaling`` prints it too). One curve per
configuration of the other swept keys.
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from otafl.errors import OtaflInputError
from otafl.report.plots.common import Curve, finite, mean, merge_identical, seeds_phrase, std
from otafl.report.plots.kinds import _log_if_wide, epsilon_label, grid
from otafl.report.table import RunGroup, flat_params, fmt_value, varying_keys
from otafl.sweep.store import ResultStore

__all__ = ["DEFAULT_X", "fit_slope", "fit_slopes", "scaling_figure", "series", "slope_text"]

DEFAULT_X = "data.users"
_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def _swept(groups: Sequence[RunGroup]) -> list[str]:
    """Every key that varies between the runs, the sampling keys (shown as the setting) too."""
    runs = [r for g in groups for r in g.runs]
    flats = [flat_params(r.params, r.train) for r in runs]
    sampling = sorted(k for k in set().union(*flats) if k.startswith("sampling.")
                      and len({json.dumps(f.get(k), default=str) for f in flats}) > 1)
    return varying_keys(runs) + sampling


def _x_of(g: RunGroup, x: str, groups: Sequence[RunGroup]) -> Any:
    if x in g.group:
        v = g.group[x]
    else:  # a sampling key (the setting column shows it, so it groups without being named)
        values = {json.dumps(flat_params(r.params, r.train).get(x), default=str) for r in g.runs}
        if x not in _swept(groups) or len(values) != 1:
            raise OtaflInputError(f"--kind scaling needs {x!r} as a swept key of these runs; "
                                  f"swept keys: {', '.join(_swept(groups)) or 'none'} (choose one with --x)")
        v = flat_params(g.runs[0].params, g.runs[0].train).get(x)
    if not finite(v) or v <= 0:
        raise OtaflInputError(f"--kind scaling needs positive numbers for {x!r}; got {v!r}")
    return float(v)


def series(groups: Sequence[RunGroup], x: str, metric: str) -> dict[str, list[tuple[float, float, float]]]:
    """``{curve label: [(x, mean of metric, std), ...]}`` sorted by x; curves are the
    configurations of the other grouping keys; points without a finite value are left out."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for g in groups:
        xv = _x_of(g, x, groups)
        vals = [r.summary.get(metric) for r in g.runs]
        if not any(finite(v) for v in vals):
            continue
        out.setdefault(_curve_label(g, x), []).append((xv, mean(vals), std(vals)))
    return {k: sorted(v) for k, v in out.items()}


def _curve_label(g: RunGroup, x: str) -> str:
    """The curve a group belongs to: its label without ``x`` (and without the setting when
    ``x`` is the setting's sampling key: its points are the settings)."""
    if x in g.group or not x.startswith("sampling."):
        return g.label_without([x])
    extra = ", ".join(f"{k.split('.')[-1]} = {fmt_value(v)}" for k, v in g.group.items())
    return g.scheme + (f", {extra}" if extra else "")


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y against log x (NaN with fewer than two positive points)."""
    pts = [(math.log(a), math.log(b)) for a, b in zip(xs, ys) if finite(a) and finite(b) and a > 0 and b > 0]
    if len({p[0] for p in pts}) < 2:
        return math.nan
    return float(np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0])


def fit_slopes(groups: Sequence[RunGroup], x: str, accountant: str) -> dict[str, tuple[float, float, float, int]]:
    """``{curve label: (slope, x_min, x_max, points)}`` of the worst round's central epsilon."""
    out = {}
    for label, pts in series(groups, x, f"{accountant}_epsilon_central").items():
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        out[label] = (fit_slope(xs, ys), min(xs), max(xs), len(pts))
    return out


def _round_delta(groups: Sequence[RunGroup], acc: str) -> str:
    """`` (δ = 1e-05)``: the delta of the worst round's central epsilon (a range where runs differ)."""
    ds = sorted({float(r.summary[f"{acc}_delta_central"]) for g in groups for r in g.runs
                 if finite(r.summary.get(f"{acc}_delta_central"))})
    return f" (δ = {ds[0]:.3g}" + (f"–{ds[-1]:.3g}" if len(ds) > 1 else "") + ")" if ds else ""


def scaling_figure(fig: Figure, store: ResultStore, groups: list[RunGroup], *, accountants: list[str],
                   x: str = DEFAULT_X, **_) -> None:
    """Final accuracy (left) and central epsilon, total and per round (right), against ``x``."""
    ax_acc, ax_eps = grid(fig, 2, sharex=True)
    acc_series = series(groups, x, "final_test_accuracy")
    if not acc_series:
        raise OtaflInputError("no test accuracy in this results file (the sweep ran with train = false); "
                              "use --kind privacy or --kind channel")
    labels = list(dict.fromkeys(list(acc_series) + [k for a in accountants
                                                   for k in series(groups, x, f"{a}_epsilon_central_total")]))
    color = {lab: _COLORS[i % len(_COLORS)] for i, lab in enumerate(labels)}
    xs_all: list[float] = []
    curves = []
    for lab, pts in acc_series.items():
        curves.append(Curve(lab, [p[0] for p in pts], [100 * p[1] for p in pts], [100 * p[2] for p in pts],
                            {"color": color[lab], "marker": "o"}))
        xs_all += [p[0] for p in pts]
    for c in merge_identical(curves):
        ax_acc.errorbar(c.x, c.y, yerr=c.err if any(c.err) else None, capsize=4, label=c.legend, **c.style)
    ax_acc.set_ylabel("final test accuracy (%)")
    values: list[float] = []
    markers = ["s", "^", "D", "v"]
    for j, a in enumerate(accountants):
        slopes = fit_slopes(groups, x, a)
        for lab, pts in series(groups, x, f"{a}_epsilon_central_total").items():
            style = {"color": color[lab], "marker": markers[j % len(markers)]}
            ax_eps.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{a} total: {lab}", **style)
            values += [p[1] for p in pts]
        for lab, pts in series(groups, x, f"{a}_epsilon_central").items():
            slope = slopes[lab][0]
            ax_eps.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="--", alpha=0.8,
                        label=f"{a} worst round{_round_delta(groups, a)}: {lab}; log-log slope {slope:.3f}",
                        **{"color": color[lab], "marker": markers[j % len(markers)]})
            values += [p[1] for p in pts]
    if not values:
        raise OtaflInputError("no run has a finite central epsilon; nothing to plot on the right")
    ax_eps.set_ylabel(epsilon_label("central", "total", groups, accountants) + "\n(dashed: worst round)")
    _log_if_wide(ax_eps, values, "y")
    for ax in (ax_acc, ax_eps):
        _log_if_wide(ax, xs_all, "x")
        ax.set_xlabel(x if x != DEFAULT_X else "users K")
    ax_eps.legend(fontsize=10, loc="upper right")
    ax_acc.legend(fontsize=10, loc="lower right")
    fig.suptitle(f"Accuracy and central leakage vs {x.split('.')[-1]} ({seeds_phrase(groups)})")


def slope_text(groups: Sequence[RunGroup], x: str, accountants: Sequence[str]) -> str:
    """One line per accountant and curve: the fitted log-log slope of the worst round's
    central epsilon against ``x`` (what ``otafl scaling`` fits for the bound)."""
    lines = []
    for a in accountants:
        for lab, (slope, lo, hi, n) in fit_slopes(groups, x, a).items():
            lines.append(f"{a} per-round central epsilon vs {x} ({lab}): log-log slope {slope:.3f} "
                         f"over {fmt_value(lo)}-{fmt_value(hi)} ({n} points)")
    return "\n".join(lines)
