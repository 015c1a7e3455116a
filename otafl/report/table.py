"""Trade-off tables in the layout of the paper's Table II, from a sweep's results file.

One row per configuration (sampling scheme, its knob p or h_th, and any other swept
value), aggregated over seeds:

- test accuracy, mean +- sample standard deviation over seeds (in %; NaN when the sweep
  ran with ``train = false``);
- for each accountant A (``paper``, ``tight``, ...): local (LDP) leakage, worst round
  (``A_epsilon_local_max``: max over users and rounds) and composed over the run
  (``A_epsilon_local_total``), and central leakage, worst round (``A_epsilon_central``)
  and composed (``A_epsilon_central_total``); each the mean over seeds. +inf marks a
  bound that is undefined for some round (e.g. mu_t <= K beta_t for Hoeffding);
- the mean number of participants per round, E_t |K_t|, mean over seeds;
- when the runs report them, the uplink's channel uses, energy and outages per round (means
  over rounds and seeds; :data:`COSTS`), e.g. over the air against digital aggregation.

``tradeoff_table`` computes the rows; ``render_table`` writes Markdown, LaTeX (booktabs)
or CSV. Rows are ordered by scheme (uniform, time-varying, channel-aware), then knob,
then the other grouping values.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from otafl.errors import OtaflInputError
from otafl.sweep.store import StoredRun

__all__ = ["COSTS", "FORMATS", "METRICS", "RunGroup", "TableRow", "TradeoffTable", "accountants_of", "flat_params",
           "group_runs", "render_table", "setting_label", "tradeoff_table", "varying_keys"]

FORMATS = ("md", "latex", "csv")
SCHEME_ORDER = {"uniform": 0, "time-varying": 1, "channel-aware": 2}
TRAIN_KEY = "sweep.train"  # pseudo-key: a file may hold trained and bounds-only runs
#: (summary suffix, short header, LaTeX header) of the leakage columns, per accountant.
METRICS = (
    ("epsilon_local_max", "ε_l round", r"$\varepsilon_\mathrm{l}$ round"),
    ("epsilon_local_total", "ε_l total", r"$\varepsilon_\mathrm{l}$ total"),
    ("epsilon_central", "ε_c round", r"$\varepsilon_\mathrm{c}$ round"),
    ("epsilon_central_total", "ε_c total", r"$\varepsilon_\mathrm{c}$ total"),
)
#: Grouping keys shown first when they vary (the system compared), the rest alphabetically.
LEADING_KEYS = ("train.aggregation", "digital.mechanism")
#: (summary key, header) of the uplink cost columns, shown when some run reports them.
COSTS = (
    ("channel_uses_per_round", "channel uses"),
    ("energy_per_round", "energy"),
    ("outages_per_round", "outages"),
)


def flat_params(params: dict, train: bool | None = None) -> dict[str, Any]:
    """A run's spec dict -> ``{"section.key": value}``; lists become tuples (hashable)."""
    out = {}
    for section, body in params.items():
        if isinstance(body, dict):
            for key, value in body.items():
                out[f"{section}.{key}"] = tuple(value) if isinstance(value, list) else value
    if train is not None:
        out[TRAIN_KEY] = bool(train)
    return out


def setting_label(flat: dict[str, Any]) -> str:
    """The scheme's own knob, as the paper writes it: ``p = 0.5``, ``h_th = 2``, ``linear 0.9→0.3``."""
    scheme = flat.get("sampling.scheme")
    if scheme == "uniform":
        return f"p = {flat['sampling.p']:g}"
    if scheme == "channel-aware":
        return f"h_th = {flat['sampling.h_th']:g}"
    if scheme == "time-varying":
        sched = flat.get("sampling.schedule")
        if sched == "list":
            return "list " + ",".join(f"{v:g}" for v in flat.get("sampling.values", ()))
        if sched == "constant":
            return f"constant {flat['sampling.p_start']:g}"
        return f"{sched} {flat['sampling.p_start']:g}→{flat['sampling.p_end']:g}"
    return str(scheme)


def _setting_sort(flat: dict[str, Any]) -> tuple:
    scheme = flat.get("sampling.scheme")
    knob = {"uniform": flat.get("sampling.p"), "channel-aware": flat.get("sampling.h_th")}.get(scheme)
    return (SCHEME_ORDER.get(scheme, 9), scheme, -1.0 if knob is None else float(knob), setting_label(flat))


