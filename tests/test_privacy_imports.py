"""The privacy package's import graph: no training, CLI or report code, no cycle, a cheap registry."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import otafl.privacy

PACKAGE = "otafl.privacy"
ROOT = Path(otafl.privacy.__file__).parent
FORBIDDEN = ("otafl.fl", "otafl.cli", "otafl.data", "otafl.models", "otafl.report")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` names, at any depth (lazy imports too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            found.add(target)
            # "from pkg import module" imports a submodule when one of that name exists
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    out = {}
    for name, path in modules.items():
        targets = set()
        for target in imports_of(path):
            # an import of a.b.c also runs a/__init__ and a/b/__init__
            parts = target.split(".")
            targets.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        out[name] = {t for t in targets if t in modules and t != name}
        out[name] |= {t for t in targets if t.startswith(FORBIDDEN)}
    return out


def test_privacy_never_imports_training_cli_or_report_code():
    bad = {name: sorted(t for t in targets if any(t == f or t.startswith(f + ".") for f in FORBIDDEN))
           for name, targets in graph().items()}
    assert {name: targets for name, targets in bad.items() if targets} == {}


def test_no_import_cycle_inside_privacy():
    edges = {name: {t for t in targets if t.startswith(PACKAGE)} for name, targets in graph().items()}
    # A package's __init__ re-exporting its submodules is not a cycle: drop edges from a
    # package to its own submodules (the submodule still depends on its parents).
    for name in edges:
        edges[name] = {t for t in edges[name] if not t.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_importing_the_registry_is_cheap():
    code = ("import sys, otafl.privacy.accountants.registry, otafl.privacy; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'opacus', 'dp_accounting', 'otafl'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['otafl']"
