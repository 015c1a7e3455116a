"""The CLI starts fast: ``--help``, ``--version`` and a bad option import none of the heavy
libraries (torch, numpy, scipy, matplotlib, ...). Their imports come after the command's own
options parsed; the option choices come from torch-free name modules (otafl/names.py,
otafl/privacy/names.py, the accountants' registry, otafl/api/defaults.py).

Timings are in benchmarks/bench_startup.py (no absolute times asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from otafl.cli.main import COMMANDS

HEAVY = ("torch", "numpy", "scipy", "matplotlib", "dp_accounting", "opacus", "sklearn", "mlxtend", "tqdm")

PROBE = """
import json, sys
from otafl.cli.main import cli
try:
    cli(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def _probe(*args: str) -> dict:
    code = f"HEAVY = {HEAVY!r}\n" + PROBE
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["--help"], ["--version"], []], ids=["help", "version", "bare"])
def test_help_and_version_import_no_heavy_library(args):
    res = _probe(*args)
    assert res == {"code": 0, "heavy": []}


def test_every_command_help_imports_no_heavy_library():
    # one process for all: each command's --help, in a loop
    code = (f"HEAVY = {HEAVY!r}\n" "import json, sys\nfrom otafl.cli.main import cli\ncodes = []\n"
            f"for name in {sorted(COMMANDS)!r}:\n"
            "    try:\n        cli([name, '--help'])\n    except SystemExit as e:\n        codes.append(e.code)\n"
            "print(json.dumps({'codes': codes, 'heavy': sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"codes": [0] * len(COMMANDS), "heavy": []}


@pytest.mark.parametrize("args", [
    ["bound", "--accountant", "nope"],
    ["audit", "--adversary", "nobody"],
    ["bound", "--composition", "sum"],
    ["run", "--device", "tpu"],
    ["sweep", "--executor", "slurm", "x.toml"],
    ["plot", "x.sqlite", "--kind", "pie", "--out", "x.png"],
    ["calibrate", "--solve", "model.width", "--target-epsilon", "1"],
    ["scaling", "--points", "many"],
    ["nonsense"],
], ids=lambda a: "-".join(a[:2]))
def test_a_bad_option_is_one_line_with_exit_2_and_no_heavy_import(args):
    res = _probe(*args)
    assert res == {"code": 2, "heavy": []}


def test_the_choices_are_the_registries():
    """The light name modules are what the heavy modules use (one source)."""
    import otafl.api.audit
    import otafl.api.bound
    import otafl.api.curves
    import otafl.api.scaling
    import otafl.device
    import otafl.privacy.analysis.steps
    import otafl.privacy.audit
    from otafl.api import defaults
    from otafl import names
    from otafl.privacy import names as privacy_names
    from otafl.privacy.accountants.registry import ACCOUNTANTS

    assert otafl.device.DEVICES is names.DEVICES
    assert otafl.privacy.audit.ADVERSARIES is privacy_names.ADVERSARIES
    assert otafl.privacy.analysis.steps.COMPOSITIONS is privacy_names.COMPOSITIONS
    assert otafl.api.audit.SCOPES is defaults.AUDIT_SCOPES
    assert otafl.api.bound.DEFAULT_CHANNEL_ROUNDS is defaults.DEFAULT_CHANNEL_ROUNDS
    assert otafl.api.curves.PRESET is defaults.CURVES_PRESET
    assert otafl.api.scaling.SCHEMES is defaults.SCALING_SCHEMES
    assert defaults.accountant_names() == sorted(ACCOUNTANTS)
    for acc in ACCOUNTANTS.values():  # every registered function resolves
        assert callable(acc.round_bound) and acc.round_bound.__name__ == acc.function.rpartition(":")[2]


def test_a_command_still_gets_its_threads():
    """The group's --threads reaches torch once the command runs (the deferred set-up)."""
    code = ("import sys, torch\nfrom otafl.cli.main import cli\n"
            "try:\n    cli(['--threads', '3', 'bound', '--users', '10', '--p', '0.5', '--accountant', 'paper'])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\nprint(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "3", out.stderr
