"""The site's math: the formulas on the pages are TeX (``$...$`` inline, ``$$ ... $$`` on lines of
their own for a display), turned by ``pymdownx.arithmatex`` (mkdocs.yml, generic mode) into
``\\(...\\)`` and ``\\[...\\]`` for MathJax (docs/javascripts/mathjax.js) to typeset.

* :func:`formulas` renders a page with the site's Markdown extensions and returns every formula
  MathJax will see, with the page line it starts on;
* :func:`tex_errors` compiles them all, each on its own, in one ``pdflatex`` document (amsmath,
  amssymb: the macros MathJax's TeX input has too) and returns one line per formula TeX rejects;
* :func:`stray_math` lists the TeX arithmatex did not take (it would show as source);
* :func:`plain_math` lists what still looks like plain-text math on a page: a fence without a
  language (the pages' old display formulas) or a code span holding math (``||x||``, ``_{k,t}``,
  ``x^2``, ``sqrt(``, ``<=``, a Greek name with a subscript or a power; a bare name such as ``rho`` may be a key) or math in the running text (``sigma_k^2``, ``K^{3/4}``).

    python tests/mathcheck.py                  # every page of the site: formulas, TeX errors, plain math
    python tests/mathcheck.py docs/model.md    # one page
"""

from __future__ import annotations

import functools
import html
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doccheck import _fences  # noqa: E402  (one fence scanner for the docs checks)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

_EXTENSIONS = ["admonition", "tables", "attr_list", "pymdownx.superfences", "pymdownx.arithmatex"]
_CONFIG = {"pymdownx.arithmatex": {"generic": True}}
_MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
_GREEK = ("sigma", "mu", "eps", "epsilon", "delta", "Delta", "Phi", "phi", "rho", "lambda", "alpha",
          "Omega", "ell", "gamma", "theta", "kappa", "beta", "tau", "xi", "omega", "Qbar", "nu")
_PLAIN = re.compile(r"\|\||_\{|\^[0-9{(]|\bsqrt\(|\bexp\(|\blog\(| <= | >= |\b(sum|min|max)_(\{|[a-z]\b)|"
                    r"(?<![.\w:\"'-])(" + "|".join(_GREEK) + r")(_(\{|[A-Za-z0-9]{1,2}\b)|\^)")
_CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# Plain-text math in running prose (outside code spans and formulas): a norm, a braced subscript,
# a power, a square root, a subscripted or squared Greek name.
_PROSE = re.compile(r"\|\||\b\w+_\{|\b[A-Za-z]\w*\^[\w{(]|\bsqrt\(|"
                    r"\b(" + "|".join(_GREEK) + r")(_[A-Za-z0-9]{1,2}\b|\^)")


@dataclass(frozen=True)
class Formula:
    page: Path
    line: int
    tex: str
    display: bool


def site_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


@functools.lru_cache(maxsize=64)
def _render(source: str) -> str:
    """A page's HTML as the site renders it (the Markdown extensions that shape its math)."""
    import markdown

    return markdown.markdown(source, extensions=_EXTENSIONS, extension_configs=_CONFIG)


def _prose(source: str) -> str:
    """The rendered page without its code and its formulas."""
    return _MATH.sub(" ", re.sub(r"<pre.*?</pre>|<code.*?</code>", " ", _render(source), flags=re.S))


def formulas(path: Path) -> list[Formula]:
    """Every formula of ``path`` as MathJax receives it, in page order."""
    source = path.read_text()
    found, start = [], 0
    for m in _MATH.finditer(_render(source)):
        text = html.unescape(m.group(2)).strip()
        display = m.group(1) == "div"
        tex = text[2:-2] if text[:2] in ("\\(", "\\[") else text
        # The page line: the first line at or after the previous formula's holding its first line.
        head = tex.strip().splitlines()[0].strip() if tex.strip() else ""
        at = source.find(head, start) if head else -1
        line = source.count("\n", 0, at) + 1 if at >= 0 else 0
        start = at + 1 if at >= 0 else start
        found.append(Formula(path, line, tex.strip(), display))
    return found


def _where(f: Formula) -> str:
    try:
        name = f.page.relative_to(ROOT)
    except ValueError:
        name = f.page
    return f"{name}:{f.line}"


def tex_errors(found: list[Formula]) -> list[str]:
    """One line per formula that pdflatex (amsmath, amssymb) rejects; [] when every one compiles.

    All formulas go into one document, each in its own paragraph; an error is mapped to its
    formula by the TeX line it names. A fatal error (a runaway argument reads to the end of the
    file) hides the formulas after it, so then the halves are compiled again, down to the one."""
    if not found:
        return []
    errors, fatal = _compile(found)
    if not fatal:
        return errors
    if len(found) == 1:
        return errors or [f"{_where(found[0])}: TeX rejects {found[0].tex!r}: {fatal}"]
    mid = len(found) // 2
    return tex_errors(found[:mid]) + tex_errors(found[mid:])


