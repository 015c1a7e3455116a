"""What the figure kinds share: statistics, facets, colours, merged legends, label placement.

- :func:`split_facets`: one panel per value of a second sweep axis (``channel.snr_db``),
  values in numeric order (:func:`otafl.report.table.sort_key`).
- :func:`curve_colors`: one colour per curve, the same in every panel.
- :func:`merge_identical`: curves with identical data in one panel are drawn once, their
  labels joined with ``≡`` (one legend entry per distinct curve).
- :func:`figure_legend`: one legend for the figure, outside the axes (right), one entry
  per label.
- :func:`place_labels`: point labels placed where they overlap no other label, point or
  curve and stay inside the axes (greedy over candidate offsets, measured with the
  renderer), so they neither collide nor clip.
- :func:`seeds_phrase`: "mean ± std over 2 seeds", "1 seed: no error bars".
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any, Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from otafl.errors import OtaflInputError
from otafl.report.table import RunGroup, fmt_value, sort_key

__all__ = ["Curve", "INVALID_NOTE", "curve_colors", "facet_title", "figure_legend", "finite", "mean",
           "merge_identical", "place_labels", "seeds_phrase", "split_facets", "std"]

INVALID_NOTE = "hollow marker: outside the accountant's\nvalidity range (not a guaranteed bound)"
_OTHERS = ["black", "tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive",
           "tab:cyan", "tab:blue"]


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean(xs: Sequence[Any]) -> float:
    xs = [float(x) for x in xs if finite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def std(xs: Sequence[Any]) -> float:
    """Sample standard deviation (0 for fewer than two values)."""
    xs = [float(x) for x in xs if finite(x)]
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def seeds_phrase(groups: Sequence[RunGroup], spread: str = "mean ± std", none: str = "no error bars") -> str:
    """``mean ± std over 2 seeds``; ``1 seed: no error bars``; ``mean ± std over 1–3 seeds``."""
    n = sorted({len(g.runs) for g in groups})
    if n == [1]:
        return f"1 seed: {none}"
    if len(n) == 1:
        return f"{spread} over {n[0]} seeds"
    return f"{spread} over {n[0]}–{n[-1]} seeds" + (f"; 1 seed: {none}" if n[0] == 1 else "")


def split_facets(groups: Sequence[RunGroup], facet: str | None) -> list[tuple[Any, list[RunGroup]]]:
    """``[(value, groups with that value)]`` in numeric order; ``[(None, groups)]`` without a facet."""
    if facet is None:
        return [(None, list(groups))]
    by: dict[str, tuple[Any, list[RunGroup]]] = {}
    for g in groups:
        v = g.group.get(facet)
        by.setdefault(repr(v), (v, []))[1].append(g)
    return sorted(by.values(), key=lambda item: sort_key(item[0]))


def facet_title(facet: str | None, value: Any) -> str:
    return "" if facet is None else f"{facet.split('.')[-1]} = {fmt_value(value)}"


def curve_colors(groups: Sequence[RunGroup], facet: str | None) -> dict[str, Any]:
    """Label (without the facet key) -> colour: uniform sampling at several p without other
    keys on a sequential colour map by p, every other curve a distinct fixed colour."""
    cmap = matplotlib.colormaps["viridis"]
    labels: dict[str, RunGroup] = {}
    for g in groups:
        labels.setdefault(g.label_without([facet] if facet else []), g)
    plain = {lab: g for lab, g in labels.items()
             if g.scheme == "uniform" and not [k for k in g.group if k != facet]}
    ps = sorted({g.runs[0].params["sampling"]["p"] for g in plain.values()})
    out: dict[str, Any] = {}
    others = iter(_OTHERS)
    for lab, g in labels.items():
        if lab in plain:
            p = g.runs[0].params["sampling"]["p"]
            out[lab] = cmap(0.05 + 0.75 * ps.index(p) / (len(ps) - 1)) if len(ps) > 1 else cmap(0.4)
        else:
            out[lab] = next(others, None)
    return out


@dataclass
class Curve:
    """One curve of a panel: its data, its legend label and its drawing style."""

    label: str  # the part that names the curve ("tight"); merged: "tight ≡ exact"
    x: list[float]
    y: list[float]
    err: list[float] | None = None  # symmetric spread (band or error bars)
    style: dict = field(default_factory=dict)  # color, marker, linestyle
    invalid: list[bool] | None = None  # per point: outside the accountant's validity range
    texts: list[str] | None = None  # per point labels (tradeoff)
    suffix: str = ""  # shared by curves that may merge (", uniform p")

    @property
    def legend(self) -> str:
        return self.label + self.suffix


def _same(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return len(a) == len(b) and bool(np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-9, atol=0,
                                                 equal_nan=True))


def merge_identical(curves: Sequence[Curve]) -> list[Curve]:
    """Curves whose x, y (and spread) are the same become one, labelled ``A ≡ B``."""
    out: list[Curve] = []
    for c in curves:
        for kept in out:
            if _same(kept.x, c.x) and _same(kept.y, c.y) and _same(kept.err, c.err):
                if c.suffix != kept.suffix:
                    c_label, kept.label, kept.suffix = c.legend, kept.legend, ""
                else:
                    c_label = c.label
                parts = kept.label.split(" ≡ ")
                if c_label not in parts:
                    kept.label = " ≡ ".join(parts + [c_label])
                if c.invalid and kept.invalid:
                    kept.invalid = [a or b for a, b in zip(kept.invalid, c.invalid)]
                break
        else:
            out.append(Curve(c.label, list(c.x), list(c.y), None if c.err is None else list(c.err), dict(c.style),
                             None if c.invalid is None else list(c.invalid),
                             None if c.texts is None else list(c.texts), c.suffix))
    for c in out:  # many identical curves: the first label and a count
        parts = c.label.split(" ≡ ")
        if len(parts) > 3:
            c.label = f"{parts[0]} ≡ {len(parts) - 1} more (identical curves)"
    return out


def draw_invalid(ax, curve: Curve) -> bool:
    """Over-draw the curve's invalid points with hollow (white-filled) markers; True if any."""
    if not curve.invalid or not any(curve.invalid):
        return False
    xs = [x for x, bad in zip(curve.x, curve.invalid) if bad]
    ys = [y for y, bad in zip(curve.y, curve.invalid) if bad]
    ax.plot(xs, ys, linestyle="none", marker=curve.style.get("marker") or "o", markerfacecolor="white",
            markeredgecolor=curve.style.get("color"), markeredgewidth=1.8, zorder=5)
    return True


