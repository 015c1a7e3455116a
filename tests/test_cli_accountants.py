"""``otafl plot-accountants`` through click's CliRunner (the accountants figure)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from otafl.api.curves import accountant_curves
from otafl.cli.main import cli
from otafl.report.accountants_figure import accountants_figure


def run(*args):
    return CliRunner().invoke(cli, ["plot-accountants", *args])


def test_writes_the_figure_and_prints_the_papers_preset(tmp_path):
    out = tmp_path / "acc.png"
    res = run("--out", str(out), "--p", "0.1,0.5,0.9")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["p", "paper:eps_central", "paper:delta_central", "tight:eps_central",
                                "tight:delta_central", "exact:eps_central", "exact:delta_central"]
    assert [line.split() for line in lines[1:4]] == [
        ["0.1", "1170", "0.0366#", "6.25", "0.0366#", "0.886", "1.00e-05"],  # delta above 1/K: flagged
        ["0.5", "3.13", "1.50e-05", "2.52", "1.50e-05", "1.19", "1.00e-05"],
        ["0.9", "2.45", "1.90e-05", "1.90", "1.90e-05", "1.64", "1.00e-05"]]
    assert lines[4].startswith("# delta above 1/K = 0.00500")
    assert lines[5].startswith("privacy unit: user level") and lines[6] == f"figure -> {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_and_csv(tmp_path):
    res = run("--out", str(tmp_path / "a.svg"), "--p", "0.5", "--users", "50", "--format", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["users"] == 50 and out["p"] == [0.5] and out["figure"].endswith("a.svg")
    res = run("--out", str(tmp_path / "a.png"), "--p", "0.5,1", "--format", "csv")
    lines = res.output.splitlines()
    assert lines[0] == "p,accountant,epsilon_central,delta_central" and len(lines) == 1 + 3 * 2


def test_bad_input_exits_2_with_one_line(tmp_path):
    res = run("--out", str(tmp_path / "a.png"), "--p", "0.5,1.5")
    assert res.exit_code == 2 and res.stderr.startswith("error:") and res.stderr.count("\n") == 1
    assert "p = 1.5" in res.stderr and not (tmp_path / "a.png").exists()


def test_quiet_prints_nothing_on_stderr(tmp_path):
    res = run("--out", str(tmp_path / "a.png"), "--p", "0.5", "--quiet", "--format", "csv")
    assert res.exit_code == 0, res.output
    assert res.stderr == "" and res.stdout.splitlines()[0] == "p,accountant,epsilon_central,delta_central"


def test_the_figure_legend_states_each_accountants_per_round_delta_and_rings_a_delta_above_1_over_k():
    curves = accountant_curves(p=[0.1, 0.5, 0.9])
    legend = [t.get_text() for t in accountants_figure(curves).axes[0].get_legend().get_texts()]
    assert "paper (Hoeffding, classic Gaussian), δ = 1.5e-05–0.0366" in legend  # paper's and tight's vary with p
    assert "tight (exact quantile, analytic Gaussian), δ = 1.5e-05–0.0366" in legend
    assert "exact (numerical), δ = 1e-05" in legend
    assert any(t.startswith(r"$\delta$ > 1/K = 0.005") for t in legend)
