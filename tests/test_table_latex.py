"""`otafl table --format latex`: a pure-Python syntax check that always runs, and a pdflatex
compile of the table in a minimal document (skipped only where pdflatex is not installed;
Debian/Ubuntu: apt-get install texlive-latex-base texlive-latex-recommended)."""

import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from fakestore import default_summary, fake_store

from otafl.cli.main import cli
from otafl.report.table_format import tex_number

DOCUMENT = "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n%s\n\\end{document}\n"


def _strip_comments(text: str) -> tuple[str, list[str]]:
    """Comment lines removed; a '%' that is not escaped and not at a line's start is a problem
    (it would silently swallow the rest of the line)."""
    out, problems = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("%"):
            continue
        if re.search(r"(?<!\\)%", line):
            problems.append(f"line {n}: bare % inside content")
        out.append(line)
    return "\n".join(out), problems


def _tabular_columns(spec: str) -> int:
    return len(re.findall(r"[lcr]", re.sub(r"@\{[^{}]*\}", "", spec)))


def latex_problems(text: str) -> list[str]:
    """Syntax problems of a LaTeX fragment: non-ASCII characters, unbalanced braces, unmatched
    \\begin/\\end, unbalanced or display math, bare _ ^ outside math, & outside a tabular, bare
    # or %, double superscripts, and rows whose cell count differs from the tabular's columns."""
    problems = [f"non-ASCII character {ch!r}" for ch in sorted(set(text)) if ord(ch) > 127]
    body, more = _strip_comments(text)
    problems += more
    depth, envs, math = 0, [], False
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            m = re.match(r"\\(begin|end|label|ref)\{([^{}]*)\}", body[i:])
            if m and m.group(1) in ("label", "ref"):  # keys may hold _ and :
                i += m.end()
                continue
            if m:
                if m.group(1) == "begin":
                    envs.append(m.group(2))
                elif not envs or envs.pop() != m.group(2):
                    problems.append(f"\\end{{{m.group(2)}}} does not match the open environment")
                i += m.end()
                continue
            if i + 1 < len(body) and not body[i + 1].isalpha():
                i += 2  # an escaped character: \_ \% \\ ...
            else:
                i += len(re.match(r"\\[A-Za-z]*", body[i:]).group())
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                problems.append("a } closes nothing")
                depth = 0
        elif ch == "$":
            if body[i:i + 2] == "$$":
                problems.append("$$ (display math or two math groups run together)")
            math = not math
        elif ch in "_^" and not math:
            problems.append(f"bare {ch} outside math near {body[max(0, i - 20):i + 20]!r}")
        elif ch == "&" and "tabular" not in envs:
            problems.append("& outside a tabular")
        elif ch == "#":
            problems.append("bare #")
        elif ch == "\n" and math:
            problems.append(f"math left open at the end of a line near {body[max(0, i - 30):i]!r}")
            math = False
        i += 1
    if depth:
        problems.append(f"{depth} unclosed brace(s)")
    if math:
        problems.append("math left open at the end")
    problems += [f"\\begin{{{e}}} never ends" for e in envs]
    for seg in re.findall(r"(?<!\\)\$(.*?)(?<!\\)\$", body):
        if re.search(r"\^(\{[^{}]*\}|\\?\w+)\s*\^", seg):
            problems.append(f"double superscript in ${seg}$")
    outer = r"\\begin\{tabular\}\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}(.*?)\\end\{tabular\}(?=[ \t]*(?:\n|$))"
    for spec, content in re.findall(outer, body, flags=re.S):
        ncols = _tabular_columns(spec)
        flat = re.sub(r"\\begin\{tabular\}\[b\].*?\\end\{tabular\}", "X", content, flags=re.S)
        for row in flat.split("\\\\"):
            row = re.sub(r"\\(toprule|midrule|bottomrule)|\\cmidrule\(lr\)\{[^{}]*\}", "", row).strip()
            if not row:
                continue
            spans = sum(int(n) - 1 for n in re.findall(r"\\multicolumn\{(\d+)\}", row))
            if row.count("&") + 1 + spans != ncols:
                problems.append(f"row has {row.count('&') + 1 + spans} cells, tabular has {ncols}: {row[:60]!r}")
    return problems


