"""Trade-off tables in the layout of the paper's Table II, from a sweep's results file.

One row per configuration (sampling scheme, its knob p or h_th, and any other swept
value), aggregated over seeds. The columns (:data:`COLUMNS`, picked and ordered with
``columns=``; :data:`DEFAULT_COLUMNS` otherwise):

- ``scheme``, ``setting`` (the knob as the paper writes it: ``p = 0.5``, ``h_th = 2``),
  ``p``, ``h_th``, ``group`` (one column per other swept key, e.g. ``channel.snr_db``;
  a key's own name picks it alone), ``seeds`` (how many were pooled);
- ``accuracy``: final test accuracy, mean +- sample std over seeds (in %; NaN when the
  sweep ran with ``train = false``);
- per chosen accountant A (``exact``, ``tight``, ``paper``): ``eps_local_round`` (LDP of
  the worst user in the worst round, ``A_epsilon_local_max``), ``eps_local_total`` (LDP
  composed over the T rounds, ``A_epsilon_local_total``), ``eps_central_round``
  (``A_epsilon_central``, worst round), ``eps_central_total`` (``A_epsilon_central_total``),
  ``delta_local_total``, ``delta_central_total``, ``composition`` (the method that gave
  each total: ``A_composition`` central, ``A_composition_local`` local) and ``valid``
  (every ``A_classic_valid*`` flag true in every seed: the accountant's classic Gaussian
  step stayed in its validity range, so its number is a theorem); each the mean over
  seeds. +inf marks a bound that is undefined in some round;
- ``participants``: the mean number of participants per round, E_t |K_t|.

The accountants shown (``accountants=``) default to :func:`default_accountants`: ``exact``
when the runs carry its fields, else the first accountant present, and ``digital`` beside it
when some run carries it. Rows are ordered by
scheme (uniform, time-varying, channel-aware), then knob, then the other grouping values,
compared as numbers (lists element by element), never as text.

``tradeoff_table`` computes the rows; :mod:`otafl.report.table_format` picks the columns
(:func:`~otafl.report.table_format.resolve_columns`) and writes plain text, Markdown,
LaTeX or CSV (:func:`render_table`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from otafl.errors import OtaflInputError
from otafl.sweep.store import StoredRun
from otafl.privacy.units import unit_of

__all__ = ["COLUMNS", "COSTS", "DEFAULT_COLUMNS", "CSV_DEFAULT_COLUMNS", "FORMATS", "PER_ACCOUNTANT", "RunGroup",
           "TableRow", "TradeoffTable", "accountants_of", "choose_accountants", "default_accountants", "flat_params",
           "group_runs", "setting_label", "sort_key", "tradeoff_table",
           "validity_of", "varying_keys"]

FORMATS = ("md", "text", "latex", "csv")
SCHEME_ORDER = {"uniform": 0, "time-varying": 1, "channel-aware": 2}
TRAIN_KEY = "sweep.train"  # pseudo-key: a file may hold trained and bounds-only runs
#: Summary suffixes averaged over seeds per accountant (``TableRow.leakage``).
LEAKAGE_KEYS = ("epsilon_local_max", "epsilon_local_total", "epsilon_central", "epsilon_central_total",
                "delta_local_total", "delta_central_total")

#: Column name -> what it shows (``otafl table --columns``).
COLUMNS: dict[str, str] = {
    "scheme": "sampling scheme (uniform, time-varying, channel-aware)",
    "setting": "the scheme's knob as the paper writes it: p = 0.5, h_th = 2, linear 0.9→0.3",
    "p": "uniform sampling probability p (empty for the other schemes)",
    "h_th": "channel-aware threshold h_th (empty for the other schemes)",
    "group": "one column per other swept key, e.g. channel.snr_db (a key's own name picks it alone)",
    "seeds": "number of seeds pooled in the row",
    "accuracy": "final test accuracy in %, mean ± std over seeds",
    "eps_local_round": "local (LDP) ε of the worst user in the worst round, per accountant",
    "eps_local_total": "local ε composed over the T rounds, per accountant",
    "eps_central_round": "central ε of the worst round, per accountant",
    "eps_central_total": "central ε composed over the T rounds, per accountant",
    "delta_local_total": "δ of the composed local guarantee, per accountant",
    "delta_central_total": "δ of the composed central guarantee, per accountant",
    "composition": "composition that gave the totals (central / local), per accountant",
    "valid": "the accountant's classic Gaussian steps stayed in their validity range (all seeds), per accountant",
    "participants": "mean number of participants per round, E_t |K_t|",
    "channel_uses": "uplink channel uses per round (over the air: d; digital: orthogonal access), shown by "
                    "default when the runs compare aggregations",
    "energy": "uplink transmit energy per round (units of the per-block budget P_k)",
    "outages": "digital users in outage per round",
}
#: Cost columns -> their summary key (means over rounds, then seeds).
COSTS: dict[str, str] = {"channel_uses": "channel_uses_per_round", "energy": "energy_per_round",
                         "outages": "outages_per_round"}
#: Per-accountant columns -> their summary suffix (None: not a number).
PER_ACCOUNTANT: dict[str, str | None] = {
    "eps_local_round": "epsilon_local_max", "eps_local_total": "epsilon_local_total",
    "eps_central_round": "epsilon_central", "eps_central_total": "epsilon_central_total",
    "delta_local_total": "delta_local_total", "delta_central_total": "delta_central_total",
    "composition": None, "valid": None,
}
DEFAULT_COLUMNS = ("scheme", "setting", "group", "seeds", "accuracy", "eps_local_round", "eps_local_total",
                   "eps_central_round", "eps_central_total", "participants")
CSV_DEFAULT_COLUMNS = ("scheme", "setting", "p", "h_th", "group", "seeds", "accuracy", "eps_local_round",
                       "eps_local_total", "eps_central_round", "eps_central_total", "valid", "participants")


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


def sort_key(v: Any) -> tuple:
    """A total order on spec values that compares numbers as numbers and lists element by
    element (``[2, 10, 30]`` before ``[10, 20, 40]``); then booleans, text, None."""
    if isinstance(v, bool):
        return (2, int(v))
    if isinstance(v, (int, float)):
        f = float(v)
        return (0, -math.inf if math.isnan(f) else f)
    if isinstance(v, (tuple, list)):
        return (1, tuple(sort_key(x) for x in v))
    if v is None:
        return (4,)
    return (3, str(v))


def _setting_sort(flat: dict[str, Any]) -> tuple:
    scheme = flat.get("sampling.scheme")
    if scheme == "uniform":
        knob: Any = flat.get("sampling.p")
    elif scheme == "channel-aware":
        knob = flat.get("sampling.h_th")
    elif scheme == "time-varying":
        sched = flat.get("sampling.schedule")
        knob = (sched, flat.get("sampling.values") if sched == "list"
                else (flat.get("sampling.p_start"), flat.get("sampling.p_end")))
    else:
        knob = None
    return (SCHEME_ORDER.get(scheme, 9), str(scheme), sort_key(knob), setting_label(flat))


def accountants_of(runs: Sequence[StoredRun]) -> list[str]:
    """Accountant names present in the summaries, in the order the specs list them."""
    names: list[str] = []
    for run in runs:
        for a in run.params.get("privacy", {}).get("accountants", []):
            if a not in names and f"{a}_epsilon_central" in run.summary:
                names.append(a)
    return names


def default_accountants(runs: Sequence[StoredRun]) -> list[str]:
    """``["exact"]`` when the runs carry exact's fields, else the first accountant present
    (``[]`` when none is); and ``digital`` after it when some run carries that accountant's
    fields (a digital run has no other for skellam, ddg and pbm, so a sweep that compares
    over the air with digital shows both systems' leakage)."""
    present = accountants_of(runs)
    ota = [a for a in present if a != "digital"]
    out = ["exact"] if "exact" in ota else ota[:1]
    return out + (["digital"] if "digital" in present else [])


def choose_accountants(runs: Sequence[StoredRun], names: str | Sequence[str] | None,
                       option: str = "--accountant") -> list[str]:
    """The accountants to show: ``names`` (``"exact,tight"``, a list, or ``"all"``) checked
    against the registry and against the runs; None: :func:`default_accountants`."""
    from otafl.privacy.accountants.registry import ACCOUNTANTS

    if names is None:
        return default_accountants(runs)
    items = [n.strip() for item in ([names] if isinstance(names, str) else names)
             for n in item.split(",") if n.strip()]
    present = accountants_of(runs)
    if items == ["all"]:
        return present
    out: list[str] = []
    for a in items:
        if a not in ACCOUNTANTS:
            raise OtaflInputError(f"{option} {a!r} is not an accountant; choices: {', '.join(ACCOUNTANTS)} (or all)")
        if a not in present:
            raise OtaflInputError(f"{option} {a!r}: no run in this results file carries its results; "
                                  f"present: {', '.join(present) or 'none'}")
        if a not in out:
            out.append(a)
    if not out:
        raise OtaflInputError(f"{option} names no accountant; choices: {', '.join(ACCOUNTANTS)} (or all)")
    return out


def validity_of(summaries: Sequence[dict], accountant: str) -> bool | None:
    """True when every ``{accountant}_classic_valid*`` flag of every summary is true, False
    when one is false, None when no summary carries such a flag."""
    prefix = f"{accountant}_classic_valid"
    flags = [bool(v) for s in summaries for k, v in s.items() if k.startswith(prefix) and v is not None]
    return all(flags) if flags else None


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
    leakage: dict[str, dict[str, float]]  # accountant -> LEAKAGE_KEYS suffix -> mean over seeds
    mean_participants: float
    valid: dict[str, bool | None] = field(default_factory=dict)  # accountant -> validity_of
    costs: dict[str, float] = field(default_factory=dict)  # COSTS column -> mean over seeds
    composition: dict[str, dict[str, str]] = field(default_factory=dict)  # acc -> central/local -> "rdp"
    flat: dict[str, Any] = field(default_factory=dict)  # the first run's flat spec


@dataclass
class TradeoffTable:
    rows: list[TableRow]
    group_keys: list[str]
    accountants: list[str]  # the accountants shown
    compositions: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # acc -> central/local -> methods
    rounds: list[int] = field(default_factory=list)  # distinct T over the runs
    available: list[str] = field(default_factory=list)  # every accountant present in the runs
    costs: list[str] = field(default_factory=list)  # COSTS columns some run reports
    units: dict[str, str] = field(default_factory=dict)  # acc -> privacy unit (otafl.privacy.units)


def _mean(values: Sequence[float]) -> float:
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else math.nan


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


#: Grouping keys shown first when they vary (the system compared), the rest alphabetically.
LEADING_KEYS = ("train.aggregation", "digital.mechanism")
#: Keys that only over-the-air runs use (blank in digital rows), beside the [digital] ones.
OTA_ONLY_KEYS = ("transmit.sigma2", "transmit.alignment", "transmit.threshold")


def applies(row_group: dict, key: str) -> bool:
    """Whether a grouping key means anything for a row: a [digital] key of an over-the-air
    run, or an over-the-air transmit key of a digital run, does not."""
    agg = row_group.get("train.aggregation")
    return not ((key.startswith("digital.") and agg not in (None, "digital"))
                or (key in OTA_ONLY_KEYS and agg == "digital"))


def varying_keys(runs: Sequence[StoredRun]) -> list[str]:
    """Spec keys whose value differs between runs, other than the seed and the sampling keys
    (which the scheme and setting columns show)."""
    flats = [flat_params(r.params, r.train) for r in runs]
    keys = sorted(set().union(*flats), key=lambda k: (k not in LEADING_KEYS, LEADING_KEYS.index(k)
                                                      if k in LEADING_KEYS else 0, k)) if flats else []
    return [k for k in keys
            if k != "train.seed" and not k.startswith("sampling.")
            and len({json.dumps(f.get(k), default=str) for f in flats}) > 1]


def fmt_value(v: Any) -> str:
    """A spec value for a label: ``[2, 10, 30]``, ``0.5``, ``true``."""
    if isinstance(v, tuple):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


@dataclass
class RunGroup:
    """Runs of one configuration (they differ only in the seed, or in keys left out of the grouping)."""

    scheme: str
    setting: str
    group: dict[str, Any]
    runs: list[StoredRun]
    sort_key: tuple

    def label_without(self, keys: Sequence[str] = ()) -> str:
        """``scheme, setting, key = value, ...`` leaving out ``keys`` (e.g. a facet's key)."""
        extra = ", ".join(f"{k.split('.')[-1]} = {fmt_value(v)}" for k, v in self.group.items() if k not in keys)
        return f"{self.scheme}, {self.setting}" + (f", {extra}" if extra else "")

    @property
    def label(self) -> str:
        return self.label_without()


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
                                    sort_key=(*_setting_sort(f), *(sort_key(f.get(k)) for k in keys)))
        groups[gkey].runs.append(run)
    return sorted(groups.values(), key=lambda g: g.sort_key), keys