def figure_legend(fig: Figure, *, invalid: bool = False, title: str | None = None, extra: Sequence = ()) -> None:
    """One legend for the whole figure, right of the axes: one entry per label (first
    handle wins), plus the hollow-marker note when some point is invalid."""
    handles, labels = [], []
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab and not lab.startswith("_") and lab not in labels:
                handles.append(h)
                labels.append(lab)
    def plain_line(h) -> bool:  # a reference line (no marker): listed after the curves
        return isinstance(h, Line2D) and str(h.get_marker()) in ("None", "", " ")

    order = sorted(range(len(handles)), key=lambda i: plain_line(handles[i]) and any(
        not plain_line(h) for h in handles))
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    labels = [textwrap.fill(lab, 46) for lab in labels]  # long labels wrap instead of widening the figure
    for h in extra:
        handles.append(h)
        labels.append(h.get_label())
    if invalid:
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="white",
                              markeredgecolor="0.3", markeredgewidth=1.8))
        labels.append(INVALID_NOTE)
    if not handles:
        raise OtaflInputError("nothing to plot: no curve has data")
    fig.legend(handles, labels, loc="outside right upper", title=title, fontsize=11, title_fontsize=11)


def renderer_of(fig: Figure):
    """The figure's renderer after a layout pass (attaches an Agg canvas if it has none)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def _candidates() -> list[tuple[float, float, str, str, int]]:
    """Label offsets (dx, dy) in points with their alignment and ring: ring 0 next to the
    point, rings 1-3 further out (drawn with a leader line to the point)."""
    dirs = [(1, 1), (1, -1), (-1, 1), (-1, -1), (0, 1), (0, -1), (1, 0), (-1, 0)]
    out = []
    for ring, dist in enumerate((7.0, 24.0, 42.0, 62.0)):
        for ux, uy in dirs:
            out.append((ux * dist, uy * dist * (0.8 if ux else 1.2), {1: "left", -1: "right", 0: "center"}[ux],
                        {1: "bottom", -1: "top", 0: "center"}[uy], ring))
    return out


_CANDIDATES = _candidates()
_LEADER = {"arrowstyle": "-", "color": "0.45", "linewidth": 0.9, "shrinkA": 1, "shrinkB": 5}


def _distance(p, box: Bbox) -> float:
    dx = max(box.x0 - p[0], 0.0, p[0] - box.x1)
    dy = max(box.y0 - p[1], 0.0, p[1] - box.y1)
    return math.hypot(dx, dy)


def _areas(box, arr: np.ndarray) -> np.ndarray:
    """Overlap areas of one box (x0, y0, x1, y1) with each row of ``arr`` [N, 4]."""
    w = np.minimum(box[2], arr[:, 2]) - np.maximum(box[0], arr[:, 0])
    h = np.minimum(box[3], arr[:, 3]) - np.maximum(box[1], arr[:, 1])
    return np.clip(w, 0.0, None) * np.clip(h, 0.0, None)


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _dots(segment, step: float = 4.0, skip: float = 6.0) -> list[Bbox]:
    """Small boxes along a segment (display pixels), leaving out ``skip`` pixels at its start."""
    (x0, y0), (x1, y1) = segment
    length = math.hypot(x1 - x0, y1 - y0)
    out = []
    for t in np.arange(skip, max(length, skip), step):
        px, py = x0 + (x1 - x0) * t / length, y0 + (y1 - y0) * t / length
        out.append(Bbox.from_extents(px - 1.5, py - 1.5, px + 1.5, py + 1.5))
    return out


def _crosses(a, b) -> bool:
    """Whether two segments intersect (proper crossing)."""
    def orient(p, q, r):
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
    (p1, p2), (q1, q2) = a, b
    return (orient(p1, p2, q1) * orient(p1, p2, q2) < 0) and (orient(q1, q2, p1) * orient(q1, q2, p2) < 0)


def _obstacles(ax, renderer, r: float) -> list[Bbox]:
    """Boxes of the panel's markers, curves and error bars (display pixels)."""
    out: list[Bbox] = []
    for line in ax.get_lines():
        xy = line.get_xydata()
        if len(xy) == 0:
            continue
        disp = ax.transData.transform(np.asarray(xy, float))
        disp = disp[np.isfinite(disp).all(axis=1)]
        if line.get_linestyle() not in ("None", "none", ""):
            for a, b in zip(disp, disp[1:]):
                out += _dots((tuple(a), tuple(b)), step=6.0, skip=r)
        out += [Bbox.from_extents(p[0] - r, p[1] - r, p[0] + r, p[1] + r) for p in disp]
    for coll in ax.collections:  # error bars (LineCollection segments)
        for seg in getattr(coll, "get_segments", lambda: [])():
            disp = ax.transData.transform(np.asarray(seg, float))
            for a, b in zip(disp, disp[1:]):
                out += _dots((tuple(a), tuple(b)), step=4.0, skip=0.0)
    return out


