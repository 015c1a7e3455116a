"""``otafl run`` with train.aggregation = 'digital': bad input is one line and exit 2; a run's summary."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from otafl.cli.main import cli

SMALL = ["--set", "data.users=20", "--set", "train.rounds=3", "--set", "train.eval_every=3", "--set",
         "data.batch_size=8"]


@pytest.mark.parametrize("setting,needle", [
    ("digital.mechanism='pbn'", "'pbn'"),
    ("digital.mechanism='dgg'", "'dgg'"),
    ("digital.bits=4", "digital.bits = 4"),          # pbm with 20 users needs 2^bits > 20
    ("digital.theta=0.5", "digital.theta = 0.5"),
    ("digital.access='cdma'", "'cdma'"),
    ("digital.scale='fine'", "digital.scale = 'fine'"),
    ("digital.typo=1", "digital.typo"),
    ("digital.bits=2.5", "digital.bits = 2.5"),
])
def test_bad_digital_input_is_one_line_and_exit_2(tmp_path, setting, needle):
    res = CliRunner().invoke(cli, ["run", "experiments/quickstart.toml", "--out", str(tmp_path / "o"), *SMALL,
                                   "--set", "train.aggregation='digital'", "--set", "digital.mechanism='pbm'",
                                   "--set", setting])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("mechanism", ["gaussian", "skellam", "ddg", "pbm"])
def test_a_digital_run_reports_accuracy_cost_and_its_mechanism_privacy(tmp_path, mechanism):
    out = tmp_path / mechanism
    res = CliRunner().invoke(cli, ["run", "experiments/quickstart.toml", "--quiet", "--out", str(out), *SMALL,
                                   "--set", "train.aggregation='digital'", "--set", f"digital.mechanism='{mechanism}'",
                                   "--set", "privacy.accountants=['digital']"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    for key in ("final_test_accuracy", "channel_uses_per_round", "energy_per_round", "outages_per_round",
                "digital_epsilon_central_total", "digital_epsilon_local_total", "bits_per_round"):
        assert key in s, key
    assert s["digital_mechanism"] == mechanism and s["channel_uses_per_round"] > s["dim"]
    assert "digital:" in res.output and "uplink:" in res.output
    assert not any(k.startswith(("tight_", "exact_", "paper_")) for k in s)  # participation is revealed
    header = (out / "rounds.csv").read_text().splitlines()[0].split(",")
    assert {"channel_uses", "energy", "outages", "bits", "overflow"} <= set(header)


def test_the_over_the_air_run_reports_d_channel_uses_per_round(tmp_path):
    res = CliRunner().invoke(cli, ["run", "experiments/quickstart.toml", "--quiet", "--out", str(tmp_path), *SMALL])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["channel_uses_per_round"] == s["dim"] == 7850
    assert 0 < s["energy_per_round"] and s["outages_per_round"] == 0


def test_a_digital_run_without_listed_accountants_is_accounted_by_digital_alone(tmp_path):
    spec = tmp_path / "digital.toml"
    spec.write_text('[data]\nname = "synthetic"\nusers = 6\n[train]\nrounds = 2\neval_every = 2\n'
                    'aggregation = "digital"\n[digital]\nmechanism = "gaussian"\n')
    res = CliRunner().invoke(cli, ["run", str(spec), "--quiet", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "digital_epsilon_central_total" in s and not any(k.startswith("exact_") for k in s)


@pytest.mark.parametrize("accountant", ["exact", "tight", "paper"])
def test_an_over_the_air_accountant_on_a_digital_run_is_refused_naming_the_aggregation(tmp_path, accountant):
    res = CliRunner().invoke(cli, ["run", "experiments/quickstart.toml", "--out", str(tmp_path / "o"), *SMALL,
                                   "--set", "train.aggregation='digital'",
                                   "--set", f"privacy.accountants=['digital', '{accountant}']"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: privacy.accountants"), res.output
    assert "train.aggregation = 'digital'" in lines[0] and accountant in lines[0]
    assert not (tmp_path / "o").exists()
