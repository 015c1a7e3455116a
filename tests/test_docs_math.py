"""The site's math is rendered: the formulas are TeX for MathJax (pymdownx.arithmatex), every
one compiles, no page holds plain-text math, and the checker has teeth
(tests/mathcheck.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mathcheck  # noqa: E402

pytest.importorskip("pymdownx", reason="the docs extra (pip install -e '.[docs]')")
yaml = pytest.importorskip("yaml", reason="the docs extra (pip install -e '.[docs]')")
needs_tex = pytest.mark.skipif(shutil.which("pdflatex") is None,
                               reason="pdflatex not installed (apt-get install texlive-latex-base)")

PAGE = r"""# A page

The noise $\sigma_k^2$ and the gain $c_t$, kept in code: `transmit.sigma2`, `channel.rho`.

$$
\delta(\varepsilon) = \mathbb{E}\big[(1 - e^{\varepsilon - \ell})_+\big]
$$

- in a list:

    $$
    \begin{aligned} a &= b \\ c &= \frac{1}{2} \end{aligned}
    $$
"""


def _page(tmp_path, text=PAGE) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_formulas_are_found_inline_and_displayed_with_their_lines(tmp_path):
    found = mathcheck.formulas(_page(tmp_path))
    assert [(f.tex, f.display, f.line) for f in found[:2]] == [(r"\sigma_k^2", False, 3), ("c_t", False, 3)]
    assert [f.display for f in found] == [False, False, True, True] and found[2].line == 6
    assert found[3].tex.startswith(r"\begin{aligned}") and found[3].line == 12


@needs_tex
def test_valid_tex_passes_and_a_broken_formula_is_named_with_its_line(tmp_path):
    assert mathcheck.tex_errors(mathcheck.formulas(_page(tmp_path))) == []
    broken = _page(tmp_path, PAGE.replace(r"\frac{1}{2}", r"\frac{1}{2").replace(r"\sigma_k^2", r"\sigmma_k"))
    errors = mathcheck.tex_errors(mathcheck.formulas(broken))
    assert len(errors) == 2, errors
    assert "page.md:3" in errors[0] and "sigmma" in errors[0] and "Undefined control sequence" in errors[0]
    assert "page.md:12" in errors[1]


def test_a_display_that_broke_out_of_its_list_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(mathcheck, "ROOT", tmp_path)
    assert mathcheck.stray_math(_page(tmp_path)) == []
    broken = _page(tmp_path, "- an item:\n\n  $$\n  \\frac{1}{2}\n  $$\n\n  more\n\nand $ x$ here\n")
    found = mathcheck.stray_math(broken)
    assert all("TeX not typeset" in f for f in found)
    assert any("frac" in f for f in found) and any("$ x$" in f for f in found)


def test_no_tex_is_left_untypeset_on_any_page():
    assert [p for page in mathcheck.site_pages() for p in mathcheck.stray_math(page)] == []


def test_plain_text_math_is_found_and_code_names_are_not(tmp_path, monkeypatch):
    monkeypatch.setattr(mathcheck, "ROOT", tmp_path)
    assert mathcheck.plain_math(_page(tmp_path)) == []
    plain = _page(tmp_path, PAGE + "\nthe norm `||g_k|| <= L` and the key `delta_l`\n\n```\nH = sup_S [P(S) - e^eps Q(S)]\n```\n")
    found = mathcheck.plain_math(plain)
    assert len(found) == 2 and "code span" in found[0] and "without a language" in found[1]
    prose = _page(tmp_path, PAGE + "\nthe noise sigma_k^2 and the law N(0, 1), and O(1/K^{3/4}).\n")
    found = [f for f in mathcheck.plain_math(prose) if "in the text" in f]
    assert len(found) == 2 and "sigma_k^2" in found[0] and "K^{" in found[1]


@needs_tex
def test_every_formula_on_the_site_compiles():
    found = [f for page in mathcheck.site_pages() for f in mathcheck.formulas(page)]
    assert len(found) > 500  # the model and the privacy pages are written in TeX
    assert mathcheck.tex_errors(found) == []


def test_no_page_of_the_site_holds_plain_text_math():
    pages = mathcheck.site_pages()
    assert len(pages) >= 20
    assert [p for page in pages for p in mathcheck.plain_math(page)] == []


def test_the_site_typesets_the_formulas_with_mathjax():
    config = yaml.safe_load((mathcheck.ROOT / "mkdocs.yml").read_text())
    extensions = {(next(iter(e)) if isinstance(e, dict) else e): e for e in config["markdown_extensions"]}
    assert extensions["pymdownx.arithmatex"]["pymdownx.arithmatex"]["generic"] is True
    scripts = config["extra_javascript"]
    # MathJax 3 from the site itself (hooks/offline_math.py copies the docs extra's copy), no CDN
    assert scripts == ["javascripts/mathjax.js", "javascripts/mathjax/tex-mml-chtml.js"]
    assert "hooks/offline_math.py" in config["hooks"] and not any("://" in s for s in scripts)
    import importlib.util
    import json

    spec = importlib.util.find_spec("mathjax")  # django-static-mathjax, in the docs extra
    if spec is not None:
        package = json.loads((Path(spec.origin).parent / "static" / "mathjax" / "package.json").read_text())
        assert package["name"].startswith("mathjax") and package["version"].startswith("3.")
    js = (mathcheck.DOCS / scripts[0]).read_text()
    assert 'processHtmlClass: "arithmatex"' in js and "typesetPromise" in js
