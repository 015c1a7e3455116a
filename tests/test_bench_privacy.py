"""benchmarks/bench_privacy.py's run keys on a tiny run (5 rounds of the paper preset, two cold
runs each): every key is the smallest of its runs, and it states exact's totals (central below
local, and at most tight's central)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_privacy.py"


@pytest.mark.slow  # a benchmark's smoke test, as bench_sweep's (4-6 s: the default suite is at its 4 minutes)
def test_the_run_keys_are_the_smallest_of_their_cold_runs_with_the_runs_totals():
    run = subprocess.run([sys.executable, str(_BENCH), "--json", "--run-keys-only", "--rounds", "5",
                          "--large-k-rounds", "0", "--repeats", "2"],
                         cwd=_BENCH.parent.parent, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["rounds"] == 5
    for key in ("exact_account_ms_round_paper_run", "paper_tight_account_ms_round_paper_run"):
        runs = out[f"{key}_runs"]
        assert len(runs) == 2 and all(r > 0 for r in runs) and out[key] == min(runs)
    exact = out["exact_paper_run_totals"]
    assert 0 < exact["exact_epsilon_central_total"] < exact["exact_epsilon_local_total"]
    others = out["paper_run_totals"]
    assert exact["exact_epsilon_central_total"] <= others["tight_epsilon_central_total"]
