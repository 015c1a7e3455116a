"""The ``accuracy``, ``privacy`` and ``tradeoff`` figures (see :mod:`otafl.report.plots`).

Each draws one panel per facet value (a second sweep axis), the curves of a panel merged
where identical (:func:`~otafl.report.plots.common.merge_identical`), one legend for the
figure right of the axes, and says on its axes whether the leakage is per round (the
worst round) or the total composed over the T rounds.
"""

from __future__ import annotations

import math
from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from otafl.errors import OtaflInputError
from otafl.report.plots.common import (Curve, center_suptitle, curve_colors, draw_invalid, facet_title,
                                       figure_legend, finite, mean, merge_identical, place_labels, seeds_phrase,
                                       split_facets, std)
from otafl.report.table import RunGroup, fmt_value, validity_of
from otafl.sweep.store import ResultStore
from otafl.privacy.units import UNIT_LABELS, unit_of

__all__ = ["ACCOUNTANT_STYLE", "accuracy_figure", "epsilon_label", "grid", "privacy_figure", "tradeoff_figure"]

ACCOUNTANT_STYLE = {"paper": ("tab:red", "o"), "tight": ("tab:blue", "s"), "exact": ("tab:green", "^")}
_SUFFIX = {("central", "round"): "epsilon_central", ("central", "total"): "epsilon_central_total",
           ("local", "round"): "epsilon_local_max", ("local", "total"): "epsilon_local_total"}


def grid(fig: Figure, n: int, *, max_cols: int = 3, **kwargs) -> list:
    """``n`` panels in rows of at most ``max_cols``; unused cells removed."""
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    axes = fig.subplots(rows, cols, squeeze=False, **kwargs).ravel().tolist()
    for ax in axes[n:]:
        fig.delaxes(ax)
    return axes[:n]


def rounds_of(groups: Sequence[RunGroup]) -> str:
    ts = sorted({int(r.summary["rounds"]) for g in groups for r in g.runs if "rounds" in r.summary})
    return "/".join(map(str, ts)) or "?"


def epsilon_label(side: str, epsilon: str, groups: Sequence[RunGroup], accountants: Sequence[str] = (),
                  with_unit: bool = True) -> str:
    """Axis label: ``central ε per round (worst round)`` / ``central ε total over T = 80 rounds``,
    naming the accountant(s) when given, and the privacy unit (``with_unit``; else the caller
    names it, e.g. in the figure's title)."""
    who = "central ε" if side == "central" else "local ε (worst user)"
    acc = f"; {', '.join(accountants)}" if accountants else ""
    unit = unit_label(groups, accountants) if with_unit else ""
    if epsilon == "round":  # with accountants (tradeoff: no legend names them) the per-round delta too
        return f"{who} per round (worst round{acc})" + (_delta_of(groups, side, accountants, total=False)
                                                         if accountants else "") + unit
    return f"{who} total over T = {rounds_of(groups)} rounds" + (f" ({acc[2:]})" if acc else "") + \
        _delta_of(groups, side, accountants) + unit


def unit_label(groups: Sequence[RunGroup], accountants: Sequence[str] = ()) -> str:
    """``, user level`` (or ``record level``) for the plotted accountants' privacy unit, read from
    the runs' ``{acc}_unit`` (older stores: ``record`` for ``steps`` on local-steps runs);
    ``, user and record level (mixed units)`` where they differ."""
    units = set()
    for g in groups:
        for r in g.runs:
            names = accountants or [k[:-len("_epsilon_central")] for k in r.summary if k.endswith("_epsilon_central")]
            for a in names:
                if f"{a}_epsilon_central" in r.summary:
                    units.add(r.summary.get(f"{a}_unit")
                              or unit_of(a, local_steps=r.summary.get("algorithm", "fedsgd") != "fedsgd"))
    if not units:
        return ""
    labels = [UNIT_LABELS.get(u, u) for u in sorted(units, key=lambda u: u != "user")]
    return ", " + " and ".join(labels) + (" (mixed units)" if len(units) > 1 else "")


