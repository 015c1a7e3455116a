"""``otafl scaling`` through click's CliRunner."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from otafl.cli.main import cli


def run(*args):
    return CliRunner().invoke(cli, ["scaling", "--device", "cpu", *args])


def test_prints_fitted_slopes_near_theory_and_writes_the_figure(tmp_path):
    out = tmp_path / "scaling.png"
    res = run("--sigma2", "10", "--out", str(out))
    assert res.exit_code == 0, res.output
    slopes = [float(s) for s in re.findall(r"fitted slope ([+-][0-9.]+)", res.output)]
    assert len(slopes) == 2
    assert slopes[0] == pytest.approx(-0.5, abs=0.05) and slopes[1] == pytest.approx(-0.75, abs=0.05)
    assert out.is_file() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_rows_and_slopes(tmp_path):
    res = run("--k-min", "100", "--k-max", "10000", "--points", "9", "--accountant", "paper,tight", "--no-plot",
              "--format", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["rows"]) == 2 * 2 * 9 and out["meta"]["figure"] is None
    assert set(out["meta"]["slopes"]) == {"paper", "tight"}
    paper_fixed = [r["epsilon_central"] for r in out["rows"] if r["accountant"] == "paper" and r["scheme"] == "fixed_p"]
    assert all(b < a for a, b in zip(paper_fixed, paper_fixed[1:]))  # falls with K
    sqrt_rows = [r for r in out["rows"] if r["scheme"] == "sqrt_p"]
    assert all(r["p"] == pytest.approx(5.0 / r["users"] ** 0.5) for r in sqrt_rows)


def test_csv_has_one_line_per_k_and_scheme():
    res = run("--points", "5", "--no-plot", "--format", "csv")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "users,accountant,scheme,p,epsilon_central" and len(lines) == 1 + 2 * 5


@pytest.mark.parametrize("args,needle", [
    (["--a", "20"], "a = 20.0"),
    (["--p", "0"], "p = 0.0"),
    (["--k-min", "0"], "k_min"),
    (["--accountant", "magic"], "magic"),
    (["--delta-l", "2"], "delta_l"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    res = run(*args, "--no-plot")
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and needle in res.stderr and "Traceback" not in res.output
