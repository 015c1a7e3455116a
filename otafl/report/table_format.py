"""Writers of a :class:`~otafl.report.table.TradeoffTable`: plain text, Markdown, LaTeX, CSV.

Every format shows the same columns (:func:`resolve_columns`) and the
same facts:

- per-round vs total leakage in the header: ``exact ε_c per round`` (the worst round)
  and ``exact ε_c total (T = 80, rdp)`` (composed over the run; the composition named is
  the stored ``{acc}_composition`` / ``{acc}_composition_local``, several joined by ``/``);
- the validity flag of an accountant with a classic Gaussian step (``paper``): an ε cell
  of a row where the step left its validity range in some round of some seed carries
  ``!`` (LaTeX: a dagger) and a note under the table says what that means; CSV has the
  ``{acc}_classic_valid`` column (true / false, empty when the runs carry no flag);
- a legend under the table (``legend=False`` leaves it out); in LaTeX it is a footnote-size
  note inside the ``table`` float, under the tabular, next to a ``\\caption`` (given, or
  generated). The LaTeX needs ``\\usepackage{booktabs}`` and nothing else; numbers are in
  math mode with ``\\times 10^{k}`` exponents.
"""

from __future__ import annotations

import csv
import io
import math
import re
import textwrap
from typing import Any, Sequence

from otafl.errors import OtaflInputError
from otafl.privacy.units import UNIT_LABELS, units_note
from otafl.report.text import fmt_sig, render_table as text_table
from otafl.report.table import (COLUMNS, COSTS, CSV_DEFAULT_COLUMNS, DEFAULT_COLUMNS, FORMATS, PER_ACCOUNTANT, TableRow,
                                TradeoffTable, applies, fmt_value)

__all__ = ["latex_escape", "render_table", "resolve_columns", "tex_number"]

_LEFT = {"scheme", "setting", "composition", "valid"}  # left-aligned; grouping keys too
_SYM = {
    "md": {"eps_l": "ε_l", "eps_c": "ε_c", "delta_l": "δ_l", "delta_c": "δ_c", "pm": "±", "inf": "∞",
           "K": "|K_t|", "eps0": "ε_0 ≤ 1", "nan": "–"},
    "latex": {"eps_l": r"$\varepsilon_\mathrm{l}$", "eps_c": r"$\varepsilon_\mathrm{c}$",
              "delta_l": r"$\delta_\mathrm{l}$", "delta_c": r"$\delta_\mathrm{c}$", "pm": r"$\pm$",
              "inf": r"$\infty$", "K": r"$|K_t|$", "eps0": r"$\varepsilon_0 \le 1$",
              "nan": "--"},
}
_SYM["text"] = _SYM["md"]


def latex_escape(text: str) -> str:
    """Plain text -> LaTeX text mode (special characters escaped, the few Unicode symbols
    the tables use as math)."""
    out = []
    for ch in str(text):
        out.append({"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
                    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                    "→": r"$\to$", "ε": r"$\varepsilon$", "±": r"$\pm$", "∞": r"$\infty$", "|": r"$|$",
                    "δ": r"$\delta$", "≤": r"$\le$", "–": "--", "μ": r"$\mu$"}.get(ch, ch))
    return "".join(out)


def tex_number(x: float, digits: int = 3) -> str:
    """``0.5`` -> ``0.500``, ``1234.5`` -> ``1230``, ``2.35e7`` -> ``2.35 \\times 10^{7}``: the
    digits of :func:`~otafl.report.text.fmt_sig` (3 significant figures), the exponent in
    math; no dollars."""
    if math.isinf(x):
        return r"\infty" if x > 0 else r"-\infty"
    s = fmt_sig(x, digits)
    if "e" not in s:
        return s
    mant, exp = s.split("e")
    return rf"{mant} \times 10^{{{int(exp)}}}"


