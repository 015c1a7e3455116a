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
    import otafl.channel.fading
    import otafl.data
    import otafl.estimate
    import otafl.fl.optim
    import otafl.models
    import otafl.sampling

    for module, key in ((otafl.models, "MODELS"), (otafl.data, "DATASETS"), (otafl.data, "SPLITS"),
                        (otafl.channel.fading, "FADING_MODELS"), (otafl.sampling, "SAMPLING_SCHEMES"),
                        (otafl.estimate, "ESTIMATORS"), (otafl.fl.optim, "OPTIMIZERS")):
        registry = getattr(names, key)
        assert getattr(module, key) is registry  # spec validation reads the very registry the module builds from
        for name in registry:  # every entry resolves to its implementation
            assert callable(registry[name]), (key, name)
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


ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent

BAD_VALUES = [  # one-line input errors found by the torch-free checks (otafl/api/checks.py, otafl/validation.py)
    (["bound", "--p", "2"], "error: p = 2.0 is outside the allowed range (0, 1]"),
    (["bound", "--snr-db", "2000"], "error: snr_db = 2000.0 is outside the allowed range [-100, 100]"),
    (["bound", "--p", "0.5", "--rounds", "1000000000000"], "error: users = 200 with the exact accountant's "
     "totals over 1000000000000 rounds (per-user facts) needs about 5.68 PiB, over the memory limit of 8 GiB (raise it with otafl --memory-limit GB or "
     "OTAFL_MEMORY_LIMIT_GB)"),
    (["bound", "--accountant", "steps", "--local-steps", "0"],
     "error: local_steps = 0 is outside the allowed range [1, 100000] (integers)"),
    (["bound", "--accountant", "exact", "--record-sampling", "2"],
     "error: record_sampling = 2.0 is outside the allowed range (0, 1]"),
    (["bound", "--accountant", "steps", "--local-steps", "2"],
     "error: local_steps and record_sampling need step_noise (the per-step noise multiplier)"),
    (["audit", "--p", "0.5", "--samples", "0"], "error: samples = 0 is outside the allowed range [1, inf)"),
    (["plot-accountants", "--p", "2", "--out", "OUT/a.png"], "error: p = 2.0 is outside the allowed range (0, 1]"),
    (["scaling", "--points", "1"], "error: points = 1 is outside the allowed range [2, inf)"),
    (["run", "experiments/quickstart.toml", "--set", "sampling.p=2", "--out", "OUT/run"],
     "error: sampling.p = 2.0 is outside the allowed range (0, 1]"),
    (["run", "experiments/quickstart.toml", "--set", "data.name='cifar'", "--out", "OUT/run"],
     "error: data.name = 'cifar' is not one of: digits, mnist, mnist-embedded, synthetic"),
    (["run", "experiments/quickstart.toml", "--set", "train.local_steps=0", "--out", "OUT/run"],
     "error: train.local_steps = 0 is outside the allowed range [1, 100000] (integers)"),
    (["sweep", "experiments/quickstart-sweep.toml", "--set", "sampling.h_th=-1", "--out", "OUT/s.sqlite"],
     "error: sweep point sampling.p=0.1: sampling.h_th = -1.0 is outside the allowed range (0, inf)"),
    (["audit-run", "experiments/audit-ota.toml", "--set", "audit.trials=1"],
     "error: audit.trials = 1 is outside the allowed range [2, 1e+07]"),
    (["calibrate", "experiments/quickstart.toml", "--solve", "transmit.sigma2", "--target-epsilon", "-1"],
     "error: target_epsilon = -1.0 is outside the allowed range (0, inf)"),
]


@pytest.mark.parametrize("args,line", BAD_VALUES, ids=lambda a: "-".join(a[:2]) if isinstance(a, list) else "")
def test_a_bad_value_is_refused_in_one_line_before_torch_loads(tmp_path, args, line):
    """The checks of option and spec values import no heavy library: the same line, exit 2,
    and none of torch, numpy, scipy, ... in sys.modules (so the error comes in a fraction of a
    second instead of the ~2.5 s torch and scipy take to import)."""
    args = [a.replace("OUT", str(tmp_path)) for a in args]
    code = f"HEAVY = {HEAVY!r}\n" + PROBE
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"code": 2, "heavy": []}
    assert out.stderr.splitlines() == [line]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_accounting_a_round_exactly_does_not_import_sympy():
    """torch.broadcast_shapes imports sympy on its first call (1.3 s); the accountants use
    numpy's rule instead, so `bound` pays only for what it computes."""
    code = ("import sys; from otafl.cli.main import cli\ntry:\n    cli(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('exit', e.code)\nprint('torch' in sys.modules, 'sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "bound", "--users", "20", "--p", "0.5", "--sigma2", "0.1",
                          "--n0", "0", "--accountant", "exact,tight,paper", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-2:] == ["exit 0", "True False"], out.stderr[-2000:]
