"""The layering of the bound-style code: api (library) <- cli (parse, call, print); report draws and
formats and never reaches into the command line or the training loop."""

from __future__ import annotations

import ast
from pathlib import Path

import otafl

ROOT = Path(otafl.__file__).resolve().parent


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_report_imports_neither_the_cli_nor_the_loop_nor_click():
    for path in sorted((ROOT / "report").glob("*.py")):
        bad = {m for m in imports(path) if m.split(".")[0] == "click" or m.startswith(("otafl.cli", "otafl.fl"))}
        assert not bad, (path.name, bad)


def test_api_imports_neither_the_cli_nor_click():
    for path in sorted((ROOT / "api").glob("*.py")):
        bad = {m for m in imports(path) if m.split(".")[0] == "click" or m.startswith("otafl.cli")}
        assert not bad, (path.name, bad)


def test_cli_commands_do_not_import_each_other():
    for name in ("audit", "bound", "scaling", "accountants"):
        mods = imports(ROOT / "cli" / f"{name}.py")
        others = {m for m in mods if m.startswith("otafl.cli.") and not m.startswith("otafl.cli.options")}
        assert not others, (name, others)


def test_the_paper_dimension_is_written_once():
    hits = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
            if p.parts[-2] in ("api", "cli", "report") and "7850" in p.read_text()]
    assert hits == ["api/defaults.py"], hits  # PAPER_DIM