def place_labels(ax, points: Sequence[tuple[float, float, str, Any]], fontsize: float = 11,
                 renderer=None) -> list:
    """Annotate ``(x, y, text, color)`` points so that no label overlaps another label, a
    point, a curve or an error bar, nor leaves the axes; a label next to its point must be
    nearer to it than to any other point, one further out gets a leader line that crosses
    no label, point or other leader line. Greedy over :data:`_CANDIDATES`, measured with
    the renderer; call after everything else of the figure is drawn. Returns the annotations."""
    renderer = renderer or renderer_of(ax.figure)  # a renderer after the final layout pass
    ax_box = ax.get_window_extent(renderer)
    r = 5.0 * ax.figure.dpi / 72.0  # a marker's half size in pixels
    obstacles = np.array([b.extents for b in _obstacles(ax, renderer, r)]).reshape(-1, 4)
    labelled = [tuple(ax.transData.transform((x, y))) for x, y, _, _ in points]
    placed: list = []
    boxes: list[Bbox] = []
    leaders: list = []
    scale = ax.figure.dpi / 72.0  # points -> pixels
    for i, (x, y, text, color) in enumerate(points):
        others = [q for j, q in enumerate(labelled) if j != i]
        probe = ax.annotate(text, (x, y), fontsize=fontsize)  # the text's size, measured once
        size = Text.get_window_extent(probe, renderer)
        w, h = size.width, size.height
        probe.remove()
        best = None
        for dx, dy, ha, va, ring in _CANDIDATES:
            ax0, ay0 = labelled[i][0] + dx * scale, labelled[i][1] + dy * scale
            x0 = {"left": ax0, "right": ax0 - w, "center": ax0 - w / 2}[ha]
            y0 = {"bottom": ay0, "top": ay0 - h, "center": ay0 - h / 2}[va]
            box = Bbox.from_extents(x0, y0, x0 + w, y0 + h)
            cost = float(_areas(box.extents, obstacles).sum())
            cost += 1e4 * (max(0.0, ax_box.x0 - box.x0) + max(0.0, box.x1 - ax_box.x1)
                           + max(0.0, ax_box.y0 - box.y0) + max(0.0, box.y1 - ax_box.y1))
            cost += 1e3 * sum(_overlap(box, b) for b in boxes)
            cost += 300.0 * sum(_overlap(box, d) > 0 for seg in leaders for d in _dots(seg))
            own = _distance(labelled[i], box)
            segment = None
            if ring == 0:  # next to its point: nearer to it than to any other point
                cost += 300.0 * sum(_distance(q, box) < own + 2 for q in others)
            else:
                end = (min(max(labelled[i][0], box.x0), box.x1), min(max(labelled[i][1], box.y0), box.y1))
                segment = (labelled[i], end)
                dots = _dots(segment, skip=r)
                cost += 300.0 * sum(_overlap(d, b) > 0 for d in dots for b in boxes)
                cost += 300.0 * sum(_distance(q, d) < r for q in others for d in dots)
                cost += 300.0 * sum(_crosses(segment, other) for other in leaders)
                cost += 30.0 * sum(bool((_areas(d.extents, obstacles) > 0).any()) for d in dots)  # few curves crossed
            if best is None or cost < best[0]:
                best = (cost, (dx, dy, ha, va, ring), box, segment)
            if cost == 0:
                break
        dx, dy, ha, va, ring = best[1]
        ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                          fontsize=fontsize, color=color, annotation_clip=False,
                          arrowprops=dict(_LEADER) if ring else None)
        ann.set_in_layout(False)
        placed.append(ann)
        boxes.append(best[2])
        if best[3] is not None:
            leaders.append(best[3])
    return placed


def center_suptitle(fig: Figure):
    """Centre the figure title over the panels (not over panels + legend) and break it at
    its opening parenthesis when it would still reach into a figure legend on the right.
    Returns a renderer after the final layout pass (None when there was nothing to do)."""
    title = fig._suptitle
    if title is None or not fig.legends or getattr(title, "_otafl_centred", False):
        return None
    title._otafl_centred = True
    renderer = renderer_of(fig)
    boxes = [ax.get_position() for ax in fig.axes]
    left, right = min(b.x0 for b in boxes), max(b.x1 for b in boxes)
    title.set_x((left + right) / 2)
    legend_left = min(leg.get_window_extent(renderer).x0 for leg in fig.legends)
    if title.get_window_extent(renderer).x1 > legend_left - 4 and " (" in title.get_text():
        title.set_text(title.get_text().replace(" (", "\n(", 1))
        return renderer_of(fig)  # a taller title: lay out again
    return renderer  # moving the title sideways changes no layout