def _delta_of(groups: Sequence[RunGroup], side: str, accountants: Sequence[str] = (), total: bool = True) -> str:
    """`` at δ = 1e-05`` when every plotted total (``total``; else per-round epsilon) is stated
    at one delta; the range where not."""
    suffix = f"delta_{side}_total" if total else f"delta_{side}"
    ds = {float(v) for g in groups for r in g.runs for k, v in r.summary.items()
          if k.endswith(suffix) and (not accountants or k[:-len(suffix) - 1] in accountants)
          and isinstance(v, (int, float)) and finite(v)}
    if not ds:
        return ""
    return f" at δ = {min(ds):.3g}" if len(ds) == 1 else f" at δ = {min(ds):.3g}–{max(ds):.3g}"


def _accountant_deltas(groups: Sequence[RunGroup], acc: str, total_side: str | None = None) -> str:
    """The deltas of ``acc``'s plotted epsilons (a range where runs or rounds differ). Per
    round (``total_side`` None): `` (δ_c = 1.5e-05, δ_l = 1e-05)``, the worst round's, both
    sides in one label so the two panels share one legend entry; a total: ``, δ = 1e-05``,
    the run's delta_total on that side (the label names that side's composition too)."""
    parts = []
    for side in (total_side,) if total_side else ("central", "local"):
        key = f"{acc}_delta_{side}" + ("_total" if total_side else "")
        ds = sorted({float(r.summary[key]) for g in groups for r in g.runs
                     if isinstance(r.summary.get(key), (int, float)) and finite(r.summary[key])})
        if ds:
            sym = "δ" if total_side else ("δ_c" if side == "central" else "δ_l")
            parts.append(f"{sym} = {ds[0]:.3g}" + (f"–{ds[-1]:.3g}" if len(ds) > 1 else ""))
    if not parts:
        return ""
    return f", {parts[0]}" if total_side else f" ({', '.join(parts)})"


def _composition(groups: Sequence[RunGroup], acc: str, side: str) -> str:
    key = f"{acc}_composition" + ("_local" if side == "local" else "")
    names = sorted({str(r.summary[key]) for g in groups for r in g.runs if r.summary.get(key) is not None})
    return "/".join(names) or "n/a"


def _log_if_wide(ax, values: Sequence[float], axis: str) -> None:
    """A log axis where ``values`` span more than a factor 20, labelled in plain numbers:
    the decades (``1``, ``10``, ``100``) and, where the view spans under two decades, the
    minor ticks at 2 and 5 (``2``, ``5``, ``20``, ``50``); no other minor label (matplotlib's
    own ``2x10^0 3x10^0 ...`` overlapped where one decade tick was in view)."""
    positive = [v for v in values if finite(v) and v > 0]
    if positive and max(positive) / min(positive) > 20:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        which = ax.yaxis if axis == "y" else ax.xaxis
        which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        which.set_minor_formatter(FuncFormatter(lambda v, _: _minor_label(which, v)))


def _minor_label(axis, v: float) -> str:
    lo, hi = sorted(axis.get_view_interval())
    if v <= 0 or lo <= 0 or math.log10(hi / lo) >= 2:
        return ""
    mantissa = v / 10 ** math.floor(math.log10(v) + 1e-9)
    return f"{v:g}" if any(abs(mantissa - m) < 1e-6 for m in (2, 5)) else ""


# --------------------------------------------------------------------------- accuracy


def accuracy_figure(fig: Figure, store: ResultStore, groups: list[RunGroup], *, facet: str | None = None, **_) -> None:
    """Test accuracy vs round, one curve per configuration (mean over seeds, shaded +-1 std)."""
    facets = split_facets(groups, facet)
    colors = curve_colors(groups, facet)
    axes = grid(fig, len(facets), sharex=True, sharey=True)
    drawn = 0
    for ax, (value, fgroups) in zip(axes, facets):
        curves = []
        for g in fgroups:
            series: dict[int, list[float]] = {}
            for run in g.runs:
                for rec in store.rounds(run.id):
                    if finite(rec.get("test_accuracy")):
                        series.setdefault(int(rec["round"]), []).append(100.0 * rec["test_accuracy"])
            if not series:
                continue
            xs = sorted(series)
            label = g.label_without([facet] if facet else [])
            curves.append(Curve(label, xs, [mean(series[x]) for x in xs],
                                [std(series[x]) for x in xs] if len(g.runs) > 1 else None,
                                {"color": colors[label], "linestyle": "--" if g.scheme != "uniform" else "-",
                                 "marker": "o" if len(xs) <= 30 else None}))
        for c in merge_identical(curves):
            ax.plot(c.x, c.y, label=c.legend, **c.style)
            if c.err is not None:
                ax.fill_between(c.x, [m - s for m, s in zip(c.y, c.err)], [m + s for m, s in zip(c.y, c.err)],
                                color=c.style["color"], alpha=0.15, linewidth=0)
            drawn += 1
        ax.set_title(facet_title(facet, value), fontsize=13)
        ax.set_xlabel("round t")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("test accuracy (%)")
    if not drawn:
        raise OtaflInputError("no test accuracy in this results file (the sweep ran with train = false); "
                              "use --kind privacy or --kind channel")
    fig.suptitle(f"Test accuracy vs round ({seeds_phrase(groups, none='no band')})")
    figure_legend(fig)