def _sortable(v: Any) -> tuple:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, float(v), "")
    return (1, 0.0, json.dumps(v, default=str))


def accountants_of(runs: Sequence[StoredRun]) -> list[str]:
    """Accountant names present in the summaries, in the order the specs list them."""
    names: list[str] = []
    for run in runs:
        for a in run.params.get("privacy", {}).get("accountants", []):
            if a not in names and f"{a}_epsilon_central" in run.summary:
                names.append(a)
    return names


@dataclass
class TableRow:
    """One configuration, aggregated over its seeds (values are means unless noted)."""

    scheme: str
    setting: str  # "p = 0.5", "h_th = 2", ...
    p: float | None  # uniform only
    h_th: float | None  # channel-aware only
    group: dict[str, Any]  # the other grouping keys -> value
    seeds: list[int]
    accuracy_mean: float  # fraction in [0, 1]; NaN: not trained
    accuracy_std: float  # sample std over seeds (NaN for one seed)
    leakage: dict[str, dict[str, float]]  # accountant -> metric suffix -> mean over seeds
    mean_participants: float
    costs: dict[str, float] = field(default_factory=dict)  # COSTS key -> mean over seeds


@dataclass
class TradeoffTable:
    rows: list[TableRow]
    group_keys: list[str]
    accountants: list[str]
    compositions: dict[str, list[str]] = field(default_factory=dict)  # accountant -> methods used
    rounds: list[int] = field(default_factory=list)  # distinct T over the runs
    costs: list[str] = field(default_factory=list)  # COSTS keys some run reports


def _mean(values: Sequence[float]) -> float:
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else math.nan


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def varying_keys(runs: Sequence[StoredRun]) -> list[str]:
    """Spec keys whose value differs between runs, other than the seed and the sampling keys
    (which the scheme and setting columns show)."""
    flats = [flat_params(r.params, r.train) for r in runs]
    keys = sorted(set().union(*flats), key=lambda k: (k not in LEADING_KEYS, LEADING_KEYS.index(k)
                                                      if k in LEADING_KEYS else 0, k)) if flats else []
    return [k for k in keys
            if k != "train.seed" and not k.startswith("sampling.")
            and len({json.dumps(f.get(k), default=str) for f in flats}) > 1]


@dataclass
class RunGroup:
    """Runs of one configuration (they differ only in the seed, or in keys left out of the grouping)."""

    scheme: str
    setting: str
    group: dict[str, Any]
    runs: list[StoredRun]
    sort_key: tuple

    @property
    def label(self) -> str:
        extra = ", ".join(f"{k.split('.')[-1]} = {_fmt_value(v)}" for k, v in self.group.items())
        return f"{self.scheme}, {self.setting}" + (f", {extra}" if extra else "")


def group_runs(runs: Sequence[StoredRun], group_by: Sequence[str] | None = None) -> tuple[list[RunGroup], list[str]]:
    """Group runs by (scheme, setting, grouping keys); returns (groups in table order, keys).

    ``group_by``: grouping keys besides the scheme and its setting (p / h_th). Default:
    every spec key that varies between the runs (except the seed), e.g. ``channel.snr_db``
    in an SNR sweep. Runs that differ only in keys left out are pooled with the seeds.
    """
    if not runs:
        raise OtaflInputError("the results file holds no finished ('done') runs yet; run or resume the sweep first")
    flats = [flat_params(r.params, r.train) for r in runs]
    known = sorted(set().union(*flats))
    if group_by is None:
        keys = varying_keys(runs)
    else:
        keys = []
        for k in group_by:
            if k not in known:
                raise OtaflInputError(f"--group-by {k!r} is not a spec key of these runs; "
                                      f"keys that vary: {', '.join(varying_keys(runs)) or 'none'}")
            if k not in keys and k != "sampling.scheme":
                keys.append(k)
    groups: dict[tuple, RunGroup] = {}
    for run, f in zip(runs, flats):
        gkey = (f.get("sampling.scheme"), setting_label(f), *(json.dumps(f.get(k), default=str) for k in keys))
        if gkey not in groups:
            groups[gkey] = RunGroup(scheme=str(f.get("sampling.scheme")), setting=setting_label(f),
                                    group={k: f.get(k) for k in keys}, runs=[],
                                    sort_key=(*_setting_sort(f), *(_sortable(f.get(k)) for k in keys)))
        groups[gkey].runs.append(run)
    return sorted(groups.values(), key=lambda g: g.sort_key), keys