@pytest.mark.parametrize("bad, needle", [
    ("a_b", "bare _"), ("x & y", "& outside"), (r"\begin{table}{x", "never ends"), ("{a}}", "closes nothing"),
    ("$1$$^{2}$", "$$"), (r"$10^{3}^{\dagger}$", "double superscript"), ("50% done", "bare %"),
    ("ε", "non-ASCII"), ("$x", "math left open"),
    ("\\begin{tabular}{ll}\na & b & c \\\\\n\\end{tabular}\n", "3 cells, tabular has 2"),
])
def test_the_syntax_check_catches_each_kind_of_mistake(bad, needle):
    assert any(needle in p for p in latex_problems(bad)), latex_problems(bad)


def _summary(spec, accs):
    out = default_summary(spec, accs)
    if spec.sampling.scheme == "uniform" and spec.sampling.p < 0.5:
        out["paper_epsilon_central"] = 1.2345e6  # a number in exponent notation
        out["tight_epsilon_central_total"] = float("inf")
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("latex")
    snrs = [[2.0, 10.0, 30.0], [10.0, 20.0, 40.0]]
    return fake_store(tmp / "r.sqlite", {"sampling.p": [0.2, 0.8], "channel.snr_db": snrs},
                      points=[{"sampling.scheme": "channel-aware", "sampling.h_th": 2.0},
                              {"sampling.scheme": "time-varying", "sampling.schedule": "linear",
                               "sampling.p_start": 0.9, "sampling.p_end": 0.3}],
                      seeds=(0, 1), accountants=("paper", "tight", "exact"), summary=_summary)


VARIANTS = {
    "default": [],
    "all": ["--accountant", "all", "--columns", "scheme,setting,p,h_th,group,seeds,accuracy,eps_local_round,"
            "eps_local_total,eps_central_round,eps_central_total,delta_local_total,delta_central_total,composition,"
            "valid,participants", "--label", "tab:trade_off"],
    "paper": ["--accountant", "paper,tight", "--caption", r"Trade-off, $T = 5$ (\%)."],
    "bare": ["--accountant", "tight", "--no-legend", "--columns", "setting,eps_central_total"],
}


def latex(results, args):
    res = CliRunner().invoke(cli, ["table", results, "--format", "latex", *args])
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_latex_passes_the_syntax_check(results, variant):
    assert latex_problems(latex(results, VARIANTS[variant])) == []


def test_latex_layout_math_caption_and_note(results):
    text = latex(results, VARIANTS["all"])
    assert text.index(r"\begin{table}") < text.index(r"\caption{") < text.index(r"\begin{tabular}")
    assert r"\label{tab:trade_off}" in text and r"\toprule" in text and r"\bottomrule" in text
    assert r"\multicolumn{8}{c}{paper}" in text  # 4 eps + 2 delta + composition + valid, per accountant
    assert r"$p = 0.2$" in text and r"$h_\mathrm{th} = 2$" in text and r"linear $0.9 \to 0.3$" in text
    assert r"{1.23 \times 10^{6}}^{\dagger}" in text and "e+06" not in text and r"$\infty$" in text
    assert r"$81.0 \pm 1.4$" in text and r"$[2, 10, 30]$" in text
    assert r"total\\($T = 5$, rdp)" in text and r"\\per round" in text
    note = text.split("\\bottomrule\n\\end{tabular}")[1]
    assert r"\footnotesize" in note and r"$\dagger$: paper's" in note and note.rstrip().endswith(r"\end{table}")
    assert "Test accuracy and privacy leakage" in text.split(r"\caption{")[1].split("\n")[0]
    assert r"\caption{Trade-off, $T = 5$ (\%).}" in latex(results, VARIANTS["paper"])
    assert r"\footnotesize" not in latex(results, VARIANTS["bare"])


def test_tex_number_writes_powers_of_ten():
    assert tex_number(1.2345e6) == r"1.23 \times 10^{6}" and tex_number(0.5) == "0.500"
    assert tex_number(1234.5) == "1230"  # plain digits below 10^6, as in the text tables
    assert tex_number(1.5e-05) == r"1.50 \times 10^{-5}" and tex_number(float("inf")) == r"\infty"


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex not installed (apt-get install texlive-latex-base texlive-latex-recommended)")
@pytest.mark.parametrize("variant", ["default", "all", "paper"])
def test_latex_compiles_with_pdflatex(results, tmp_path, variant):
    (tmp_path / "doc.tex").write_text(DOCUMENT % latex(results, VARIANTS[variant]))
    proc = subprocess.run(["pdflatex", "-halt-on-error", "-interaction=nonstopmode", "doc.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "doc.pdf").read_bytes().startswith(b"%PDF-")
