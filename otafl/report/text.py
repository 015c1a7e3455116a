"""Plain-text output of the bound-style commands: one number format, one table layout.

:func:`fmt_number` formats every cell (computed numbers to 3 significant figures by
:func:`fmt_sig`, trailing zeros kept), :func:`render_table` lines the cells up (right-aligned columns, two spaces apart). The command layouts on top --
:func:`bound_text`, :func:`audit_text`, :func:`scaling_text`, :func:`accountants_text` --
take the dicts of :mod:`otafl.api`. :func:`json_text` and :func:`csv_text` are the
``--format json`` and ``--format csv`` writers: JSON writes non-finite numbers as the
strings ``"inf"``, ``"-inf"`` and ``"nan"`` (:func:`otafl.results.jsonable`, the run
store's convention), CSV as ``inf``, ``-inf`` and ``nan``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Sequence

from otafl.privacy.accountants.result import FLAGGED_REASON, FLAGGED_REASONS, ZERO_REASON, delta_too_large
from otafl.privacy.units import UNIT_LABELS, UNITS, units_note

from otafl.results import jsonable

__all__ = ["fmt_sig", "fmt_number", "render_table", "json_text", "csv_text", "bound_text", "audit_text", "scaling_text",
           "accountants_text", "calibration_text", "run_text"]


def fmt_sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, the same way in every table: trailing zeros
    kept (``0.800``, ``13.0``, ``6.25``), plain digits from 1e-4 up to 1e6 (``1170``, not
    ``1.17e+03``), scientific outside (``1.00e-05``, ``2.35e+07``); ``0``, ``inf``, ``-inf``
    and ``nan`` as such."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    exp = math.floor(math.log10(abs(float(f"{x:.{digits - 1}e}"))))  # after rounding: 999.6 -> 1e3
    if exp < -4 or exp >= 6:
        return f"{x:.{digits - 1}e}"
    if exp >= digits - 1:  # an integer once rounded: 1171.3 -> 1170
        return f"{round(x, digits - 1 - exp):.0f}"
    return f"{x:.{digits - 1 - exp}f}"


def fmt_number(value: Any) -> str:
    """A table cell: floats to 3 significant figures by :func:`fmt_sig` (``inf``, ``-inf``,
    ``nan`` as such), booleans as yes / no, None as ``-``, anything else (ints, strings) as
    ``str``. Inputs a user typed (p, sigma2, ...) go in as ``f"{v:g}"`` strings, unrounded."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return fmt_sig(value)
    return str(value)


