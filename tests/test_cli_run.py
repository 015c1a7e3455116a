"""`otafl run` through click's CliRunner."""

import csv
import os
import json

import pytest
from click.testing import CliRunner

from otafl.cli.main import cli

FAST = ["--set", "data.name=synthetic", "--set", "data.users=12", "--set", "train.rounds=6",
        "--set", "train.eval_every=3", "--set", "channel.snr_db=10", "--quiet",
        "--set", "privacy.accountants=['paper','tight']"]


def test_run_uses_the_exact_accountant_by_default_with_pld_totals(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["run", *FAST[:-2], "--out", str(out)])  # FAST without its accountants
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exact_composition"] == "pld" and 0 < summary["exact_epsilon_central_total"] < float("inf")
    assert "paper_epsilon_central" not in summary


def test_run_writes_summary_and_one_csv_row_per_round(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(out), "--seed", "7"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    for key in ("final_test_accuracy", "rounds", "users", "mean_participants", "scheme", "seed",
                "wall_seconds", "paper_epsilon_central", "tight_epsilon_local_max",
                "paper_epsilon_central_total", "paper_delta_central_total"):
        assert key in summary, key
    assert summary["rounds"] == 6 and summary["users"] == 12 and summary["seed"] == 7
    rows = list(csv.DictReader((out / "rounds.csv").open()))
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert "paper_epsilon_central" in rows[0]
    assert "final test accuracy" in res.output


def test_run_same_seed_same_files(tmp_path):
    for name in ("a", "b"):
        res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(tmp_path / name), "--seed", "1"])
        assert res.exit_code == 0, res.output
    assert (tmp_path / "a" / "rounds.csv").read_text() == (tmp_path / "b" / "rounds.csv").read_text()
    sa = json.loads((tmp_path / "a" / "summary.json").read_text())
    sb = json.loads((tmp_path / "b" / "summary.json").read_text())
    sa.pop("wall_seconds"), sb.pop("wall_seconds")
    assert sa == sb


@pytest.mark.parametrize("override, needle", [
    ("sampling.p=0", "sampling.p = 0"),
    ("sampling.p=1.5", "(0, 1]"),
    ("transmit.sigma2=-0.1", "transmit.sigma2 = -0.1"),
    ("channel.n0=-1", "channel.n0 = -1"),
    ("data.users=0", "data.users = 0"),
    ("sampling.scheme='sometimes'", "sampling.scheme = 'sometimes'"),
    ("estimator.kind='psychic'", "estimator.kind"),
    ("train.aggregation='carrier-pigeon'", "train.aggregation"),
    ("data.nonsense=3", "unknown key data.nonsense"),
])
def test_bad_values_exit_2_with_one_line_and_write_nothing(tmp_path, override, needle):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", *FAST, "--set", override, "--out", str(out)])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert needle in lines[0] and "Traceback" not in res.output
    assert not out.exists()


def test_malformed_toml_exits_2(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text("[sampling\np = 0.5\n")
    res = CliRunner().invoke(cli, ["run", str(spec), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "malformed TOML" in res.output
    assert not (tmp_path / "o").exists()


def test_missing_data_directory_exits_2(tmp_path):
    res = CliRunner().invoke(cli, ["run", *FAST, "--set", "data.name=mnist", "--set",
                                   f"data.dir='{tmp_path / 'nowhere'}'", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "nowhere" in res.output and res.output.strip().count("\n") == 0
    assert not (tmp_path / "o").exists()


def test_missing_spec_file_and_unknown_preset_exit_2(tmp_path):
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "none.toml")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = CliRunner().invoke(cli, ["run", *FAST, "--set", "channel.preset='mars-orbit'"])
    assert res.exit_code == 2 and "mars-orbit" in res.output


# --------------------------------------------------------------------------- the output folder

def one_line_error(res):
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    return lines[0]


def test_an_earlier_runs_folder_is_refused_without_overwrite_and_replaced_with_it(tmp_path):
    out = tmp_path / "run"
    assert CliRunner().invoke(cli, ["run", *FAST, "--out", str(out), "--seed", "1"]).exit_code == 0
    first = (out / "summary.json").read_text()
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(out), "--seed", "2"])
    assert res.exit_code == 2
    line = one_line_error(res)
    assert str(out) in line and "not empty" in line and "--overwrite" in line
    assert (out / "summary.json").read_text() == first  # untouched
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(out), "--seed", "2", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["seed"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["rounds.csv", "summary.json"]  # no temporary files


def test_a_folder_with_someone_elses_files_is_refused_too(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(tmp_path)])
    assert res.exit_code == 2 and "notes.txt" in one_line_error(res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_empty_out_exits_2_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", ""])
    assert res.exit_code == 2 and "--out is empty" in one_line_error(res)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where, reason", [
    ("under-a-file", "is a file, not a folder"),
    ("proc", "No such file or directory"),
])
def test_an_impossible_out_path_exits_2_naming_it_before_training(tmp_path, monkeypatch, where, reason):
    import otafl.fl.loop

    monkeypatch.setattr(otafl.fl.loop, "run_experiment", lambda *a, **k: pytest.fail("trained anyway"))
    (tmp_path / "somefile").write_text("x")
    out = {"under-a-file": tmp_path / "somefile" / "sub" / "run", "proc": "/proc/otafl-no-such-folder/run"}[where]
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(out)])
    assert res.exit_code == 2
    line = one_line_error(res)
    assert str(out) in line and reason in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["somefile"] and (tmp_path / "somefile").read_text() == "x"


def test_an_unwritable_out_folder_exits_2_and_leaves_no_folder_behind(tmp_path, monkeypatch):
    """A read-only folder (root ignores permission bits, so the refusal is simulated)."""
    import otafl.fl.loop
    import otafl.results

    def read_only(*a, dir=None, **k):
        raise PermissionError(13, "Permission denied", dir)

    monkeypatch.setattr(otafl.fl.loop, "run_experiment", lambda *a, **k: pytest.fail("trained anyway"))
    monkeypatch.setattr(otafl.results.tempfile, "mkstemp", read_only)
    out = tmp_path / "a" / "b"
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(out)])
    assert res.exit_code == 2
    line = one_line_error(res)
    assert str(out) in line and "Permission denied" in line
    assert list(tmp_path.iterdir()) == []  # the folders it created are gone again


@pytest.mark.parametrize("earlier_run", [False, True])
def test_a_failed_final_write_leaves_no_partial_results(tmp_path, monkeypatch, earlier_run):
    import otafl.results

    out = tmp_path / "run"
    if earlier_run:
        assert CliRunner().invoke(cli, ["run", *FAST, "--out", str(out), "--seed", "1"]).exit_code == 0
    before = {p.name: p.read_text() for p in out.iterdir()} if earlier_run else None
    real_replace = os.replace

    def disk_full(src, dst, *a, **k):  # rounds.csv is replaced, then summary.json fails
        if os.path.basename(dst) == "summary.json":
            raise OSError(28, "No space left on device")
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(otafl.results.os, "replace", disk_full)
    res = CliRunner().invoke(cli, ["run", *FAST, "--out", str(out), "--seed", "2", "--overwrite"])
    assert res.exit_code == 2
    line = one_line_error(res)
    assert str(out) in line and "No space left on device" in line
    if earlier_run:  # the earlier run's pair, exactly, and nothing else
        assert {p.name: p.read_text() for p in out.iterdir()} == before
    else:
        assert not out.exists()