def _compile(found: list[Formula]) -> tuple[list[str], str]:
    lines = [r"\documentclass{article}", r"\usepackage{amsmath,amssymb}", r"\begin{document}"]
    spans = []
    for f in found:
        first = len(lines) + 1
        body = f.tex.splitlines() or [""]
        if f.display:
            lines += [r"\[", *body, r"\]"]
        else:
            lines += ["$" + " ".join(body) + "$"]
        lines.append(r"\par")
        spans.append((first, len(lines), f))
    lines.append(r"\end{document}")
    with tempfile.TemporaryDirectory() as tmp:
        tex = Path(tmp) / "math.tex"
        tex.write_text("\n".join(lines) + "\n")
        subprocess.run(["pdflatex", "-interaction=nonstopmode", "-no-shell-escape", tex.name],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
        log = (Path(tmp) / "math.log").read_text(errors="replace")
    errors, bad = [], set()
    for m in re.finditer(r"^! (.*?)$(?:.*?)^l\.(\d+)", log, re.S | re.M):
        message, at = m.group(1).strip(), int(m.group(2))
        for first, last, f in spans:
            if first <= at <= last and id(f) not in bad:
                bad.add(id(f))
                errors.append(f"{_where(f)}: TeX rejects {f.tex!r}: {message}")
    fatal = ""
    if "Fatal error occurred" in log or "Emergency stop" in log or "no output PDF" in log:
        first_error = re.search(r"^! (.*?)$", log, re.M)
        fatal = first_error.group(1).strip() if first_error else "pdflatex stopped"
    return errors, fatal


def stray_math(path: Path) -> list[str]:
    """TeX that arithmatex did not take (a ``$$`` display the list around it broke, a ``$`` with a
    space inside it): a ``$``, ``\\(``, ``\\[`` or TeX command left in the rendered page outside
    code and formulas."""
    return [f"{path.relative_to(ROOT)}: TeX not typeset: {m.group(0).strip()!r}"
            for m in re.finditer(r".{0,30}(\$|\\\(|\\\[|\\[a-zA-Z]+).{0,30}", _prose(path.read_text()))]


@functools.lru_cache(maxsize=1)
def _spec_keys() -> frozenset[str]:
    """The experiment spec's keys (otafl.config.SECTIONS): a code span naming one is a key, even
    when it reads like math (`delta_l`, `rho`)."""
    import dataclasses

    from otafl.config import SECTIONS

    return frozenset(f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls))


def plain_math(path: Path) -> list[str]:
    """What still looks like plain-text math on ``path``: fences without a language, code spans
    holding math, math in running prose."""
    lines, out, keys = path.read_text().splitlines(), [], _spec_keys()
    fenced = set()
    for i, m, j in _fences(lines):
        fenced.update(range(i, j + 1))
        if not m.group(2).strip():
            out.append(f"{path.relative_to(ROOT)}:{i + 1}: a fence without a language (a display "
                       "formula is $$ ... $$; a diagram or a listing names its language, e.g. text)")
    display = False
    for i, line in enumerate(lines):
        if i in fenced:
            continue
        if line.strip() == "$$":
            display = not display
        elif not display:
            for span in _CODE_SPAN.findall(line):
                if _PLAIN.search(span) and span not in keys and not span.startswith(("--", "otafl ", "python ")):
                    out.append(f"{path.relative_to(ROOT)}:{i + 1}: plain-text math in a code span: `{span}`")
    return sorted(out, key=lambda s: int(s.split(":")[1])) + _prose_math(path)


def _prose_math(path: Path) -> list[str]:
    """Math in running prose: the rendered page without code, formulas, tags and link targets."""
    text = html.unescape(re.sub(r"<[^>]+>", " ", _prose(path.read_text())))
    return [f"{path.relative_to(ROOT)}: plain-text math in the text: "
            f"{' '.join(text[max(0, m.start() - 25):m.end() + 15].split())!r}" for m in _PROSE.finditer(text)]


def main(argv: list[str]) -> int:
    pages = [Path(a).resolve() for a in argv] or site_pages()
    found = [f for p in pages for f in formulas(p)]
    problems = []
    if shutil.which("pdflatex"):
        problems += tex_errors(found)
    else:
        print("pdflatex not installed: formulas not compiled", file=sys.stderr)
    problems += [p for page in pages for p in stray_math(page)]
    problems += [p for page in pages for p in plain_math(page)]
    for p in problems:
        print(p)
    print(f"{len(found)} formulas on {len(pages)} pages, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