def resolve_columns(table: TradeoffTable, columns: str | Sequence[str] | None, fmt: str = "md") -> list[tuple]:
    """The table's columns in order: ``("row", name)`` and ``("acc", accountant, name)`` entries.

    ``columns``: names from :data:`COLUMNS` or a grouping key's own name, as a list or a
    comma-separated string; None: :data:`DEFAULT_COLUMNS` (:data:`CSV_DEFAULT_COLUMNS` for
    CSV). ``group`` expands to every grouping key. The per-accountant columns form one
    block per accountant (in the order chosen), placed where the first of them is listed.
    """
    if columns is None:
        compared = "train.aggregation" in table.group_keys  # OTA against digital: show what the uplink costs
        names = list(CSV_DEFAULT_COLUMNS if fmt == "csv" else DEFAULT_COLUMNS) + (list(table.costs) if compared else [])
    else:
        names = [c.strip() for item in ([columns] if isinstance(columns, str) else columns)
                 for c in item.split(",") if c.strip()]
        if not names:
            raise OtaflInputError("--columns names no column; choices: " + ", ".join(COLUMNS))
    expanded: list[str] = []
    for n in names:
        if n == "group":
            expanded += table.group_keys
        elif n in COLUMNS or n in table.group_keys:
            expanded.append(n)
        else:
            extra = f"; grouping keys: {', '.join(table.group_keys)}" if table.group_keys else ""
            raise OtaflInputError(f"--columns {n!r} is not a column; choices: {', '.join(COLUMNS)}{extra}")
    seen: list[str] = []
    for n in expanded:
        if n not in seen:
            seen.append(n)
    out: list[tuple] = []
    per_acc = [n for n in seen if n in PER_ACCOUNTANT]
    for n in seen:
        if n not in PER_ACCOUNTANT:
            out.append(("row", n))
        elif n == per_acc[0]:
            out += [("acc", a, m) for a in table.accountants for m in per_acc]
    return out


def _num(x: float, fmt: str, flag: bool = False) -> str:
    """A leakage number; ``flag``: append the validity mark (LaTeX: inside the math)."""
    if x is None or math.isnan(x):
        return {"csv": ""}.get(fmt, _SYM.get(fmt, _SYM["md"])["nan"])
    if fmt == "csv":
        return "inf" if x == math.inf else "-inf" if x == -math.inf else repr(float(x))
    if fmt == "latex":
        return f"${{{tex_number(x)}}}^{{\\dagger}}$" if flag else f"${tex_number(x)}$"
    return ("∞" if x == math.inf else fmt_sig(x)) + (" !" if flag else "")


def _setting_tex(row: TableRow) -> str:
    f = row.flat
    if row.scheme == "uniform" and row.p is not None:
        return f"$p = {row.p:g}$"
    if row.scheme == "channel-aware" and row.h_th is not None:
        return rf"$h_\mathrm{{th}} = {row.h_th:g}$"
    if row.scheme == "time-varying" and f:
        sched = f.get("sampling.schedule")
        if sched == "list":
            return "list $" + ", ".join(f"{v:g}" for v in f.get("sampling.values", ())) + "$"
        if sched == "constant":
            return f"constant ${f['sampling.p_start']:g}$"
        return f"{latex_escape(sched)} ${f['sampling.p_start']:g} \\to {f['sampling.p_end']:g}$"
    return latex_escape(row.setting)


def _value(v: Any, fmt: str) -> str:
    if fmt != "latex":
        return fmt_value(v)
    numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
    if numeric or (isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v)):
        return f"${fmt_value(v)}$"
    return latex_escape(fmt_value(v))


def _accuracy(row: TableRow, fmt: str) -> str:
    if math.isnan(row.accuracy_mean):
        return _SYM[fmt]["nan"]
    mean = f"{100 * row.accuracy_mean:.1f}"
    if math.isnan(row.accuracy_std):
        return f"${mean}$" if fmt == "latex" else mean
    std = f"{100 * row.accuracy_std:.1f}"
    return rf"${mean} \pm {std}$" if fmt == "latex" else f"{mean} ± {std}"


def _cell(table: TradeoffTable, row: TableRow, col: tuple, fmt: str) -> str:
    """One cell of ``row`` (md, text or latex)."""
    if col[0] == "row":
        name = col[1]
        if name == "scheme":
            return latex_escape(row.scheme) if fmt == "latex" else row.scheme
        if name == "setting":
            return _setting_tex(row) if fmt == "latex" else row.setting
        if name in ("p", "h_th"):
            v = getattr(row, name)
            return _SYM[fmt]["nan"] if v is None else _value(float(v), fmt)
        if name == "seeds":
            return str(len(row.seeds))
        if name == "accuracy":
            return _accuracy(row, fmt)
        if name == "participants":
            if math.isnan(row.mean_participants):
                return _SYM[fmt]["nan"]
            return f"${row.mean_participants:.1f}$" if fmt == "latex" else f"{row.mean_participants:.1f}"
        if name in COSTS:
            return _num(row.costs.get(name, math.nan), fmt)
        if not applies(row.group, name):  # e.g. digital.mechanism of an over-the-air run
            return _SYM[fmt]["nan"]
        return _value(row.group.get(name), fmt)  # a grouping key
    _, acc, name = col
    if name == "valid":
        v = row.valid.get(acc)
        return _SYM[fmt]["nan"] if v is None else ("yes" if v else "no")
    if name == "composition":
        c = row.composition.get(acc, {})
        return f"c: {c.get('central', 'n/a')}, l: {c.get('local', 'n/a')}"
    return _num(row.leakage[acc][PER_ACCOUNTANT[name]], fmt,
                flag=name.startswith("eps_") and row.valid.get(acc) is False)