def tradeoff_table(runs: Sequence[StoredRun], *, group_by: Sequence[str] | None = None) -> TradeoffTable:
    """Group ``done`` runs by configuration and aggregate over seeds (see the module docstring).

    Parameters
    ----------
    runs : sequence of StoredRun
        ``done`` runs from :meth:`otafl.sweep.store.ResultStore.runs`.
    group_by : sequence of ``section.key``, optional
        See :func:`group_runs`.

    Raises
    ------
    OtaflInputError
        No runs, or a ``group_by`` key that no run has.
    """
    groups, keys = group_runs(runs, group_by)
    accountants = accountants_of(runs)
    costs = [k for k, _ in COSTS if any(not math.isnan(_num(r.summary.get(k))) for r in runs)]

    rows = []
    for g in groups:
        summaries = [r.summary for r in g.runs]
        accs = [_num(s.get("final_test_accuracy")) for s in summaries]
        finite = [a for a in accs if not math.isnan(a)]
        f0 = flat_params(g.runs[0].params)
        rows.append(TableRow(
            scheme=g.scheme, setting=g.setting,
            p=f0.get("sampling.p") if g.scheme == "uniform" else None,
            h_th=f0.get("sampling.h_th") if g.scheme == "channel-aware" else None,
            group=dict(g.group),
            seeds=sorted(int(r.params.get("train", {}).get("seed", 0)) for r in g.runs),
            accuracy_mean=sum(finite) / len(finite) if finite else math.nan,
            accuracy_std=statistics.stdev(finite) if len(finite) > 1 else math.nan,
            leakage={a: {m: _mean([_num(s.get(f"{a}_{m}")) for s in summaries]) for m, _, _ in METRICS}
                     for a in accountants},
            mean_participants=_mean([_num(s.get("mean_participants")) for s in summaries]),
            costs={k: _mean([_num(s.get(k)) for s in summaries]) for k in costs}))
    compositions = {a: sorted({str(r.summary.get(f"{a}_composition")) for r in runs
                               if r.summary.get(f"{a}_composition") is not None}) for a in accountants}
    rounds = sorted({int(r.summary["rounds"]) for r in runs if "rounds" in r.summary})
    return TradeoffTable(rows=rows, group_keys=keys, accountants=accountants, compositions=compositions,
                         rounds=rounds, costs=costs)


# --------------------------------------------------------------------------- rendering


def _fmt_eps(x: float, fmt: str) -> str:
    if math.isnan(x):
        return {"md": "–", "latex": "--"}.get(fmt, "")
    if math.isinf(x):
        return {"md": "∞", "latex": r"$\infty$"}.get(fmt, "inf")
    return f"{x:.3g}"