# --------------------------------------------------------------------------- privacy


def privacy_figure(fig: Figure, store: ResultStore, groups: list[RunGroup], *, accountants: list[str],
                   facet: str | None = None, epsilon: str = "round", **_) -> None:
    """Leakage vs the uniform p, one curve per accountant: central (left), local (right),
    one row per facet value; other schemes as horizontal reference lines."""
    uniform = [g for g in groups if g.scheme == "uniform"]
    if len({g.runs[0].params["sampling"]["p"] for g in uniform}) < 2:
        raise OtaflInputError("--kind privacy needs uniform sampling runs at two or more values of sampling.p; "
                              f"this file has {len(uniform)}")
    facets = split_facets(groups, facet)
    axes = fig.subplots(len(facets), 2, squeeze=False, sharex=True, sharey="col")
    line_styles = ["-", "--", ":", "-."]
    any_invalid = False
    for row, (value, fgroups) in zip(axes, facets):
        funi = [g for g in fgroups if g.scheme == "uniform"]
        others = [g for g in fgroups if g.scheme != "uniform"]
        extras = sorted({tuple((k, repr(v)) for k, v in g.group.items() if k != facet) for g in funi})
        for ax, side in zip(row, ("central", "local")):
            metric = _SUFFIX[(side, epsilon)]
            curves, values, refs = [], [], []
            for a in accountants:
                color, marker = ACCOUNTANT_STYLE.get(a, (None, "D"))
                name = a + (f" ({_composition(groups, a, side)}{_accountant_deltas(groups, a, side)})"
                            if epsilon == "total" else _accountant_deltas(groups, a))
                for j, extra in enumerate(extras):
                    members = sorted((g for g in funi if tuple((k, repr(v)) for k, v in g.group.items()
                                                               if k != facet) == extra),
                                     key=lambda g: g.runs[0].params["sampling"]["p"])
                    pts = [(g.runs[0].params["sampling"]["p"], mean([r.summary.get(f"{a}_{metric}") for r in g.runs]),
                            validity_of([r.summary for r in g.runs], a) is False) for g in members]
                    pts = [pt for pt in pts if finite(pt[1])]
                    if not pts:
                        continue
                    label = name + ("" if not extra else " (" + ", ".join(
                        f"{k.split('.')[-1]} = {dict(members[0].group)[k]}" for k, _ in extra) + ")")
                    curves.append(Curve(label, [p for p, _, _ in pts], [e for _, e, _ in pts],
                                        style={"color": color, "marker": marker, "linestyle": line_styles[j % 4]},
                                        invalid=[bad for _, _, bad in pts], suffix=", uniform p"))
                    values += [e for _, e, _ in pts]
                for g in others:
                    e = mean([r.summary.get(f"{a}_{metric}") for r in g.runs])
                    if finite(e):
                        refs.append((e, color, f"{name}, {g.label_without([facet] if facet else [])}"))
                        values.append(e)
            for c in merge_identical(curves):
                ax.plot(c.x, c.y, label=c.legend, **c.style)
                any_invalid |= draw_invalid(ax, c)
            for e, color, label in refs:  # after the curves: the legend lists curves first
                ax.axhline(e, color=color, linestyle=":", linewidth=1.8, label=label)
            _log_if_wide(ax, values, "y")
            ax.set_xlabel("sampling probability p")
            ax.set_ylabel(epsilon_label(side, epsilon, groups, with_unit=False))
            where = facet_title(facet, value)
            ax.set_title(("Central DP" if side == "central" else "Local DP") + (f", {where}" if where else ""),
                         fontsize=13)
    what = "per round" if epsilon == "round" else "total"
    fig.suptitle(f"Privacy leakage ({what}{unit_label(groups)}) vs p "
                 f"({seeds_phrase(groups, spread='mean', none='no average')})")
    figure_legend(fig, invalid=any_invalid)