def _rounds(table: TradeoffTable) -> str:
    return "/".join(str(t) for t in table.rounds) or "?"


def _header(table: TradeoffTable, col: tuple, fmt: str, with_acc: bool) -> str:
    """A column's header: ``exact ε_c total (T = 80, rdp)`` (LaTeX: the accountant is in the
    spanning row above)."""
    s = _SYM[fmt]
    tex = fmt == "latex"
    if col[0] == "row":
        name = col[1]
        fixed = {"scheme": "scheme", "setting": r"$p$ / $h_\mathrm{th}$" if tex else "p / h_th",
                 "p": "$p$" if tex else "p", "h_th": r"$h_\mathrm{th}$" if tex else "h_th", "seeds": "seeds",
                 "accuracy": r"accuracy (\%)" if tex else "accuracy (%)",
                 "participants": r"$\overline{|K_t|}$" if tex else "participants",
                 "channel_uses": "channel uses", "energy": "energy", "outages": "outages"}
        return fixed.get(name) or (rf"\texttt{{{latex_escape(name)}}}" if tex else name)
    _, acc, name = col
    side = "local" if "local" in name else "central"
    sym = {"eps": s["eps_l"] if side == "local" else s["eps_c"],
           "delta": s["delta_l"] if side == "local" else s["delta_c"]}
    T = f"$T = {_rounds(table)}$" if tex else f"T = {_rounds(table)}"
    comp = "/".join(table.compositions.get(acc, {}).get(side, []))
    T += f", {comp}" if comp else ""  # old results files may not name the composition
    text = {"composition": "composition", "valid": "valid"}.get(name)
    if text is None:
        kind = "eps" if name.startswith("eps_") else "delta"
        if tex:  # two lines (a nested tabular: plain LaTeX) keep the columns narrow
            second = "per round" if name.endswith("_round") else f"total\\\\({T})"
            return rf"\begin{{tabular}}[b]{{@{{}}c@{{}}}}{sym[kind]}\\{second}\end{{tabular}}"
        text = f"{sym[kind]} per round" if name.endswith("_round") else f"{sym[kind]} total ({T})"
    return f"{acc} {text}" if with_acc else text


def _seeds_phrase(table: TradeoffTable) -> str:
    n = sorted({len(r.seeds) for r in table.rows})
    if n == [1]:
        return "1 seed (no std)"
    return f"mean ± std over {n[0]} seeds" if len(n) == 1 else f"mean ± std over {n[0]}–{n[-1]} seeds"


def _flagged(table: TradeoffTable, cols: Sequence[tuple]) -> list[str]:
    shown = {c[1] for c in cols if c[0] == "acc" and c[2].startswith("eps_")}
    return [a for a in table.accountants if a in shown and any(r.valid.get(a) is False for r in table.rows)]


_LEGEND = (
    "Accuracy: final test accuracy in %, @seeds@. Leakage (@accs@): @eps_l@ local (LDP) of the worst user, "
    "@eps_c@ central; per round = the worst single round; total = composed over the @T@ rounds by the method "
    "named in the header (pld: privacy-loss distributions; otherwise the tightest of basic, advanced and RDP, "
    "per run). Means over seeds; "
    "@inf@: the bound is undefined in some round.")
_LEGEND_PARTICIPANTS = "Participants: mean @K@ per round."
_LEGEND_FLAG = ("@flagnote@: @acc@'s classic Gaussian step is outside its validity range (@eps0@, no LDP "
                "amplification by sampling) in some round of some seed: the value is not a guaranteed bound "
                "and may understate the leakage.")
_LEGEND_SUMDOM = ("@flagnote@: steps-sumdom is the source's sum-domination of the local steps, not a guaranteed bound "
                  "(another user's later steps can cancel its own earlier noise); steps is the sound value.")


