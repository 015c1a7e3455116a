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
    lines = res.output.splitlines()
    assert lines[1].split() == ["accountant", "scheme", "fitted_slope", "theory_slope", "finite_points"]
    fits = [re.match(r"\s*paper\s+(fixed p = 0\.5|p = 5 K\^-1/2)\s+(\S+)\s+(\S+)\s+41$", line) for line in lines[2:4]]
    assert all(fits), res.output
    slopes = [float(m.group(2)) for m in fits]
    assert slopes[0] == pytest.approx(-0.5, abs=0.05) and slopes[1] == pytest.approx(-0.75, abs=0.05)
    assert [float(m.group(3)) for m in fits] == [-0.5, -0.75]
    assert lines[-1] == f"figure -> {out}"
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
    assert "curves" not in out and out["meta"]["non_finite"].startswith("JSON writes non-finite numbers")


def test_json_writes_undefined_points_as_the_string_inf():
    # K = 2, p = 0.1: delta' = auto = 2 exp(-2 mu^2/K) + 1e-5 > 1, so the central bound is undefined (+inf)
    res = run("--k-min", "2", "--k-max", "100", "--points", "5", "--p", "0.1", "--a", "1", "--no-plot",
              "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["rows"]
    assert rows[0]["users"] == 2 and rows[0]["epsilon_central"] == "inf"


def test_csv_has_one_line_per_k_and_scheme():
    res = run("--points", "5", "--no-plot", "--format", "csv")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "users,accountant,scheme,p,epsilon_central" and len(lines) == 1 + 2 * 5


def test_table_has_one_slope_row_per_accountant_and_scheme():
    res = run("--k-min", "100", "--k-max", "400", "--points", "5", "--exact-points", "3",
              "--accountant", "paper,tight,exact")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    header = ["accountant", "scheme", "fitted_slope", "theory_slope", "finite_points"]
    assert lines[1].split() == header
    end = next(i for i in range(2, len(lines)) if lines[i].split()[0] == "accountant")
    assert [line.split()[0] for line in lines[2:end]] == ["paper", "paper", "tight", "tight", "exact", "exact"]
    schemes = [re.search(r"(fixed p = 0\.5|p = 5 K\^-1/2)", line).group(1) for line in lines[2:end]]
    assert schemes == ["fixed p = 0.5", "p = 5 K^-1/2"] * 3
    points = [int(line.split()[-1]) for line in lines[2:end]]
    assert points == [5, 5, 5, 5, 3, 3]
    assert all(float(line.split()[-3]) < 0 for line in lines[2:end])
    # the half-range table: again one row per accountant and scheme
    assert lines[end].split()[2:] == ["K_lower_half", "slope_lower", "K_upper_half", "slope_upper"]
    assert [line.split()[0] for line in lines[end + 1:end + 7]] == ["paper", "paper", "tight", "tight", "exact",
                                                                    "exact"]
    assert lines[-1].startswith("d = 7850, N0 = 1, SNR = 10 dB") and lines[-1].endswith("exact 3")


def test_without_out_no_file_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run("--points", "5")
    assert res.exit_code == 0, res.output
    assert list(tmp_path.rglob("*")) == [] and "figure ->" not in res.output
    assert res.stderr == ""  # no progress bar: stderr is not a terminal


def test_quiet_and_no_plot_with_out_write_nothing(tmp_path):
    out = tmp_path / "f.png"
    res = run("--points", "5", "--out", str(out), "--no-plot", "--quiet")
    assert res.exit_code == 0 and res.stderr == "" and not out.exists()


def test_empty_accountant_exits_2_with_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run("--accountant", "")
    assert res.exit_code == 2 and res.stderr == "error: no accountant given\n" and res.stdout == ""
    assert list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize("args,needle", [
    (["--a", "20"], "a = 20.0"),
    (["--p", "0"], "p = 0.0"),
    (["--k-min", "0"], "k_min"),
    (["--accountant", "magic"], "magic"),
    (["--accountant", ""], "no accountant given"),
    (["--accountant", ","], "no accountant given"),
    (["--delta-l", "2"], "delta_l"),
    (["--k-max", "50"], "k_max"),
    (["--points", "1"], "points"),
    (["--exact-points", "1"], "exact_points"),
    (["--dim", "0"], "dim"),
    (["--n0", "-1"], "n0"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    res = run(*args, "--no-plot")
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and needle in res.stderr and "Traceback" not in res.output


@pytest.mark.parametrize("command", ["bound", "audit", "scaling", "plot-accountants"])
def test_every_option_has_help_text(command):
    import click

    options = [p for p in cli.commands[command].params if isinstance(p, click.Option)]
    assert options and all(p.help for p in options), [p.name for p in options if not p.help]
