"""Figures from a sweep's results file (matplotlib, no pyplot state; lecture-slide sizes).

Kinds (:data:`KINDS`):

- ``accuracy``  test accuracy vs round, one curve per configuration (mean over seeds,
  shaded +-1 std; "1 seed: no band"): the paper's Figs. 4-5.
- ``privacy``   leakage vs the uniform sampling probability p, one curve per accountant
  (default: every accountant in the file); central (left) and local (right),
  channel-aware sampling as horizontal reference lines: the paper's Fig. 7 style.
- ``tradeoff``  final accuracy vs central epsilon of the chosen accountant (default:
  ``exact`` if the runs carry it, else the first present, as ``otafl table``), one curve
  per sampling scheme, points labelled by p / h_th (placed so that they never overlap
  each other, a point or a curve, nor leave the axes).
- ``channel``   channel gain traces h_{k,t} of one user per SNR group (regenerated from the
  stored spec and seed: the fading stream is a pure function of them) with the mean gain
  over users, and the number of participants |K_t| per round with its mean mu_t, per
  configuration (first seed).
- ``scaling``   final accuracy and central epsilon (total at delta_total; worst round
  dashed, with its fitted log-log slope) against a swept numeric key (``x=``, default
  ``data.users``), one curve per configuration of the other keys: trained runs beside
  ``otafl scaling`` (:mod:`otafl.report.plots.versus`).

``epsilon="round"`` plots the worst round's leakage, ``"total"`` the leakage composed over
the T rounds; the axis label says which. A second sweep axis (default: the first swept
key other than the sampling ones and the seed, e.g. ``channel.snr_db``; ``facet=``
chooses, ``"none"`` turns it off) becomes one panel per value, in numeric order. One
legend per figure, outside the axes, one entry per distinct curve (identical curves of a
panel are drawn once, labelled ``A ≡ B``). Points whose accountant left its validity
range (``{acc}_classic_valid`` false: paper's classic Gaussian step) are hollow, with a
legend note. The format follows the output suffix (.png, .svg, .pdf); the file is
written atomically.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import matplotlib
from matplotlib.figure import Figure

from otafl.errors import OtaflInputError
from otafl.results import atomic_write_bytes, output_target
from otafl.report.plots.channel import CHANNEL_WINDOW, channel_figure, regenerate_gains
from otafl.report.plots.common import center_suptitle, split_facets
from otafl.report.plots.kinds import ACCOUNTANT_STYLE, accuracy_figure, privacy_figure, tradeoff_figure
from otafl.report.plots.versus import DEFAULT_X, scaling_figure, slope_text
from otafl.report.table import accountants_of, choose_accountants, group_runs
from otafl.report.names import EPSILONS, KINDS, SUFFIXES, check_suffix
from otafl.sweep.store import ResultStore, StoredRun

__all__ = ["ACCOUNTANT_STYLE", "CHANNEL_WINDOW", "EPSILONS", "KINDS", "SUFFIXES", "STYLE", "check_suffix",
           "make_figure", "plot_results", "regenerate_gains", "save_figure", "scaling_slopes"]

#: Readable on a projected slide: 14-16 pt text, thick lines.
STYLE = {
    "font.size": 14, "axes.titlesize": 16, "axes.labelsize": 15, "xtick.labelsize": 13,
    "ytick.labelsize": 13, "legend.fontsize": 12, "legend.framealpha": 0.9, "lines.linewidth": 2.2,
    "lines.markersize": 7, "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 150,
}

_KIND_FUNCS = {"accuracy": accuracy_figure, "privacy": privacy_figure, "tradeoff": tradeoff_figure,
               "channel": channel_figure, "scaling": scaling_figure}


def _size(kind: str, n: int) -> tuple[float, float]:
    """Figure size for ``n`` facet values (panels in rows of three; privacy: a row each)."""
    cols, rows = min(n, 3), -(-n // 3)
    legend = 4.5
    if kind == "privacy":
        return (15.0 + 1.5, 1.2 + 5.2 * n)
    if kind == "channel":
        return (5.5 * n + legend + 3.0, 9.0)
    if kind == "scaling":
        return (17.0, 7.0)
    return (max(10.0, 5.2 * cols + legend), 1.2 + 5.0 * rows + (0.4 if n > 1 else 0.3))


def facet_key(keys: Sequence[str], facet: str | None) -> str | None:
    """The grouping key drawn as panels: ``facet`` (one of ``keys``; ``"none"``: no panels)
    or by default the first of ``keys``."""
    if facet is None:
        return keys[0] if keys else None
    if facet == "none":
        return None
    if facet not in keys:
        raise OtaflInputError(f"--facet {facet!r} is not a grouping key of these runs; "
                              f"grouping keys: {', '.join(keys) or 'none'} (or none)")
    return facet


def tradeoff_along(groups, keys: Sequence[str]) -> str | None:
    """The swept key a ``tradeoff`` curve runs along when no scheme varies its p / h_th (an SNR
    sweep at one p): the first grouping key, so that its values are the points of one curve in
    one panel (not one panel per value with one point each). None when p / h_th varies: the
    curves run along them, the other keys are panels."""
    settings: dict[str, set] = {}
    for g in groups:
        settings.setdefault(g.scheme, set()).add(g.setting)
    return keys[0] if keys and all(len(s) == 1 for s in settings.values()) else None


def make_figure(store: ResultStore, kind: str, *, runs: Sequence[StoredRun] | None = None,
                group_by: Sequence[str] | None = None, accountant: str | Sequence[str] | None = None,
                facet: str | None = None, epsilon: str = "round", x: str = DEFAULT_X) -> Figure:
    """Draw one figure of ``kind`` from the ``done`` runs of ``store`` (see the module docstring).

    ``accountant``: names (``"exact,tight"``, a list, or ``"all"``); default: every
    accountant present for ``privacy``, :func:`~otafl.report.table.default_accountants`
    for ``tradeoff``.
    """
    if kind not in _KIND_FUNCS:
        raise OtaflInputError(f"plot kind {kind!r} is not one of: {', '.join(KINDS)}")
    if epsilon not in EPSILONS:
        raise OtaflInputError(f"--epsilon {epsilon!r} is not one of: {', '.join(EPSILONS)}")
    runs = store.runs("done") if runs is None else list(runs)
    groups, keys = group_runs(runs, group_by)
    fkey = None if kind == "scaling" else facet_key(keys, facet)
    along = tradeoff_along(groups, keys) if kind == "tradeoff" and facet is None else None
    if along is not None:
        fkey = None
    if kind in ("privacy", "tradeoff", "scaling"):
        if not accountants_of(runs):
            raise OtaflInputError("the runs in this results file carry no privacy accountant results")
        accountants = choose_accountants(runs, "all" if accountant is None and kind == "privacy" else accountant)
    else:
        accountants = []
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=_size(kind, len(split_facets(groups, fkey))), layout="constrained")
        _KIND_FUNCS[kind](fig, store, groups, accountants=accountants, facet=fkey, epsilon=epsilon, x=x,
                          **({"along": along} if along else {}))
        center_suptitle(fig)
    return fig


def save_figure(fig: Figure, out: str | Path) -> Path:
    """Write ``fig`` to ``out`` (format from the suffix) via a temporary file and a rename."""
    fmt = check_suffix(out)
    path = Path(out)
    buf = io.BytesIO()
    with matplotlib.rc_context(STYLE):
        fig.savefig(buf, format=fmt, metadata={"Software": "otafl"} if fmt == "png" else None)
    return atomic_write_bytes(path, buf.getvalue())


def plot_results(results: str | Path, kind: str, out: str | Path, *, group_by: Sequence[str] | None = None,
                 accountant: str | Sequence[str] | None = None, facet: str | None = None,
                 epsilon: str = "round", x: str = DEFAULT_X) -> Path:
    """Read a results file, draw ``kind`` and save it to ``out``; returns the path."""
    from otafl.sweep.store import read_store

    check_suffix(out)
    output_target(out)  # refused before the work: a device node, FIFO or folder is never replaced
    with read_store(results) as store:
        fig = make_figure(store, kind, group_by=group_by, accountant=accountant, facet=facet, epsilon=epsilon, x=x)
    return save_figure(fig, out)


def scaling_slopes(results: str | Path, *, group_by: Sequence[str] | None = None,
                   accountant: str | Sequence[str] | None = None, x: str = DEFAULT_X) -> str:
    """The fitted log-log slopes of the ``scaling`` figure, one line per accountant and curve."""
    from otafl.sweep.store import read_store

    with read_store(results) as store:
        runs = store.runs("done")
        groups, _ = group_runs(runs, group_by)
        return slope_text(groups, x, choose_accountants(runs, accountant))
