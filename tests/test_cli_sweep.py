"""`otafl sweep` end to end: tiny synthetic sweeps through CliRunner and a real subprocess."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from otafl.cli.main import cli

ROUNDS = 4
SPEC = f"""
[data]
name = "synthetic"
users = 8
[channel]
snr_db = 10.0
[train]
rounds = {ROUNDS}
eval_every = 2
[sweep]
seeds = [0, 1]
[sweep.axes]
"sampling.p" = [0.4, 0.9]
"""


def write_spec(tmp_path, text=SPEC, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def invoke(*args):
    return CliRunner().invoke(cli, ["sweep", *args, "--quiet"])


def rows(db, sql):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_sweep_stores_every_grid_point_done_with_its_rounds(tmp_path):
    db = str(tmp_path / "r.sqlite")
    res = invoke(write_spec(tmp_path), "--out", db, "--workers", "0")
    assert res.exit_code == 0, res.output
    assert "4 runs done, 0 skipped" in res.stdout
    runs = rows(db, "SELECT id, status, params, final_test_accuracy, paper_epsilon_central, "
                    "tight_epsilon_central_total, mean_participants FROM runs ORDER BY id")
    assert [r[1] for r in runs] == ["done"] * 4
    params = [json.loads(r[2]) for r in runs]
    assert [(p["sampling"]["p"], p["train"]["seed"]) for p in params] == [(0.4, 0), (0.4, 1), (0.9, 0), (0.9, 1)]
    assert all(0.0 <= r[3] <= 1.0 and r[4] > 0 and r[5] > 0 and 0 <= r[6] <= 8 for r in runs)
    per_run = rows(db, "SELECT run_id, COUNT(*), MIN(round), MAX(round) FROM rounds GROUP BY run_id")
    assert sorted(per_run) == [(r[0], ROUNDS, 1, ROUNDS) for r in runs]


def test_existing_results_need_resume_and_resume_skips_done_runs(tmp_path):
    spec, db = write_spec(tmp_path), str(tmp_path / "r.sqlite")
    assert invoke(spec, "--out", db, "--workers", "0").exit_code == 0
    res = invoke(spec, "--out", db, "--workers", "0")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and "--resume" in res.stderr
    res = invoke(spec, "--out", db, "--workers", "0", "--resume")
    assert res.exit_code == 0, res.output
    assert "0 runs done, 4 skipped" in res.stdout
    assert rows(db, "SELECT COUNT(*) FROM runs") == [(4,)]


def test_bounds_only_sweep_stores_no_accuracy_but_all_bounds(tmp_path):
    db = str(tmp_path / "r.sqlite")
    res = invoke(write_spec(tmp_path), "--out", db, "--workers", "0", "--set", "sweep.train=false",
                 "--set", "sweep.seeds=[3]")
    assert res.exit_code == 0, res.output
    got = rows(db, "SELECT train, final_test_accuracy, paper_epsilon_central FROM runs")
    assert len(got) == 2 and all(t == 0 and acc is None and eps > 0 for t, acc, eps in got)


def test_a_failing_run_is_recorded_the_others_finish_and_resume_retries_it(tmp_path):
    text = SPEC + '\n[[sweep.points]]\n"data.users" = 4500\n'  # valid spec; too few samples at run time
    spec, db = write_spec(tmp_path, text), str(tmp_path / "r.sqlite")
    res = invoke(spec, "--out", db, "--workers", "0")
    assert res.exit_code == 1
    assert "2 run(s) failed" in res.stderr and "data.users = 4500" in res.stderr
    assert sorted(rows(db, "SELECT status, COUNT(*) FROM runs GROUP BY status")) == [("done", 4), ("failed", 2)]
    res = invoke(spec, "--out", db, "--workers", "0", "--resume")
    assert res.exit_code == 1 and "0 runs done, 4 skipped (already done), 2 failed" in res.stdout


@pytest.mark.parametrize("axes, needle", [
    ('"sampling.pp" = [0.5]', "unknown key 'pp'"),
    ('"sampling.p" = []', "is empty"),
    ('"sampling.p" = ["many"]', "must be a number"),
    ('"transmit.clip" = [1.0, -2.0]', "transmit.clip"),
])
def test_bad_grids_exit_2_with_one_line_before_running_anything(tmp_path, axes, needle):
    text = SPEC.replace('"sampling.p" = [0.4, 0.9]', axes)
    db = tmp_path / "r.sqlite"
    res = invoke(write_spec(tmp_path, text), "--out", str(db), "--workers", "0")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and needle in res.stderr
    assert not db.exists()


def test_a_results_file_that_is_not_ours_exits_2(tmp_path):
    other = tmp_path / "notes.sqlite"
    other.write_text("my notes\n")
    res = invoke(write_spec(tmp_path), "--out", str(other), "--workers", "0", "--resume")
    assert res.exit_code == 2 and "not an otafl results file" in res.stderr
    assert other.read_text() == "my notes\n"


def test_dry_run_lists_the_points_and_writes_nothing(tmp_path):
    res = invoke(write_spec(tmp_path), "--out", str(tmp_path / "r.sqlite"), "--dry-run")
    assert res.exit_code == 0, res.output
    assert "4 runs (trained)" in res.stdout and 'sampling.p=0.9, train.seed=1' in res.stdout
    assert not (tmp_path / "r.sqlite").exists()


def test_sigkill_mid_sweep_then_resume_leaves_every_point_done_exactly_once(tmp_path):
    """A real `otafl sweep` process with one worker process is SIGKILLed (with its worker)
    once its first run is committed and the next one is running; `--resume` then finishes
    the grid."""
    spec, db = write_spec(tmp_path), str(tmp_path / "r.sqlite")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from otafl.cli.main import cli; cli()", "sweep", spec,
                             "--out", db, "--workers", "1", "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    done_at_kill = 0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(db):
                try:
                    status = dict(rows(db, "SELECT status, COUNT(*) FROM runs GROUP BY status"))
                except sqlite3.OperationalError:  # schema not created yet
                    status = {}
                done_at_kill = status.get("done", 0)
                # kill mid-run: one run committed and the next one already marked running
                if done_at_kill >= 1 and status.get("running", 0) >= 1:
                    break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its worker: the group we started
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    assert 1 <= done_at_kill < 4
    statuses = dict(rows(db, "SELECT status, COUNT(*) FROM runs GROUP BY status"))
    assert statuses.get("done", 0) < 4 and statuses.get("running", 0) >= 1

    res = invoke(spec, "--out", db, "--workers", "0", "--resume")
    assert res.exit_code == 0, res.output
    got = rows(db, "SELECT params, status FROM runs")
    assert len(got) == 4 and {s for _, s in got} == {"done"} and len({p for p, _ in got}) == 4
    assert rows(db, "SELECT COUNT(*), COUNT(DISTINCT run_id) FROM rounds") == [(4 * ROUNDS, 4)]
