"""The over-the-air versus digital figure (``otafl plot-digital``): four panels.

(a) final test accuracy against the composed central epsilon, one marker per system;
(b) channel uses and (c) transmit energy per round, per system and privacy level (log scale);
(d) the bits per coordinate each discrete mechanism needs against its composed central
epsilon (:func:`otafl.api.digital.communication_curves`). Reads stored runs and given curves
only; the format follows the output suffix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib
from matplotlib.figure import Figure

from otafl.report.accountants_figure import delta_range
from otafl.report.plots import STYLE, save_figure
from otafl.sweep.store import StoredRun

__all__ = ["system_of", "system_points", "plot_digital"]

SYSTEM_STYLE = {"over the air": ("black", "o"), "digital gaussian": ("tab:blue", "s"),
                "digital skellam": ("tab:orange", "^"), "digital ddg": ("tab:purple", "v"),
                "digital pbm": ("tab:green", "D")}
DASHED = {"digital ddg"}
"""Systems drawn dashed with hollow markers: DDG's epsilon, hence noise and bits, is Skellam's to a
hair at these noise levels (docs/privacy/digital.md#digital-ddg), so its line would hide Skellam's."""


def _line(system: str) -> dict:
    return {"linestyle": "--", "markerfacecolor": "none"} if system in DASHED else {}


def system_of(run: StoredRun) -> str:
    """'over the air', 'ideal' or 'digital <mechanism>'."""
    agg = run.params.get("train", {}).get("aggregation", "ota")
    if agg == "digital":
        return f"digital {run.params.get('digital', {}).get('mechanism', '?')}"
    return "over the air" if agg == "ota" else agg


def _epsilon_total(run: StoredRun) -> float:
    return _central_total(run)[0]


def _central_total(run: StoredRun) -> tuple[float, float]:
    """(epsilon, delta) of the run's central total: the digital accountant's, else the first of
    its accountants that states one."""
    for name in ("digital", *run.params.get("privacy", {}).get("accountants", [])):
        v = run.summary.get(f"{name}_epsilon_central_total")
        if isinstance(v, (int, float)):
            d = run.summary.get(f"{name}_delta_central_total")
            return float(v), float(d) if isinstance(d, (int, float)) else math.nan
    return math.nan, math.nan


def _epsilon_label(deltas) -> str:
    """The epsilon axis's label with the totals' delta (one value, or their range; none stated
    where no total has one)."""
    ds = [float(d) for d in deltas if isinstance(d, (int, float)) and math.isfinite(d)]
    return f"central ε over the run{' at ' + delta_range(ds) if ds else ''} (composed; user level)"


def system_points(runs: Sequence[StoredRun]) -> dict[str, list[dict]]:
    """Per system, one point per configuration (means over seeds): epsilon, accuracy, costs."""
    groups: dict[tuple, list[StoredRun]] = {}
    for r in runs:
        params = {k: v for k, v in r.params.items()}
        key = (system_of(r), repr({s: params[s] for s in sorted(params) if s != "train"}),
               repr({k: v for k, v in params.get("train", {}).items() if k != "seed"}))
        groups.setdefault(key, []).append(r)
    out: dict[str, list[dict]] = {}
    for (system, _, _), rs in groups.items():
        def mean(f):
            vals = [f(r) for r in rs]
            vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
            return sum(vals) / len(vals) if vals else math.nan

        out.setdefault(system, []).append({
            "epsilon": mean(_epsilon_total), "accuracy": mean(lambda r: r.summary.get("final_test_accuracy")),
            "channel_uses": mean(lambda r: r.summary.get("channel_uses_per_round")),
            "energy": mean(lambda r: r.summary.get("energy_per_round")), "seeds": len(rs)})
    for pts in out.values():
        pts.sort(key=lambda d: -d["epsilon"] if math.isfinite(d["epsilon"]) else 0.0)
    return dict(sorted(out.items(), key=lambda kv: list(SYSTEM_STYLE).index(kv[0]) if kv[0] in SYSTEM_STYLE else 9))


def plot_digital(runs: Sequence[StoredRun], curves: dict | None, out: str | Path) -> Path:
    """Draw the four panels (module docstring) and save them to ``out``."""
    points = system_points(runs)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(15, 10.5), layout="constrained")
        (ax_a, ax_b), (ax_c, ax_d) = fig.subplots(2, 2)
        systems = list(points)
        levels = max((len(v) for v in points.values()), default=0)
        width = 0.8 / max(1, levels)
        for i, system in enumerate(systems):
            color, marker = SYSTEM_STYLE.get(system, ("tab:gray", "x"))
            pts = points[system]
            ax_a.plot([p["epsilon"] for p in pts], [100 * p["accuracy"] for p in pts], marker=marker, color=color,
                      label=system, markersize=10, **_line(system))
            for j, p in enumerate(pts):
                hatch = None if j == 0 else "//"
                ax_b.bar(i + (j - (levels - 1) / 2) * width, p["channel_uses"], width, color=color, hatch=hatch,
                         edgecolor="white")
                ax_c.bar(i + (j - (levels - 1) / 2) * width, p["energy"], width, color=color, hatch=hatch,
                         edgecolor="white")
        ax_a.set_xscale("log")
        ax_a.set_xlabel(_epsilon_label(_central_total(r)[1] for r in runs))
        ax_a.set_ylabel("final test accuracy (%)")
        ax_a.set_title("(a) accuracy at matched central privacy")
        ax_a.legend(loc="lower right")
        for ax, label, title in ((ax_b, "channel uses per round", "(b) latency"),
                                 (ax_c, "transmit energy per round (units of P_k)", "(c) energy")):
            ax.set_yscale("log")
            ax.set_xticks(range(len(systems)), [s.replace("digital ", "digital\n") for s in systems])
            ax.set_ylabel(label)
            ax.set_title(title + " (solid: weaker privacy, hatched: stronger)")
        if curves and curves.get("rows"):
            for mech in dict.fromkeys(r["mechanism"] for r in curves["rows"]):
                rows = sorted((r for r in curves["rows"] if r["mechanism"] == mech),
                              key=lambda r: r["epsilon_central_total"])
                color, marker = SYSTEM_STYLE.get(f"digital {mech}", ("tab:gray", "x"))
                ax_d.plot([r["epsilon_central_total"] for r in rows], [r["bits"] for r in rows], marker=marker,
                          color=color, label=f"digital {mech}", markersize=9, **_line(f"digital {mech}"))
            ax_d.set_xscale("log")
            ax_d.legend()
        ax_d.set_xlabel(_epsilon_label(r.get("delta_total") for r in (curves or {}).get("rows", [])))
        ax_d.set_ylabel("bits per coordinate (fewest that fit)")
        ax_d.set_title("(d) communication cost as ε shrinks")
    return save_figure(fig, out)
