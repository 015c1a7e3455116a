"""How long ``otafl`` takes to answer before it does any work: ``--version``, ``--help``, a
command's ``--help``, a misspelt option, a bad option value and a bad spec value (one-line
errors, exit 2, found before torch loads), side by side with ``python -c pass`` (the
interpreter alone) and ``python -c "import torch"`` (what every command paid before the heavy
imports moved after parsing and the checks).

    python benchmarks/bench_startup.py            # table of medians
    python benchmarks/bench_startup.py --json     # one JSON object
    python benchmarks/bench_startup.py --repeats 9

Each command runs ``--repeats`` times in alternating order (one process each, the console
script of this interpreter's environment); medians in seconds. ``ratio_*`` keys are each
command's median over ``import torch``'s: well below 1 means the command never loads torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commands() -> dict[str, list[str]]:
    exe = Path(sys.executable)
    otafl = shutil.which("otafl", path=str(exe.parent)) or shutil.which("otafl")
    base = [otafl] if otafl else [sys.executable, "-m", "otafl"]
    return {
        "python": [sys.executable, "-c", "pass"],
        "import_torch": [sys.executable, "-c", "import torch"],
        "version": base + ["--version"],
        "help": base + ["--help"],
        "bound_help": base + ["bound", "--help"],
        "bad_option": base + ["bound", "--accountant", "nope"],
        "bad_value": base + ["bound", "--p", "2"],  # the grid checks (otafl/api/checks.py), before torch
        "bad_spec_value": base + ["run", str(ROOT / "experiments" / "quickstart.toml"), "--set", "sampling.p=2",
                                  "--out", os.devnull],  # spec validation (otafl/validation.py), before torch
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cmds = commands()
    times: dict[str, list[float]] = {k: [] for k in cmds}
    env = {**os.environ, "OTAFL_THREADS": "1"}
    for i in range(args.repeats):
        for name in (list(cmds) if i % 2 == 0 else list(reversed(cmds))):
            t0 = time.perf_counter()
            subprocess.run(cmds[name], capture_output=True, env=env, timeout=300)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {f"median_s_{k}": round(v, 4) for k, v in med.items()}
    out.update({f"ratio_{k}_vs_import_torch": round(med[k] / med["import_torch"], 3)
                for k in ("version", "help", "bound_help", "bad_option", "bad_value", "bad_spec_value")})
    out["repeats"] = args.repeats
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in med.items():
            print(f"{k:14s} {v * 1000:8.0f} ms  ({' '.join(cmds[k][-3:])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
