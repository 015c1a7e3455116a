"""The lecture kit: every marimo notebook in lectures/ runs headless as a plain script.

``python lectures/0X_....py`` executes all cells with the sliders at their defaults; the
last cell prints one ``lecture-0X summary:`` line, checked here. Needs the ``lectures``
extra (``pip install -e ".[lectures]"``); skipped without marimo.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("marimo", reason="marimo is not installed: the lecture kit needs pip install -e '.[lectures]'")

# About 20 CPU-seconds: CI runs them in its -m slow pass (.ci/run).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LECTURES = ROOT / "lectures"


NOTEBOOKS = ("01_fading_mac.py", "02_accountants.py", "03_tradeoff.py")


@pytest.fixture(scope="module")
def summaries() -> dict[str, str]:
    """Run the three notebooks as scripts, side by side; name -> its summary line (exit 0 asserted)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["MPLBACKEND"] = "Agg"
    env.setdefault("OMP_NUM_THREADS", "1")
    procs = {name: subprocess.Popen([sys.executable, str(LECTURES / name)], env=env, cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name in NOTEBOOKS}
    out = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=180)
            marker = f"lecture-{name[:2]} summary:"
            lines = [line for line in stdout.splitlines() if line.startswith(marker)]
            out[name] = (proc.returncode, lines, stdout[-2000:] + stderr[-3000:])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return out


def summary(summaries, name: str) -> str:
    code, lines, tail = summaries[name]
    assert code == 0, f"{name} exited {code}:\n{tail}"
    assert len(lines) == 1, f"{name} printed no single 'lecture-{name[:2]} summary:' line:\n{tail}"
    return lines[0]


def number(line: str, key: str) -> float:
    m = re.search(re.escape(key) + r"=?\s*(-?[0-9.]+(?:e[-+]?[0-9]+)?|inf|nan)", line)
    assert m, f"{key!r} not in {line!r}"
    return float(m.group(1))


def test_every_notebook_is_covered():
    assert tuple(sorted(p.name for p in LECTURES.glob("0*.py"))) == NOTEBOOKS


def test_lecture_01_fading_mac(summaries):
    line = summary(summaries, "01_fading_mac.py")
    assert "K=50 T=60" in line
    assert 0.0 < number(line, "median c_t") < math.inf
    assert number(line, "mean |K_t|") == pytest.approx(25, abs=5)  # p = 0.5 of K = 50
    # the min alignment policy keeps every transmitter within its power budget
    assert 0.0 < number(line, "max power ratio") <= 1.0 + 1e-9
    assert 0.0 < number(line, "rel. error known") < math.inf
    assert 0.0 < number(line, " unknown") < math.inf


def test_lecture_02_accountants(summaries):
    line = summary(summaries, "02_accountants.py")
    assert "K=200 sigma2=0.1 L=1.0 delta=1e-05" in line
    # the direction flip in p at L = 1: the closed forms fall, exact has an interior minimum and rises
    assert re.search(r"paper [0-9.e+]+->[0-9.e+]+ \(falls\)", line)
    assert re.search(r"tight [0-9.e+]+->[0-9.e+]+ \(falls\)", line)
    assert re.search(r"exact min [0-9.]+ at p=0\.1 then rises", line)
    # each epsilon with its delta: the closed forms' per-round delta grows as p falls (their tail
    # delta' of too few participants), exact's is the slider's
    for name in ("paper", "tight"):
        m = re.search(name + r" [^,|]* at delta ([0-9.e+-]+)->([0-9.e+-]+)", line)
        assert m and float(m.group(1)) > 1 / 200 > float(m.group(2)) > 0  # p = 0.05: above 1/K; p = 1: small
    assert re.search(r"exact min [^|]* at delta 1e-05 \|", line)
    # the paper's bound: slope ~ -1/2 at fixed p, ~ -3/4 for p ~ K^{-1/2}
    assert -0.7 < number(line, "fixed-p") < -0.45
    assert -0.9 < number(line, "sqrt-p") < -0.7


def test_a_summary_that_prints_an_epsilon_states_a_delta(summaries):
    for name in NOTEBOOKS:
        line = summary(summaries, name)
        assert "eps" not in line or "delta" in line, line  # lecture 01 prints no epsilon


def test_lecture_03_tradeoff(summaries):
    line = summary(summaries, "03_tradeoff.py")
    assert "dataset=digits K=40 T=40" in line
    points = re.findall(r"p=([0-9.]+): acc=([0-9.]+) eps=([0-9.e+]+)", line)
    assert [float(p) for p, _, _ in points] == [0.1, 0.3, 0.5, 1.0]
    assert all(0.0 < float(acc) <= 1.0 and 0.0 < float(eps) < math.inf for _, acc, eps in points)
    assert "accuracy rises with p: yes" in line
    assert "eps=exact_total delta=1e-05" in line  # the default accountant, its delta stated
    eps = [float(e) for _, _, e in points]
    falls = all(b < a for a, b in zip(eps, eps[1:]))
    assert f"epsilon falls at every step up in p: {'yes' if falls else 'no'}" in line  # true of the points shown
