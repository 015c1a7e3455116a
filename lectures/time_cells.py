"""Time every cell of the lecture notebooks, run headless as marimo runs them as scripts.

    python lectures/time_cells.py                          # all three, default slider values
    python lectures/time_cells.py lectures/02_accountants.py --set users=500 --set sigma2=1.0
    python lectures/time_cells.py --json                   # machine-readable

Each notebook runs in a fresh interpreter (so its first cell pays for the imports, as a
lecturer's first load does). ``--set NAME=VALUE`` replaces the ``.value`` of the UI element
NAME (a slider, a dropdown...) before the run: the cells downstream of it run with that
value, which is how a slider move re-runs them in the app. A cell's time includes
formatting its output as the app does (a matplotlib figure becomes a PNG). Prints one line
per cell, slowest first, with wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted(HERE.glob("0*.py"))


def _child(path: str, overrides: dict[str, object]) -> list[dict]:
    """Run one notebook in this interpreter, timing each cell; returns the timings."""
    import importlib.util
    import types

    from marimo._output.formatters.formatters import register_formatters
    from marimo._output.formatting import try_format
    from marimo._runtime.executor.evaluator import Evaluator

    register_formatters()  # as the app's kernel does: figures in mo.vstack become PNGs in the cell

    spec = importlib.util.spec_from_file_location("_lecture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.app
    names = {data.code.strip(): data.name for data in app._cell_manager.cell_data()}
    timings: list[dict] = []
    original = Evaluator.evaluate_sync

    def timed(self, cell, glbls):
        w, c = time.perf_counter(), time.process_time()
        result = original(self, cell, glbls)
        if result.exception is None and result.output is not None:
            try_format(result.output)  # what the app does next: render the output (figures -> PNG)
        timings.append({"cell": names.get(cell.code.strip(), cell.cell_id),
                        "wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c,
                        "error": None if result.exception is None else repr(result.exception)})
        return result

    Evaluator.evaluate_sync = timed
    defs = None
    if overrides:
        # Run the cell(s) defining the UI elements once, then hand their definitions back
        # with the chosen values: those cells are not re-run, everything downstream is.
        _, base = app.run()
        owners = {}
        for data in app._cell_manager.cell_data():
            tree = ast.parse(data.code) if data.code else None
            if tree is None:
                continue
            targets = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                       for t in node.targets if isinstance(t, ast.Name)}
            for name in overrides:
                if name in targets:
                    owners[name] = targets
        defs = {}
        for name, value in overrides.items():
            if name not in owners:
                raise SystemExit(f"--set {name}: no cell assigns {name!r}")
            for other in owners[name]:
                if other in base and other not in defs:
                    defs[other] = base[other]
        for name, value in overrides.items():
            defs[name] = types.SimpleNamespace(value=value)
        timings.clear()
    app.run(defs=defs)
    return timings


def time_notebook(path: Path, overrides: dict[str, object]) -> list[dict]:
    """Timings of ``path`` from a fresh interpreter (PYTHONPATH, MPLBACKEND=Agg, 1 thread)."""
    env = dict(os.environ)
    root = str(HERE.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("OMP_NUM_THREADS", "1")
    code = ("import json, sys; sys.path.insert(0, %r); from time_cells import _child; "
            "print('@@' + json.dumps(_child(%r, json.loads(%r))))" % (str(HERE), str(path), json.dumps(overrides)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=root)
    if out.returncode != 0:
        raise SystemExit(f"{path.name} failed:\n{out.stderr[-3000:]}")
    line = next(l for l in out.stdout.splitlines() if l.startswith("@@"))
    return json.loads(line[2:])


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path, default=NOTEBOOKS)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="UI element NAME gets .value VALUE (JSON: 500, 0.1, [0.1, 0.5], \"digits\")")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name.strip()] = _parse_value(value.strip())
    report = {}
    for path in args.notebooks:
        report[path.name] = time_notebook(path.resolve(), overrides)
    if args.json:
        print(json.dumps({"overrides": overrides, "load": os.getloadavg(), "cells": report}, indent=1))
        return 0
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; overrides {overrides or 'none'}")
    for name, cells in report.items():
        print(f"\n{name}: total {sum(c['wall_s'] for c in cells):.2f} s wall")
        for c in sorted(cells, key=lambda c: -c["wall_s"]):
            flag = f"  ERROR {c['error']}" if c["error"] else ""
            print(f"  {c['wall_s']:7.3f} s wall {c['cpu_s']:7.3f} s cpu  {c['cell']}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