def _legend(table: TradeoffTable, cols: Sequence[tuple], fmt: str) -> str:
    """The note under the table; LaTeX: the text escaped, the symbols in math mode."""
    tex = fmt == "latex"
    esc = latex_escape if tex else (lambda t: t)
    plural = "s" if len(table.accountants) != 1 else ""
    values = dict(_SYM["latex" if tex else "md"], seeds=esc(_seeds_phrase(table)),
                  accs=esc(f"accountant{plural}: {', '.join(table.accountants) or 'none'}"),
                  T=f"$T = {_rounds(table)}$" if tex else f"T = {_rounds(table)}",
                  flagnote=r"$\dagger$" if tex else "!")
    phrase = _delta_phrase(table)
    parts = [_LEGEND] + ([phrase[0].upper() + phrase[1:] + "."] if phrase else [])
    if table.units:
        note = units_note({a: u for a, u in table.units.items() if a in table.accountants} or table.units)
        parts.append(note[0].upper() + note[1:] + ".")
    if any(c[0] == "row" and c[1] == "participants" for c in cols):
        parts.append(_LEGEND_PARTICIPANTS)
    parts += [_LEGEND_SUMDOM if a == "steps-sumdom" else _LEGEND_FLAG.replace("@acc@", a)
              for a in _flagged(table, cols)]
    return re.sub(r"@([A-Za-z0-9_\\]+)@", lambda m: values[m.group(1).replace("\\", "")], esc(" ".join(parts)))


def _delta_phrase(table: TradeoffTable) -> str:
    """The totals' delta: one value for every row and accountant (one delta_total), or a
    pointer to the delta columns where runs differ."""
    ds = {float(r.leakage[a][k]) for r in table.rows for a in r.leakage
          for k in ("delta_central_total", "delta_local_total")
          if k in r.leakage[a] and r.leakage[a][k] == r.leakage[a][k] and r.leakage[a][k] > 0}
    if not ds:
        return ""
    if len(ds) == 1:
        return f"every total at delta = {ds.pop():.3g}"
    return (f"totals at deltas {min(ds):.3g} to {max(ds):.3g} (runs of different privacy.delta_total or older "
            "stores; --columns delta_central_total shows each)")


def _default_caption(table: TradeoffTable) -> str:
    n = sorted({len(r.seeds) for r in table.rows})
    seeds = ("one seed" if n == [1] else f"mean over {n[0]} seeds" if len(n) == 1
             else f"mean over {n[0]}--{n[-1]} seeds")
    accs = ", ".join(latex_escape(a) for a in table.accountants) or "no"
    plural = "s" if len(table.accountants) != 1 else ""
    delta = latex_escape(_delta_phrase(table)).replace("deltas", r"$\delta$").replace("delta =", r"$\delta$ =")
    units = sorted(set("/".join(sorted(table.units.values())).split("/"))) if table.units else []
    unit = f", {' and '.join(UNIT_LABELS.get(u, u) for u in units)}" + (" (mixed units)" if len(units) > 1 else "") \
        if units else ""
    return (f"Test accuracy and privacy leakage per sampling configuration ({accs} accountant{plural}{unit}, "
            f"$T = {_rounds(table)}$ rounds, {seeds}{', ' + delta if delta else ''}).")