def _joined(values: Sequence[Any]) -> str:
    return "/".join(sorted({str(v) for v in values if v is not None})) or "n/a"


def tradeoff_table(runs: Sequence[StoredRun], *, group_by: Sequence[str] | None = None,
                   accountants: str | Sequence[str] | None = None) -> TradeoffTable:
    """Group ``done`` runs by configuration and aggregate over seeds (see the module docstring).

    Parameters
    ----------
    runs : sequence of StoredRun
        ``done`` runs from :meth:`otafl.sweep.store.ResultStore.runs`.
    group_by : sequence of ``section.key``, optional
        See :func:`group_runs`.
    accountants : ``"exact,tight"``, a list of names, ``"all"`` or None
        The accountants shown (see :func:`choose_accountants`).

    Raises
    ------
    OtaflInputError
        No runs, a ``group_by`` key that no run has, or an accountant not in the registry
        or not in the runs.
    """
    groups, keys = group_runs(runs, group_by)
    chosen = choose_accountants(runs, accountants)
    costs = [c for c, key in COSTS.items() if any(not math.isnan(_num(r.summary.get(key))) for r in runs)]

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
            leakage={a: {m: _mean([_num(s.get(f"{a}_{m}")) for s in summaries]) for m in LEAKAGE_KEYS}
                     for a in chosen},
            mean_participants=_mean([_num(s.get("mean_participants")) for s in summaries]),
            valid={a: validity_of(summaries, a) for a in chosen},
            costs={c: _mean([_num(s.get(COSTS[c])) for s in summaries]) for c in costs},
            composition={a: {"central": _joined([s.get(f"{a}_composition") for s in summaries]),
                             "local": _joined([s.get(f"{a}_composition_local") for s in summaries])}
                         for a in chosen},
            flat=f0))
    compositions = {a: {side: sorted({str(r.summary.get(f"{a}_{key}")) for r in runs
                                      if r.summary.get(f"{a}_{key}") is not None})
                        for side, key in (("central", "composition"), ("local", "composition_local"))}
                    for a in chosen}
    rounds = sorted({int(r.summary["rounds"]) for r in runs if "rounds" in r.summary})
    return TradeoffTable(rows=rows, group_keys=keys, accountants=chosen, compositions=compositions,
                         rounds=rounds, available=accountants_of(runs), costs=costs, units=units_of(runs, chosen))


def units_of(runs: Sequence[StoredRun], accountants: Sequence[str]) -> dict[str, str]:
    """Each accountant's privacy unit over the runs (``{acc}_unit`` of their summaries; stores
    written before it: ``record`` for ``steps`` on local-steps runs, ``user`` otherwise). Runs that
    disagree (``steps`` on FedSGD and on FedAvg runs) give ``user/record``."""
    out = {}
    for a in accountants:
        seen = {s.get(f"{a}_unit") or unit_of(a, local_steps=s.get("algorithm", "fedsgd") != "fedsgd")
                for s in (r.summary for r in runs) if f"{a}_epsilon_central" in s}
        out[a] = "/".join(sorted(seen)) if seen else unit_of(a)
    return out