def render_table(header: Sequence[str], rows: Sequence[Sequence[Any]], *, left: Sequence[bool] | None = None,
                 rule: bool = False) -> str:
    """Columns two spaces apart, the header first (then a dashed rule if ``rule``); every
    cell through :func:`fmt_number` (strings pass unchanged). Columns are right-aligned
    unless ``left`` marks them. Trailing spaces are stripped; ends with a newline."""
    lines = [list(header)] + [[fmt_number(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    left = left or [False] * len(header)

    def fmt_line(cells):
        return "  ".join(c.ljust(w) if lf else c.rjust(w) for c, w, lf in zip(cells, widths, left)).rstrip()

    dashes = ["  ".join("-" * w for w in widths)] if rule else []
    out = [fmt_line(lines[0])] + dashes + [fmt_line(line) for line in lines[1:]]
    return "\n".join(out) + "\n"


def _given(v: Any) -> Any:
    """An input as the user gave it (``0.05``, not ``0.0500``): floats by ``g``."""
    return f"{v:g}" if isinstance(v, float) else v


def json_text(result: dict) -> str:
    """``result`` as indented strict JSON (non-finite numbers as strings, no NaN/Infinity)."""
    return json.dumps(jsonable(result), indent=1, allow_nan=False)


def csv_text(rows: list[dict]) -> str:
    """One CSV line per row dict (header from the first row); empty text for no rows."""
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)  # floats via repr: inf, -inf, nan
    return buf.getvalue()


# --------------------------------------------------------------------------- command layouts

_SUMDOM = ("! steps-sumdom is the source's sum-domination, NOT a guaranteed bound: with S > 1 local steps and "
           "several participants another user's later steps can cancel its own earlier noise "
           "(docs/privacy/steps.md#steps); steps is the sound value")

_PAPER_CLASSIC = ("! paper's classic Gaussian step is outside its validity range (eps_0 > 1): the classic "
                  "formula can understate the leakage there; compare with tight")
_PAPER_LOCAL = ("? paper's local epsilon is not a guaranteed bound: it is amplified by sampling with p < 1 "
                "(the server can tell from the received energy who transmitted) or its classic step has "
                "eps_0 > 1; tight's local epsilon is not amplified and holds")


def _undefined_only(reason: str) -> str:
    """A row's reason without the parts that explain a 0 or a flag (the legend says those apart)."""
    extra = {ZERO_REASON, FLAGGED_REASON, *FLAGGED_REASONS.values()}
    return "; ".join(part for part in reason.split("; ") if part not in extra)


def bound_text(result: dict) -> str:
    """:func:`otafl.api.bound.bound_grid` as a table: one line per grid point, the
    accountants' epsilons side by side, then a legend of the marks and undefined points."""
    rows, meta = result["rows"], result["meta"]
    names = meta["accountants"]
    with_totals = meta["rounds"] is not None
    keys = ("users", "p", "sigma2", "clip", "snr_db")
    grid: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        grid.setdefault(tuple(row[k] for k in keys), {})[row["accountant"]] = row
    header = ["users", "p", "sigma2", "clip"] + ([] if meta["channel"] else ["snr_db"]) + ["mu"]
    for name in names:
        header += [f"{name}:eps_local", f"{name}:eps_central", f"{name}:delta_central"]
        header += [f"{name}:eps_central_total", f"{name}:delta_total"] if with_totals else []
    lines, notes, totals_why, zero = [], set(), set(), False
    max_delta = meta.get("max_delta")
    for point, by_acc in grid.items():
        line = [_given(v) for v in point[:4] + (() if meta["channel"] else (point[4],))]
        line.append(by_acc[names[0]]["mean_participants"])
        for name in names:
            row = by_acc[name]
            mark = mark_l = ""
            if name == "paper" and row["defined"] and not row["classic_valid"]:
                mark = "!"
            if name == "steps-sumdom" and row["defined"]:
                mark = "!"
                notes.add("sumdom")
            if name == "paper" and row["epsilon_local"] > 0 and not row["classic_valid_local"]:
                mark_l = "?"
            big = delta_too_large(row["delta_central"], row["users"], max_delta)
            big_total = with_totals and delta_too_large(row.get("delta_central_total"), row["users"], max_delta)
            notes |= ({mark, mark_l} | ({"#"} if big or big_total else set())) - {""}
            if with_totals and row.get("total_reason"):
                totals_why.add(row["total_reason"])
            if not row["defined"]:
                notes.add(_undefined_only(row["reason"]))
            if 0.0 in (row["epsilon_central"], row["epsilon_local"]):
                zero = True
            line += [fmt_number(row["epsilon_local"]) + mark_l, fmt_number(row["epsilon_central"]) + mark,
                     fmt_number(row["delta_central"]) + ("#" if big else "")]
            if with_totals:  # the same marks on the total as on the rounds it composes
                line += [fmt_number(row["epsilon_central_total"]) + mark,
                         fmt_number(row["delta_central_total"]) + ("#" if big_total else "")]
        lines.append(line)
    paper_marked = any(by_acc.get("paper", {}).get("defined") and not by_acc["paper"]["classic_valid"]
                       for by_acc in grid.values())
    legend = ([_PAPER_CLASSIC] if paper_marked else []) + ([_PAPER_LOCAL] if "?" in notes else [])
    legend += [_SUMDOM] if "sumdom" in notes else []
    if "#" in notes:
        limit = "1/K" if max_delta is None else f"--max-delta {max_delta:.3g}"
        legend.append(f"# delta above {limit}: at that delta the guarantee allows disclosing a user's data "
                      "outright; the epsilon beside it means little (lower --delta-prime, raise p or K)")
    legend += [f"inf: {r}" for r in sorted(n for n in notes if n not in ("!", "?", "#", "sumdom"))]
    legend += [ZERO_REASON] if zero else []
    legend += [f"totals: {r}" for r in sorted(totals_why)]
    if with_totals:
        legend.append(f"totals at delta_total = {meta.get('delta_total')} (eps_central_total, delta_total)")
    if meta.get("units"):
        legend.append(units_note(meta["units"]))
    return render_table(header, lines) + "".join(f"{line}\n" for line in legend)


AUDIT_COLUMNS = ("users", "p", "sigma2", "clip", "snr_db", "scope", "rounds", "accountant", "epsilon", "delta",
                 "audit_delta", "audit_lower", "audit_upper", "verdict")


_AUDIT_GIVEN = {"users", "p", "sigma2", "clip", "snr_db"}


def audit_text(result: dict) -> str:
    """:func:`otafl.api.audit.audit_grid` as a table (one line per row) and a footer line."""
    rows, big = [], False
    for r in result["rows"]:
        cells = [_given(r[c]) if c in _AUDIT_GIVEN else r[c] for c in AUDIT_COLUMNS]
        if delta_too_large(r["delta"], r["users"]):  # the same flag as bound's, per round and total
            cells[AUDIT_COLUMNS.index("delta")] = fmt_number(r["delta"]) + "#"
            big = True
        rows.append(cells)
    text = render_table(AUDIT_COLUMNS, rows)
    whys = dict.fromkeys(f"{r['accountant']} {'inf' if r['epsilon'] == math.inf else '0'}: {r['reason']}"
                         for r in result["rows"] if r.get("reason"))
    text += "".join(f"{w}\n" for w in whys)
    m = result["meta"]
    totals = f"; totals at delta_total = {m['delta_total']:g}" if m.get("rounds") and m.get("delta_total") else ""
    return text + ("# delta above 1/K: the guarantee allows disclosing a user's data outright\n" if big else "") + (
        f"audit: {m['samples']} draws, seed {m['seed']}, {m['adversary']} adversary, "
        f"{100 * m['confidence']:g}% {m['interval']}{totals}\n"
        f"privacy unit: {UNITS['user']}\n")


def scaling_text(result: dict) -> str:
    """:func:`otafl.api.scaling.scaling_grid` as a title line and a table of the fitted
    slopes beside the theory (one line per accountant and scheme), then the figure."""
    m = result["meta"]
    users = sorted({r["users"] for r in result["rows"]})
    title = (f"central leakage vs K = {users[0]} ... {users[-1]} ({len(users)} points), "
             f"sigma2 = {m['sigma2']:g}, L = {m['clip']:g}, delta_l = {m['delta_l']:g}, "
             f"delta' = {m['delta_prime']}; user level\n")
    labels = {"fixed_p": f"fixed p = {m['p']:g}", "sqrt_p": f"p = {m['a']:g} K^-1/2"}
    lines = [[name, labels[scheme], fit["slope"], m["theory"][scheme], fit["points"]]
             for name in m["accountants"] for scheme, fit in m["slopes"][name].items()]
    text = title + render_table(["accountant", "scheme", "fitted_slope", "theory_slope", "finite_points"], lines)
    return text + (f"figure -> {m['figure']}\n" if m.get("figure") else "")


def accountants_text(curves: dict, figure: str | None = None) -> str:
    """:func:`otafl.api.curves.accountant_curves` as a table: p and each accountant's
    per-round central (epsilon, delta), a delta above 1/K marked ``#`` as in ``bound``;
    then the figure written, if any."""
    names = [n for n in ("paper", "tight", "exact") if n in curves]
    lines, big = [], False
    for i, p in enumerate(curves["p"]):
        line = [_given(p)]
        for n in names:
            d = curves[n]["delta"][i]
            flag = delta_too_large(d, curves["users"])
            big |= flag
            line += [curves[n]["epsilon"][i], fmt_number(d) + ("#" if flag else "")]
        lines.append(line)
    header = ["p"] + [f"{n}:{c}" for n in names for c in ("eps_central", "delta_central")]
    text = render_table(header, lines)
    text += (f"# delta above 1/K = {fmt_sig(1 / curves['users'])}: at that delta the guarantee allows disclosing "
             "a user's data outright; the epsilon beside it means little\n") if big else ""
    text += f"privacy unit: {UNITS['user']}\n"
    return text + (f"figure -> {figure}\n" if figure else "")


def calibration_text(result, *, grid_points: int, tol: float) -> str:
    """The human report of :func:`otafl.api.calibrate.calibrate`: the search, every
    solution interval, the chosen value and its per-round and total (epsilon, delta)."""
    from otafl.api.calibrate import KNOBS

    def g(v) -> str:
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    k, spec = KNOBS[result.knob], result.spec
    lo, hi = result.value_range
    over = "" if result.knob == "train.rounds" else f" over {spec.train.rounds} rounds"
    at = "the run's own total delta" if result.target_delta is None else f"total delta {result.target_delta:g}"
    lines = [f"{result.knob} for {result.accountant} {result.scope} epsilon_total <= {result.target_epsilon:g}"
             f"{over} at {at} (seed {spec.train.seed}; {UNIT_LABELS.get(result.unit, result.unit)})",
             f"searched [{g(lo)}, {g(hi)}] ({'log' if k.log else 'linear'} grid of {grid_points}, "
             f"bisection to tol {tol:g}): {result.evaluations} bounds-only runs",
             "meets the target on " + ", ".join(f"[{g(a)}, {g(b)}]" for a, b in result.intervals),
             f"chosen {result.knob} = {g(result.value)}  ({k.why})"]
    if result.value == (lo if k.prefer == "min" else hi):
        lines.append("  (the end of the searched range: widen --range to look further)")
    lines += [f"{'':10}{'per round':>12}{'total':>12}",
              f"{'epsilon':10}{fmt_sig(result.epsilon_round):>12}{fmt_sig(result.epsilon_total):>12}",
              f"{'delta':10}{fmt_sig(result.delta_round):>12}{fmt_sig(result.delta):>12}"]
    return "\n".join(lines) + "\n"


def run_text(summary: dict, accountants, out_dir) -> str:
    """``otafl run``'s report: accuracy, participants, wall time, and per accountant the
    worst round's local and central epsilon and the local and central totals, each at its
    delta (with the totals' composition), flagged where ``paper``'s classic step is outside
    its validity range."""
    s = summary
    lines = [f"final test accuracy {s['final_test_accuracy']:.4f} after {s['rounds']} rounds; "
             f"mean participants {s['mean_participants']:.1f} of {s['users']}; {s['wall_seconds']:.1f} s -> {out_dir}"]
    if s.get("channel_uses_per_round") == s.get("channel_uses_per_round") is not None:  # reported, not NaN
        lines.append(f"  uplink: {fmt_sig(s['channel_uses_per_round'])} channel uses and "
                     f"{fmt_sig(s['energy_per_round'])} energy per round, {fmt_sig(s['outages_per_round'])} "
                     "outages per round")
    if s.get("power_control_note"):  # docs/model.md#power-control
        lines.append(f"  power control: {s['power_control_note']}")
    users = s.get("users")
    for name in list(accountants) + [a for a in ("steps", "steps-sumdom", "digital") if a not in accountants]:
        if f"{name}_epsilon_central" in s:
            d_round, d_total = s.get(f"{name}_delta_central", math.nan), s.get(f"{name}_delta_central_total", math.nan)
            big = [w for w, d in (("per-round", d_round), ("total", d_total)) if delta_too_large(d, users)]
            comp, comp_local = s.get(f"{name}_composition", ""), s.get(f"{name}_composition_local")
            lines.append(f"  {name}: per-round eps_local max {fmt_sig(s[f'{name}_epsilon_local_max'])} at delta "
                         f"{fmt_sig(s.get(f'{name}_delta_local', math.nan))}, "
                         f"eps_central {fmt_sig(s[f'{name}_epsilon_central'])} at delta {fmt_sig(d_round)}; over "
                         f"the run eps_local {fmt_sig(s.get(f'{name}_epsilon_local_total', math.nan))} at delta "
                         f"{fmt_sig(s.get(f'{name}_delta_local_total', math.nan))}, "
                         f"eps_central {fmt_sig(s[f'{name}_epsilon_central_total'])} at delta "
                         f"{fmt_sig(d_total)} "
                         f"({comp}" + (f"; local {comp_local}" if comp_local not in (None, comp) else "")
                         + f"; {UNIT_LABELS.get(s.get(f'{name}_unit'), 'user level')})"
                         + ("" if s.get(f"{name}_classic_valid", True) else
                            "  [flagged: sum-domination over local steps; not a guaranteed bound]"
                            if name == "steps-sumdom" else
                            "  [flagged: classic step with eps_0 > 1 or LDP amplified by p < 1; "
                            "not a guaranteed bound]")
                         + (f"  [flagged: {' and '.join(big)} delta above 1/K = {1 / users:.3g}]" if big else ""))
            for why in dict.fromkeys(s.get(f"{name}_{key}") for key in ("reason", "total_reason")):
                if why:
                    lines.append(f"    {why}")
    if s.get("privacy_note"):
        lines.append(f"  note: {s['privacy_note']}")
    return "\n".join(lines) + "\n"
