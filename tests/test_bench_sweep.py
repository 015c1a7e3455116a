"""benchmarks/bench_sweep.py on a tiny sweep (2 points, 3 rounds, 2 spawned workers): the
interleaved order pairs each point's run without accountants with its run with them, and the
keys it prints add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_sweep.py"


@pytest.mark.slow
def test_interleaved_sweep_reports_each_points_accounting_and_the_overhead():
    run = subprocess.run([sys.executable, str(_BENCH), "--json", "--rounds", "3", "--points", "2"],
                         cwd=_BENCH.parent.parent, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["order"] == "interleaved" and out["points"] == 2
    assert len(out["accounting_s_per_point"]) == 2 and len(out["totals"]) == 2
    assert all("exact_epsilon_central_total" in t for t in out["totals"])
    assert out["with_s"] > 0 and out["without_s"] > 0
    assert sum(out["accounting_s_per_point"]) == pytest.approx(out["with_s"] - out["without_s"], abs=1e-2)
    assert out["accounting_overhead"] == pytest.approx((out["with_s"] - out["without_s"]) / out["without_s"])
    # The accounting timed where it runs: part of each run with accountants.
    assert 0 < out["accounted_s"] < out["with_s"] and len(out["accounted_s_per_point"]) == 2
    assert out["accounted_overhead"] == pytest.approx(out["accounted_s"] / out["without_s"])