def _csv(table: TradeoffTable, cols: Sequence[tuple]) -> str:
    header: list[str] = []
    for c in cols:
        if c[0] == "row":
            header += {"accuracy": ["accuracy_mean", "accuracy_std"], "participants": ["mean_participants"],
                       **{k: [v] for k, v in COSTS.items()}}.get(c[1], [c[1]])
        else:
            header += {"composition": [f"{c[1]}_composition", f"{c[1]}_composition_local"],
                       "valid": [f"{c[1]}_classic_valid"]}.get(c[2], [f"{c[1]}_{PER_ACCOUNTANT.get(c[2])}"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in table.rows:
        line: list[Any] = []
        for c in cols:
            if c[0] == "row":
                n = c[1]
                if n in ("scheme", "setting"):
                    line.append(getattr(r, n))
                elif n in ("p", "h_th"):
                    line.append("" if getattr(r, n) is None else getattr(r, n))
                elif n == "seeds":
                    line.append(len(r.seeds))
                elif n == "accuracy":
                    line += [_num(r.accuracy_mean, "csv"), _num(r.accuracy_std, "csv")]
                elif n == "participants":
                    line.append(_num(r.mean_participants, "csv"))
                elif n in COSTS:
                    line.append(_num(r.costs.get(n, math.nan), "csv"))
                else:
                    line.append(fmt_value(r.group.get(n)))
            elif c[2] == "composition":
                line += [r.composition[c[1]]["central"], r.composition[c[1]]["local"]]
            elif c[2] == "valid":
                v = r.valid.get(c[1])
                line.append("" if v is None else ("true" if v else "false"))
            else:
                line.append(_num(r.leakage[c[1]][PER_ACCOUNTANT[c[2]]], "csv"))
        w.writerow(line)
    return buf.getvalue()


def _latex(table: TradeoffTable, cols: Sequence[tuple], legend: bool, caption: str | None,
           label: str | None) -> str:
    accs = [a for a in table.accountants if any(c[0] == "acc" and c[1] == a for c in cols)]
    align = "".join("l" if (c[0] == "row" and (c[1] in _LEFT or c[1] in table.group_keys))
                    or (c[0] == "acc" and c[2] in _LEFT) else "r" for c in cols)
    lines = [r"% otafl table: needs \usepackage{booktabs}; too wide? use table* or fewer --columns",
             r"\begin{table}[htbp]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
             rf"\caption{{{caption if caption is not None else _default_caption(table)}}}"]
    if label:
        lines.append(rf"\label{{{label}}}")
    lines += [rf"\begin{{tabular}}{{{align}}}", r"\toprule"]
    if accs:  # a spanning row naming each accountant's block
        top, rules, i = [], [], 0
        while i < len(cols):
            c = cols[i]
            if c[0] != "acc":
                top.append("")
                i += 1
                continue
            j = i
            while j < len(cols) and cols[j][0] == "acc" and cols[j][1] == c[1]:
                j += 1
            top.append(rf"\multicolumn{{{j - i}}}{{c}}{{{latex_escape(c[1])}}}")
            rules.append(rf"\cmidrule(lr){{{i + 1}-{j}}}")
            i = j
        lines += [" & ".join(top) + r" \\", "".join(rules)]
    lines += [" & ".join(_header(table, c, "latex", False) for c in cols) + r" \\", r"\midrule"]
    lines += [" & ".join(_cell(table, r, c, "latex") for c in cols) + r" \\" for r in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if legend:
        lines += [r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize",
                  _legend(table, cols, "latex"), r"\end{minipage}"]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def render_table(table: TradeoffTable, fmt: str = "md", *, columns: str | Sequence[str] | None = None,
                 legend: bool = True, caption: str | None = None, label: str | None = None) -> str:
    """Render as ``md`` (GitHub pipe table), ``text`` (aligned columns), ``latex`` (a
    ``table`` float with a booktabs tabular, caption and note) or ``csv`` (numbers).

    ``columns``: see :func:`resolve_columns`. ``caption``: LaTeX text
    of the ``\\caption`` (default: generated; in md / text a given caption is the first
    line). ``label``: a ``\\label`` for LaTeX.
    """
    if fmt not in FORMATS:
        raise OtaflInputError(f"table format {fmt!r} is not one of: {', '.join(FORMATS)}")
    cols = resolve_columns(table, columns, fmt)
    if fmt == "csv":
        return _csv(table, cols)
    if fmt == "latex":
        return _latex(table, cols, legend, caption, label)
    header = [_header(table, c, fmt, True) for c in cols]
    cells = [[_cell(table, r, c, fmt) for c in cols] for r in table.rows]
    left = [(c[0] == "row" and (c[1] in _LEFT or c[1] in table.group_keys)) or (c[0] == "acc" and c[2] in _LEFT)
            for c in cols]
    top = [caption, ""] if caption else []
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if lf else "--:" for lf in left) + "|"]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        body = "\n".join(top + lines) + "\n"
        return body + ("\n" + _legend(table, cols, fmt) + "\n" if legend else "")
    body = "\n".join(top) + ("\n" if top else "") + text_table(header, cells, left=left, rule=True)
    return body + ("\n" + textwrap.fill(_legend(table, cols, fmt), 100) + "\n" if legend else "")



def store_table(results, fmt: str = "md", *, accountants=None, columns=None, group_by=None, legend: bool = True,
                caption: str | None = None, label: str | None = None) -> tuple[str, int]:
    """The trade-off table of the finished runs in the store ``results`` (a path), rendered
    by :func:`render_table`; returns the text and its number of rows."""
    from otafl.report.table import tradeoff_table
    from otafl.sweep.store import read_store

    with read_store(results) as store:
        tab = tradeoff_table(store.runs("done"), group_by=group_by, accountants=accountants)
    return render_table(tab, fmt, columns=columns, legend=legend, caption=caption, label=label), len(tab.rows)
