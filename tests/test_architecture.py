"""The package's shape: layers point one way, modules stay small, bad specs fail before work."""

import ast
import pathlib

import pytest
from click.testing import CliRunner

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "otafl"


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    mods = set()
    for node in ast.walk(tree):  # module level and inside functions alike
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods.update(alias.name for alias in node.names)
    return mods


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_only_the_cli_imports_the_cli():
    offenders = [str(p.relative_to(PACKAGE)) for p in _modules()
                 if not p.relative_to(PACKAGE).as_posix().startswith("cli/") and p.name != "__main__.py"
                 and any(m == "otafl.cli" or m.startswith("otafl.cli.") for m in _imports(p))]
    assert offenders == []


@pytest.mark.parametrize("layer", ["privacy", "report", "channel"])
def test_privacy_reports_and_physics_never_import_the_training_code(layer):
    offenders = [str(p.relative_to(PACKAGE)) for p in (PACKAGE / layer).rglob("*.py")
                 if any(m == "otafl.fl" or m.startswith("otafl.fl.") for m in _imports(p))]
    assert offenders == []


def test_privacy_math_imports_nothing_above_it():
    allowed = ("otafl.privacy", "otafl.errors")
    offenders = {str(p.relative_to(PACKAGE)): sorted(m for m in _imports(p)
                                                     if m.startswith("otafl") and not m.startswith(allowed))
                 for p in (PACKAGE / "privacy").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_is_too_large_to_read():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in _modules()}
    assert {k: n for k, n in sizes.items() if n > 520} == {}


def test_docstrings_point_into_the_repository():
    outside = [str(p.relative_to(PACKAGE)) for p in _modules()
               for text in [p.read_text()]
               if "shared/spec" in text or "system-model.md" in text
               or ("privacy.md" in text.replace("docs/privacy.md", ""))]
    assert outside == []


def test_a_misspelt_accountant_fails_before_any_data_is_loaded(tmp_path, monkeypatch):
    import otafl.data
    import otafl.fl.loop
    import otafl.setup
    from otafl.cli.main import cli

    def no_loading(*args, **kwargs):
        raise AssertionError("data loaded before the spec was validated")

    monkeypatch.setattr(otafl.data, "load_dataset", no_loading)
    monkeypatch.setattr(otafl.setup, "build_run", no_loading)
    monkeypatch.setattr(otafl.fl.loop, "build_run", no_loading)
    spec = tmp_path / "typo.toml"
    spec.write_text('[privacy]\naccountants = ["tigth"]\n')
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "'tigth'" in lines[0] and "tight" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("module", ["otafl", "otafl.cli.main"])
def test_the_cli_runs_as_a_module(module):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Usage:" in out.stdout and "sweep" in out.stdout, out.stderr