# --------------------------------------------------------------------------- tradeoff


def tradeoff_figure(fig: Figure, store: ResultStore, groups: list[RunGroup], *, accountants: list[str],
                    facet: str | None = None, epsilon: str = "round", along: str | None = None, **_) -> None:
    """Final accuracy vs central epsilon of the chosen accountant(s), one curve per scheme
    (and other swept value), points labelled by p / h_th, one panel per facet value; with
    ``along`` (a swept key, :func:`otafl.report.plots.tradeoff_along`), each curve runs along
    that key's values instead, its points labelled by them."""
    facets = split_facets(groups, facet)
    axes = grid(fig, len(facets), sharex=True, sharey=True)
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"]
    keys: list[str] = []  # curve names over all panels: the same colour everywhere
    panels, values, any_invalid = [], [], False
    metric = _SUFFIX[("central", epsilon)]
    for ax, (value, fgroups) in zip(axes, facets):
        by: dict[str, list] = {}
        for a in accountants:
            for g in fgroups:
                accs = [r.summary.get("final_test_accuracy") for r in g.runs]
                eps = mean([r.summary.get(f"{a}_{metric}") for r in g.runs])
                if not any(finite(x) for x in accs) or not finite(eps):
                    continue
                extra = ", ".join(f"{k.split('.')[-1]} = {v}" for k, v in g.group.items() if k not in (facet, along))
                if along:  # the curve runs along that key: its settings (one per scheme) go in the name
                    extra = ", ".join(filter(None, [g.setting, extra]))
                name = g.scheme + (f" ({extra})" if extra else "") + (f" [{a}]" if len(accountants) > 1 else "")
                point = g.setting if along is None else f"{along.split('.')[-1]} = {fmt_value(g.group.get(along))}"
                by.setdefault(name, []).append((eps, 100 * mean(accs), 100 * std(accs), point,
                                                validity_of([r.summary for r in g.runs], a) is False))
        panels.append((ax, value, by))
        keys += [k for k in by if k not in keys]
    if not keys:
        raise OtaflInputError("no run has both a test accuracy and a finite central epsilon "
                              "(train = false, or undefined bounds); nothing to plot")
    one_seed = all(len(g.runs) == 1 for g in groups)
    for ax, value, by in panels:
        curves = []
        for name, pts in by.items():
            pts.sort()
            i = keys.index(name)
            curves.append(Curve(name, [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts],
                                {"color": colors[i % len(colors)], "marker": markers[i % len(markers)],
                                 "linestyle": "-" if len(pts) > 1 else "none"},
                                invalid=[p[4] for p in pts], texts=[p[3] for p in pts]))
        for c in merge_identical(curves):
            if one_seed:
                ax.plot(c.x, c.y, label=c.legend, **c.style)
            else:
                ax.errorbar(c.x, c.y, yerr=c.err, capsize=4, label=c.legend, **c.style)
            any_invalid |= draw_invalid(ax, c)
            values += c.x
        ax.set_title(facet_title(facet, value), fontsize=13)
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("final test accuracy (%)")
    for ax, _, _ in panels:
        _log_if_wide(ax, values, "x")
        ax.margins(x=0.12, y=0.15)
    xlabel = epsilon_label("central", epsilon, groups, accountants)
    if len(panels) == 1:
        panels[0][0].set_xlabel(xlabel)
    else:  # one label under the panels (they share the x axis): long labels side by side would collide
        fig.supxlabel(xlabel, fontsize=15)
    fig.suptitle(f"Accuracy vs privacy ({seeds_phrase(groups)})")
    figure_legend(fig, invalid=any_invalid,
                  title="point labels: p / h_th" if along is None else f"point labels: {along.split('.')[-1]}")
    renderer = center_suptitle(fig)
    for ax, _, by in panels:  # last: the layout is final, so the labels can be measured
        place_labels(ax, [(c[0], c[1], c[3], "0.15") for pts in by.values() for c in pts], renderer=renderer)
