"""mkdocs hook: MathJax 3 served from the site itself, so the formulas display offline.

The pages' formulas are TeX (``$...$`` and ``$$ ... $$``), written by pymdownx.arithmatex as
``\\( ... \\)`` / ``\\[ ... \\]`` inside elements of class ``arithmatex`` and typeset in the
browser by MathJax (docs/javascripts/mathjax.js configures it). MathJax comes from a registry
package, not from a CDN: ``django-static-mathjax`` (PyPI, in the ``docs`` extra; it ships
MathJax's files as the importable package ``mathjax`` and needs no Django). ``on_files`` adds
its ``es5`` build to the site under ``javascripts/mathjax/``: the combined TeX-to-CommonHTML
script that mkdocs.yml loads, plus what it loads on demand (the TeX extensions that
``autoload`` fetches, the CommonHTML fonts, the accessibility and menu components).
tests/test_docs_browser.py opens built pages in headless Chromium, with no network, and checks
that every formula was typeset.
"""

from __future__ import annotations

from pathlib import Path

SITE_DIR = "javascripts/mathjax"
"""Where MathJax's files go in the site (mkdocs.yml's extra_javascript names the script there)."""

SCRIPT = "tex-mml-chtml.js"
"""The combined component the pages load: TeX and MathML input, CommonHTML output."""


def mathjax_root() -> Path:
    """The ``es5`` folder of the installed MathJax (django-static-mathjax)."""
    from mkdocs.exceptions import PluginError

    try:
        import mathjax
    except ImportError:
        raise PluginError('MathJax is not installed: pip install -e ".[docs]" (django-static-mathjax ships it)') from None
    root = Path(mathjax.__file__).resolve().parent / "static" / "mathjax" / "es5"
    if not (root / SCRIPT).is_file():
        raise PluginError(f"no {SCRIPT} in {root}: is the package 'mathjax' django-static-mathjax?")
    return root


def wanted(rel: str) -> bool:
    """The files of ``es5`` the site needs: the one combined script and the folders it loads
    from at run time; not the other combined builds, the SVG output or the Node.js entry."""
    if "/" not in rel:
        return rel == SCRIPT
    return not rel.startswith(("output/svg", "adaptors/"))


def site_files(root: Path | None = None) -> dict[str, Path]:
    """Site path -> source file, for every MathJax file the site serves."""
    root = root or mathjax_root()
    return {f"{SITE_DIR}/{p.relative_to(root).as_posix()}": p for p in sorted(root.rglob("*"))
            if p.is_file() and wanted(p.relative_to(root).as_posix())}


def on_files(files, config):
    """mkdocs hook: add MathJax's files to the site."""
    from mkdocs.structure.files import File

    for dest, src in site_files().items():
        files.append(File.generated(config, dest, abs_src_path=str(src)))
    return files