def _fmt_value(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt_value(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


OTA_ONLY_KEYS = ("transmit.sigma2", "transmit.alignment", "transmit.threshold")


def _group_cell(row: TableRow, key: str) -> str:
    """A grouping value; '–' where the run does not use the key (a [digital] key of an
    over-the-air run, an over-the-air transmit key of a digital run)."""
    agg = row.group.get("train.aggregation")
    if (key.startswith("digital.") and agg not in (None, "digital")) or (key in OTA_ONLY_KEYS and agg == "digital"):
        return "–"
    return _fmt_value(row.group[key])


def _fmt_acc(row: TableRow, fmt: str) -> str:
    if math.isnan(row.accuracy_mean):
        return {"md": "–", "latex": "--"}[fmt]
    pm = {"md": " ± ", "latex": r" $\pm$ "}[fmt]
    mean = f"{100 * row.accuracy_mean:.1f}"
    return mean if math.isnan(row.accuracy_std) else f"{mean}{pm}{100 * row.accuracy_std:.1f}"


def _legend(table: TradeoffTable) -> str:
    comp = "; ".join(f"{a}: {', '.join(m) or 'n/a'}" for a, m in table.compositions.items())
    rounds = ", ".join(str(t) for t in table.rounds)
    return (f"Accuracy: final test accuracy in %, mean ± std over seeds. ε_l: local (LDP) leakage, "
            f"worst user; ε_c: central leakage; 'round': worst single round, 'total': composed over "
            f"the T = {rounds} rounds ({comp}). Leakage and participants (mean |K_t| per round) "
            f"are means over seeds; ∞: the bound is undefined in some round."
            + (" Channel uses, energy (units of the per-block budget P_k) and outages: means per round "
               "of the uplink (over the air: d uses; digital: orthogonal access, docs/model.md#digital)."
               if table.costs else ""))


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"),
                 ("→", r"$\to$"), ("ε", r"$\varepsilon$"), ("±", r"$\pm$"), ("∞", r"$\infty$"),
                 ("|", r"$|$")):
        text = text.replace(a, b)
    return text


def render_table(table: TradeoffTable, fmt: str = "md", *, legend: bool = True) -> str:
    """Render as ``md`` (GitHub pipe table), ``latex`` (booktabs tabular) or ``csv`` (numbers)."""
    if fmt not in FORMATS:
        raise OtaflInputError(f"table format {fmt!r} is not one of: {', '.join(FORMATS)}")
    acc = table.accountants
    if fmt == "csv":
        header = ["scheme", "setting", "p", "h_th", *table.group_keys, "seeds", "accuracy_mean", "accuracy_std",
                  *(f"{a}_{m}" for a in acc for m, _, _ in METRICS), "mean_participants", *table.costs]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        for r in table.rows:
            w.writerow([r.scheme, r.setting, "" if r.p is None else r.p, "" if r.h_th is None else r.h_th,
                        *(_fmt_value(r.group[k]) for k in table.group_keys), len(r.seeds),
                        *(_csv_num(x) for x in (r.accuracy_mean, r.accuracy_std)),
                        *(_csv_num(r.leakage[a][m]) for a in acc for m, _, _ in METRICS),
                        _csv_num(r.mean_participants), *(_csv_num(r.costs[k]) for k in table.costs)])
        return buf.getvalue()

    esc = _latex_escape if fmt == "latex" else (lambda t: t)
    cells = [[esc(r.scheme), esc(r.setting), *(esc(_group_cell(r, k)) for k in table.group_keys),
              str(len(r.seeds)), _fmt_acc(r, fmt), *(_fmt_eps(r.leakage[a][m], fmt) for a in acc for m, _, _ in METRICS),
              f"{r.mean_participants:.1f}", *(_fmt_eps(r.costs[k], fmt) for k in table.costs)] for r in table.rows]
    cost_heads = [head for key, head in COSTS if key in table.costs]
    n_key = 2 + len(table.group_keys) + 2
    if fmt == "md":
        header = ["scheme", "p / h_th", *table.group_keys, "seeds", "accuracy (%)",
                  *(f"{a} {short}" for a in acc for _, short, _ in METRICS), "participants", *cost_heads]
        align = ["---"] * n_key + ["--:"] * (len(header) - n_key)
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        text = "\n".join(lines) + "\n"
        return text + ("\n" + _legend(table) + "\n" if legend else "")

    # LaTeX (booktabs): two header rows, each accountant's name spanning its four columns
    cols = "l" * n_key + "r" * (4 * len(acc) + 1 + len(cost_heads))
    top = [""] * n_key + [rf"\multicolumn{{4}}{{c}}{{{_latex_escape(a)}}}" for a in acc] + [""] * (1 + len(cost_heads))
    rules = "".join(rf"\cmidrule(lr){{{n_key + 1 + 4 * i}-{n_key + 4 * (i + 1)}}}" for i in range(len(acc)))
    header = ["scheme", r"$p$ / $h_\mathrm{th}$", *(_latex_escape(k) for k in table.group_keys), "seeds",
              r"accuracy (\%)", *(tex for _ in acc for _, _, tex in METRICS), r"$\overline{|K_t|}$",
              *cost_heads]
    lines = ["% " + _latex_escape(_legend(table))] if legend else []
    lines += [rf"\begin{{tabular}}{{{cols}}}", r"\toprule", " & ".join(top) + r" \\", rules,
              " & ".join(header) + r" \\", r"\midrule"]
    lines += [" & ".join(c) + r" \\" for c in cells]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _csv_num(x: float) -> str:
    if math.isnan(x):
        return ""
    return "inf" if math.isinf(x) else repr(float(x))
