"""Figures from a sweep's results file (matplotlib, no pyplot state; lecture-slide sizes).

Kinds (:data:`KINDS`):

- ``accuracy``  test accuracy vs round, one curve per configuration (mean over seeds,
  shaded +-1 std): the paper's Figs. 4-5.
- ``privacy``   per-round leakage (worst round) vs the uniform sampling probability p, one
  curve per accountant; central (left) and local (right), channel-aware sampling as
  horizontal reference lines: the paper's Fig. 7 style.
- ``tradeoff``  final accuracy vs central epsilon (worst round, or with ``epsilon="total"``
  composed over the run) of one accountant, one curve per sampling scheme, points labelled
  by p / h_th.
- ``channel``   channel gain traces h_{k,t} of one user per SNR group (regenerated from the
  stored spec and seed: the fading stream is a pure function of them) with the mean gain
  over users, and the number of participants |K_t| per round with its mean mu_t, per
  configuration (first seed).

Every figure has labelled axes with units and a legend; the format follows the output
suffix (.png, .svg, .pdf) and the file is written atomically.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from pathlib import Path
from typing import Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from otafl.errors import OtaflInputError
from otafl.report.table import RunGroup, accountants_of, group_runs
from otafl.sweep.store import ResultStore, StoredRun

__all__ = ["KINDS", "SUFFIXES", "STYLE", "make_figure", "save_figure", "plot_results"]

KINDS = ("accuracy", "privacy", "tradeoff", "channel")
SUFFIXES = (".png", ".svg", ".pdf")
#: Readable on a projected slide: 14-16 pt text, thick lines.
STYLE = {
    "font.size": 14, "axes.titlesize": 16, "axes.labelsize": 15, "xtick.labelsize": 13,
    "ytick.labelsize": 13, "legend.fontsize": 12, "legend.framealpha": 0.9, "lines.linewidth": 2.2,
    "lines.markersize": 7, "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 150,
}
ACCOUNTANT_STYLE = {"paper": ("tab:red", "o"), "tight": ("tab:blue", "s"), "exact": ("tab:green", "^")}
CHANNEL_WINDOW = 200  # rounds shown in the channel traces


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _mean(xs: Sequence[float]) -> float:
    xs = [float(x) for x in xs if _finite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _std(xs: Sequence[float]) -> float:
    xs = [float(x) for x in xs if _finite(x)]
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _colors(groups: Sequence[RunGroup]) -> list:
    """Uniform p: a sequential colour map by p; other schemes: fixed distinct colours."""
    cmap = matplotlib.colormaps["viridis"]
    uni = sorted({g.runs[0].params["sampling"]["p"] for g in groups if g.scheme == "uniform"})
    others = iter(["black", "tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:gray"])
    out = []
    for g in groups:
        if g.scheme == "uniform" and len(uni) > 1 and not g.group:
            out.append(cmap(0.05 + 0.75 * uni.index(g.runs[0].params["sampling"]["p"]) / (len(uni) - 1)))
        elif g.scheme == "uniform" and not g.group:
            out.append(cmap(0.4))
        else:
            out.append(next(others, None))
    return out


def _n_seeds(groups: Sequence[RunGroup]) -> str:
    n = sorted({len(g.runs) for g in groups})
    return f"{n[0]} seed{'s' if n[0] != 1 else ''}" if len(n) == 1 else f"{n[0]}-{n[-1]} seeds"


# --------------------------------------------------------------------------- kinds


def _accuracy(fig: Figure, store: ResultStore, groups: list[RunGroup], **_) -> None:
    ax = fig.subplots()
    drawn = 0
    for g, color in zip(groups, _colors(groups)):
        series = {}
        for run in g.runs:
            for rec in store.rounds(run.id):
                if _finite(rec.get("test_accuracy")):
                    series.setdefault(int(rec["round"]), []).append(100.0 * rec["test_accuracy"])
        if not series:
            continue
        xs = sorted(series)
        mean = [_mean(series[x]) for x in xs]
        std = [_std(series[x]) for x in xs]
        style = "--" if g.scheme != "uniform" else "-"
        ax.plot(xs, mean, style, color=color, marker="o" if len(xs) <= 30 else None, label=g.label)
        if len(g.runs) > 1:
            ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=color, alpha=0.15, linewidth=0)
        drawn += 1
    if not drawn:
        raise OtaflInputError("no test accuracy in this results file (the sweep ran with train = false); "
                              "use --kind privacy or --kind channel")
    ax.set_xlabel("round t")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Test accuracy vs round (mean ± std over {_n_seeds(groups)})")
    ax.legend(loc="lower right")


def _privacy(fig: Figure, store: ResultStore, groups: list[RunGroup], accountants: list[str], **_) -> None:
    axes = fig.subplots(1, 2, sharex=True)
    panels = (("epsilon_central", "central ε, worst round", "Central DP"),
              ("epsilon_local_max", "local ε, worst user and round", "Local DP"))
    uniform = [g for g in groups if g.scheme == "uniform"]
    if len(uniform) < 2:
        raise OtaflInputError("--kind privacy needs uniform sampling runs at two or more values of sampling.p; "
                              f"this file has {len(uniform)}")
    others = [g for g in groups if g.scheme != "uniform"]
    extra_sets = sorted({tuple(sorted((k, str(v)) for k, v in g.group.items())) for g in uniform})
    line_styles = ["-", "--", ":", "-."]
    for ax, (metric, ylabel, title) in zip(axes, panels):
        positive = []
        for a in accountants:
            color, marker = ACCOUNTANT_STYLE.get(a, (None, "D"))
            for j, extra in enumerate(extra_sets):
                pts = sorted((g.runs[0].params["sampling"]["p"], _mean([r.summary.get(f"{a}_{metric}") for r in g.runs]))
                             for g in uniform if tuple(sorted((k, str(v)) for k, v in g.group.items())) == extra)
                pts = [(p, e) for p, e in pts if _finite(e)]
                if not pts:
                    continue
                label = a + ("" if not extra else " (" + ", ".join(f"{k.split('.')[-1]} = {v}" for k, v in extra) + ")")
                ax.plot([p for p, _ in pts], [e for _, e in pts], line_styles[j % 4], color=color, marker=marker,
                        label=f"{label}, uniform p")
                positive += [e for _, e in pts if e > 0]
            for g in others:
                e = _mean([r.summary.get(f"{a}_{metric}") for r in g.runs])
                if _finite(e):
                    ax.axhline(e, color=color, linestyle=":", linewidth=1.8,
                               label=f"{a}, {g.label}")
                    positive += [e] if e > 0 else []
        if positive and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
        ax.set_xlabel("sampling probability p")
        ax.set_ylabel(ylabel + " (nats)")
        ax.set_title(title)
        ax.legend(fontsize=10 if len(accountants) * (1 + len(others)) > 4 else None)
    fig.suptitle(f"Per-round privacy leakage vs p (mean over {_n_seeds(groups)})")


EPSILONS = ("round", "total")  # tradeoff's x axis: worst round, or composed over the run


def _tradeoff(fig: Figure, store: ResultStore, groups: list[RunGroup], accountants: list[str],
              accountant: str | None = None, epsilon: str = "round", **_) -> None:
    acc_name = accountant or ("tight" if "tight" in accountants else accountants[0])
    if acc_name not in accountants:
        raise OtaflInputError(f"--accountant {acc_name!r} is not in this results file; "
                              f"available: {', '.join(accountants)}")
    ax = fig.subplots()
    by_scheme: dict[str, list] = {}
    for g in groups:
        accs = [r.summary.get("final_test_accuracy") for r in g.runs]
        eps = _mean([r.summary.get(f"{acc_name}_epsilon_central" + ("_total" if epsilon == "total" else ""))
                     for r in g.runs])
        if not any(_finite(a) for a in accs) or not _finite(eps):
            continue
        extra = ", ".join(f"{k.split('.')[-1]} = {v}" for k, v in g.group.items())
        by_scheme.setdefault(g.scheme + (f" ({extra})" if extra else ""), []).append(
            (eps, 100 * _mean(accs), 100 * _std(accs), g.setting))
    if not by_scheme:
        raise OtaflInputError("no run has both a test accuracy and a finite central epsilon "
                              "(train = false, or undefined bounds); nothing to plot")
    markers = iter(["o", "s", "^", "D", "v", "P", "X"])
    for name, pts in by_scheme.items():
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker=next(markers, "o"),
                    capsize=4, label=name, linestyle="-" if len(pts) > 1 else "none")
        for eps, acc, _, setting in pts:
            ax.annotate(setting, (eps, acc), textcoords="offset points", xytext=(6, 6), fontsize=11)
    positive = [p[0] for pts in by_scheme.values() for p in pts if p[0] > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(f"central ε over the run ({acc_name} accountant, nats)" if epsilon == "total" else
                  f"central ε per round, worst round ({acc_name} accountant, nats)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(f"Accuracy vs privacy (mean ± std over {_n_seeds(groups)})")
    ax.legend(loc="best")


def regenerate_gains(run: StoredRun):
    """The run's fading draw h [T, K] (float64), each user's SNR group [K] and the groups'
    SNRs, recomputed from its stored spec by :func:`otafl.setup.build_channel` (the loop's
    own channel setup: the same spec and seed give the same h)."""
    from otafl.config import spec_from_dict
    from otafl.setup import build_channel

    plan = build_channel(spec_from_dict(run.params), dim=int(run.summary.get("dim") or 1))
    return plan.h, plan.groups, list(plan.snr_db)


def _channel(fig: Figure, store: ResultStore, groups: list[RunGroup], **_) -> None:
    ax_h, ax_k = fig.subplots(2, 1, sharex=True)
    first = min((r for g in groups for r in g.runs), key=lambda r: (r.params["train"]["seed"], r.id))
    recs = store.rounds(first.id)
    T = len(recs)
    window = min(T, CHANNEL_WINDOW)
    xs = list(range(1, window + 1))
    h, user_group, snr = regenerate_gains(first)
    stored_mean = [rec["mean_gain"] for rec in recs]
    consistent = (h.shape[0] == T and all(abs(float(m) - s) <= 1e-9 * max(1.0, abs(s))
                                          for m, s in zip(h.mean(dim=1), stored_mean)))
    if consistent:  # one representative user (the first) of each SNR group
        for j, s in enumerate(snr):
            users = (user_group == j).nonzero().flatten()
            if users.numel():
                k = int(users[0])
                ax_h.plot(xs, h[:window, k].tolist(), linewidth=1.4, label=f"user {k} ({s:g} dB group)")
    ax_h.plot(xs, stored_mean[:window], color="black", linewidth=2.4, label="mean over all users")
    ax_h.set_ylabel("channel gain h (amplitude)")
    ax_h.set_title(f"Fading and participation (seed {first.params['train']['seed']}"
                   + (f", first {window} of {T} rounds)" if window < T else ")"))
    ax_h.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=11)
    for g, color in zip(groups, _colors(groups)):
        run = min(g.runs, key=lambda r: (r.params["train"]["seed"], r.id))
        rr = store.rounds(run.id)[:window]
        ax_k.plot(xs[:len(rr)], [r["participants"] for r in rr], color=color, linewidth=1.3, alpha=0.85,
                  label=g.label)
        ax_k.plot(xs[:len(rr)], [r["expected_participants"] for r in rr], color=color, linewidth=1.0,
                  linestyle="--")
    ax_k.set_xlabel("round t")
    ax_k.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax_k.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax_k.set_ylabel("participants |K_t| (users)")
    ax_k.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=11, title="solid: |K_t|\ndashed: μ_t",
                title_fontsize=11)


_KIND_FUNCS = {"accuracy": _accuracy, "privacy": _privacy, "tradeoff": _tradeoff, "channel": _channel}
_SIZES = {"accuracy": (10, 6.5), "privacy": (15, 6.5), "tradeoff": (10, 6.5), "channel": (14, 9)}


def make_figure(store: ResultStore, kind: str, *, runs: Sequence[StoredRun] | None = None,
                group_by: Sequence[str] | None = None, accountant: str | None = None,
                epsilon: str = "round") -> Figure:
    """Draw one figure of ``kind`` from the ``done`` runs of ``store`` (see the module docstring)."""
    if kind not in _KIND_FUNCS:
        raise OtaflInputError(f"plot kind {kind!r} is not one of: {', '.join(KINDS)}")
    if epsilon not in EPSILONS:
        raise OtaflInputError(f"epsilon = {epsilon!r} is not one of: {', '.join(EPSILONS)}")
    runs = store.runs("done") if runs is None else list(runs)
    groups, _ = group_runs(runs, group_by)
    accountants = accountants_of(runs)
    if kind in ("privacy", "tradeoff") and not accountants:
        raise OtaflInputError("the runs in this results file carry no privacy accountant results")
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=_SIZES[kind], layout="constrained")
        _KIND_FUNCS[kind](fig, store, groups, accountants=accountants, accountant=accountant, epsilon=epsilon)
    return fig


def check_suffix(out: str | Path) -> str:
    """The image format from the output suffix; other suffixes: OtaflInputError."""
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise OtaflInputError(f"--out {str(out)!r} has suffix {suffix or '(none)'!r}; allowed: {', '.join(SUFFIXES)}")
    return suffix[1:]


def save_figure(fig: Figure, out: str | Path) -> Path:
    """Write ``fig`` to ``out`` (format from the suffix) via a temporary file and a rename."""
    fmt = check_suffix(out)
    path = Path(out)
    buf = io.BytesIO()
    with matplotlib.rc_context(STYLE):
        fig.savefig(buf, format=fmt, metadata={"Software": "otafl"} if fmt == "png" else None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OtaflInputError(f"cannot write {str(path)!r}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(buf.getvalue())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a figure is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def plot_results(results: str | Path, kind: str, out: str | Path, *, group_by: Sequence[str] | None = None,
                 accountant: str | None = None, epsilon: str = "round") -> Path:
    """Read a results file, draw ``kind`` and save it to ``out``; returns the path."""
    from otafl.sweep.store import read_store

    check_suffix(out)
    with read_store(results) as store:
        fig = make_figure(store, kind, group_by=group_by, accountant=accountant, epsilon=epsilon)
    return save_figure(fig, out)
