"""HTML exports of the lecture notebooks for the documentation site.

``marimo export html`` runs a notebook with its sliders at their defaults and writes a static
page: every cell's code and output (figures embedded), no Python behind it, so the sliders do
not recompute. marimo writes pages that load its frontend from the jsDelivr CDN; the site's
copies load it from the site instead (``lectures/marimo-frontend/``, the files marimo's wheel
ships), so they display offline like the rest of the site; producing them needs no network. ``mkdocs.yml`` names this file as a
hook: ``on_files`` adds ``lectures/0X_....html`` to the site (docs/lectures.md links them), from
a cache under ``.cache/lectures/`` keyed by the notebook, the otafl sources and marimo's version,
so that only the first build after a change runs the notebooks (three side by side, about 30 s
on 2 cores; marimo also leaves its session snapshots in ``lectures/__marimo__/``, ignored by git).
The ``docs`` extra installs marimo; without it the build stops with a line saying so.

    python lectures/site_export.py OUT_DIR      # the same exports, into OUT_DIR
"""

from __future__ import annotations

import hashlib
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LECTURES = ROOT / "lectures"
CACHE = ROOT / ".cache" / "lectures"


def notebooks() -> list[Path]:
    return sorted(LECTURES.glob("0*.py"))


def _key(notebook: Path) -> str:
    import marimo

    h = hashlib.sha256(marimo.__version__.encode())
    for path in [notebook, *sorted((ROOT / "otafl").rglob("*.py"))]:
        h.update(path.relative_to(ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def exports(timeout: float = 600.0) -> dict[str, Path]:
    """Notebook stem -> its cached HTML export, running ``marimo export html`` for the stale ones
    side by side."""
    CACHE.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OTAFL_THREADS": "1", "MPLBACKEND": "Agg"}
    out, procs = {}, {}
    for nb in notebooks():
        html = CACHE / f"{nb.stem}-{_key(nb)}.html"
        out[nb.stem] = html
        if not html.is_file():
            tmp = html.with_suffix(".tmp.html")
            procs[nb.stem] = (subprocess.Popen(
                [sys.executable, "-m", "marimo", "export", "html", str(nb), "-o", str(tmp), "--force"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), tmp, html)
    for stem, (proc, tmp, html) in procs.items():
        text, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0 or not tmp.is_file():
            raise RuntimeError(f"marimo export html lectures/{stem}.py failed:\n{text[-3000:]}")
        tmp.replace(html)
        for old in CACHE.glob(f"{stem}-*.html"):
            if old != html:
                old.unlink()
    return out


def on_files(files, config):
    """mkdocs hook: add the exports as ``lectures/<notebook>.html``."""
    try:
        import marimo  # noqa: F401
    except ImportError:  # docs/lectures.md links the exports: say what is missing, not which link broke
        from mkdocs.exceptions import PluginError

        raise PluginError('marimo is not installed, so the lectures\' HTML exports cannot be made: '
                          'pip install -e ".[docs]"') from None
    from mkdocs.structure.files import File

    for stem, html in exports().items():
        files.append(File.generated(config, f"lectures/{stem}.html", content=offline(html.read_text())))
    for dest, src in frontend_files().items():  # the frontend those pages load, from the site itself
        files.append(File.generated(config, f"lectures/{dest}", abs_src_path=str(src)))
    return files


FRONTEND = "marimo-frontend"
"""Where the site serves marimo's frontend, beside the exports (``lectures/marimo-frontend/``)."""

_CDN = re.compile(r"https://cdn\.jsdelivr\.net/npm/@marimo-team/frontend@[^/\"']+/dist/")


def offline(page: str) -> str:
    """An export that loads marimo's frontend from the site (:data:`FRONTEND`, a relative URL)
    instead of the jsDelivr CDN, so that it displays without a network connection."""
    return _CDN.sub(f"{FRONTEND}/", page)


def frontend_files() -> dict[str, Path]:
    """Site path (under lectures/) -> file, for marimo's frontend as its wheel ships it
    (``marimo/_static``: the same files the CDN serves for this version)."""
    import marimo

    root = Path(marimo.__file__).resolve().parent / "_static"
    return {f"{FRONTEND}/{p.relative_to(root).as_posix()}": p for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("index.html", "CLAUDE.md")}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    dest = Path(argv[0])
    dest.mkdir(parents=True, exist_ok=True)
    for stem, html in exports().items():
        shutil.copyfile(html, dest / f"{stem}.html")
        print(dest / f"{stem}.html")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
