"""`otafl sweep` end to end: tiny synthetic sweeps through CliRunner and a real subprocess."""

import contextlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from procs import interruptible

from sweep_helpers import invoke, rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
[privacy]
accountants = ["paper", "tight"]
[sweep]
seeds = [0, 1]
[sweep.axes]
"sampling.p" = [0.4, 0.9]
"""


def write_spec(tmp_path, text=SPEC, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


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


# --------------------------------------------------------------------------- resume: one sweep per file

@pytest.mark.parametrize("change, needle", [
    (["--set", "train.rounds=3"], f"train.rounds: {ROUNDS} in the store, 3 now"),
    (["--set", "sweep.seeds=[0,1,2]"], "sweep.seeds: [0, 1] in the store, [0, 1, 2] now"),
    (["--set", 'sweep.axes={"sampling.p"=[0.4,0.5]}'],
     "sweep.axes.sampling.p: [0.4, 0.9] in the store, [0.4, 0.5] now"),
    ("other spec file", "channel.snr_db: 10.0 in the store, 20.0 now"),
])
def test_resume_with_a_different_sweep_exits_2_naming_the_first_differing_key(tmp_path, change, needle):
    spec, db = write_spec(tmp_path), str(tmp_path / "r.sqlite")
    assert invoke(spec, "--out", db, "--workers", "0").exit_code == 0
    before = rows(db, "SELECT id, params, status FROM runs ORDER BY id")
    if change == "other spec file":
        spec, change = write_spec(tmp_path, SPEC.replace("snr_db = 10.0", "snr_db = 20.0"), "other.toml"), []
    res = invoke(spec, *change, "--out", db, "--workers", "0", "--resume")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "holds a different sweep" in res.stderr and needle in res.stderr, res.stderr
    assert rows(db, "SELECT id, params, status FROM runs ORDER BY id") == before  # nothing appended or changed


def test_resume_reruns_interrupted_runs_in_place_and_counts_at_most_the_grid(tmp_path):
    spec, db = write_spec(tmp_path), str(tmp_path / "r.sqlite")
    assert invoke(spec, "--out", db, "--workers", "0").exit_code == 0
    conn = sqlite3.connect(db)  # as a killed sweep leaves it: two runs in flight
    conn.execute("UPDATE runs SET status = 'running' WHERE id IN (2, 3)")
    conn.commit()
    conn.close()
    res = invoke(spec, "--out", db, "--workers", "0", "--resume")
    assert res.exit_code == 0, res.output
    assert "2 runs done, 2 skipped (already done), 0 failed" in res.stdout and "4 of 4 grid points done" in res.stdout
    assert rows(db, "SELECT id, status FROM runs ORDER BY id") == [(1, "done"), (2, "done"), (3, "done"), (4, "done")]
    assert rows(db, "SELECT COUNT(*), COUNT(DISTINCT run_id) FROM rounds") == [(4 * ROUNDS, 4)]


# --------------------------------------------------------------------------- grid size

def test_dry_run_of_a_ten_million_point_grid_is_refused_at_once_with_the_count_and_the_limit(tmp_path):
    axes = ", ".join(f'"{k}" = {list(range(1, 11))}' for k in
                     ("transmit.clip", "transmit.sigma2", "channel.snr_db", "data.batch_size", "train.rounds",
                      "model.hidden", "train.eval_every"))
    text = SPEC.split("[sweep]")[0] + f"[sweep]\nseeds = [0]\naxes = {{ {axes} }}\n"
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    cap = 3 << 30  # a regression (building 10^7 points) fails fast here instead of eating the machine's memory
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "otafl", "sweep", write_spec(tmp_path, text), "--dry-run"],
                         env=env, capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    assert time.monotonic() - t0 < 20, "took long: the grid was built"
    assert res.returncode == 2 and res.stdout == "", res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and "10000000 points" in res.stderr, res.stderr
    assert "over the limit of 100000 points" in res.stderr and "--max-points 10000000" in res.stderr


def test_max_points_limits_the_grid_and_can_be_raised(tmp_path):
    spec, db = write_spec(tmp_path), tmp_path / "r.sqlite"
    res = invoke(spec, "--out", str(db), "--max-points", "3")
    assert res.exit_code == 2 and "has 4 points" in res.stderr and "limit of 3 points" in res.stderr
    assert not db.exists()
    res = invoke(spec, "--dry-run", "--max-points", "4")
    assert res.exit_code == 0 and "4 runs (trained)" in res.stdout


# --------------------------------------------------------------------------- real processes: kill -9, Ctrl-C

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
SLOW_SPEC = SPEC.replace(f"rounds = {ROUNDS}", "rounds = 60").replace("users = 8", "users = 20")  # 4 runs, ~1 s each


def proc_stat(pid):
    """(state, ppid, start time) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def descendants(pid):
    """{pid: start time} of every process below ``pid`` (workers and the resource tracker)."""
    parent_of = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := proc_stat(int(name))) is not None:
            parent_of[int(name)] = st
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for child, (_, ppid, start) in parent_of.items():
            if ppid == p and child not in found:
                found[child] = start
                todo.append(child)
    return found


def still_alive(procs):
    """The processes of ``procs`` ({pid: start time}) that still run (zombies count as gone)."""
    return [p for p, start in procs.items() if (st := proc_stat(p)) and st[2] == start and st[0] not in "ZX"]


def start_sweep_process(tmp_path, *args):
    spec, db = write_spec(tmp_path, SLOW_SPEC), str(tmp_path / "r.sqlite")
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "otafl", "sweep", spec, "--out", db, "--quiet", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=interruptible)
    return proc, spec, db


def wait_until_running(proc, db, n_running, n_children):
    """Wait until ``n_running`` runs are in flight and the sweep has ``n_children`` descendants."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            running = rows(db, "SELECT COUNT(*) FROM runs WHERE status = 'running'")[0][0]
        except sqlite3.OperationalError:  # not created yet
            running = 0
        kids = descendants(proc.pid)
        if running >= n_running and len(kids) >= n_children:
            return kids
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the sweep did not get going: {proc.communicate()[1].decode()[-2000:]}")


def cleanup(proc, kids):
    """Kill whatever a failed test left behind: the group we started, then stragglers by pid."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in still_alive(kids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


@needs_proc
def test_sigkill_of_the_sweep_process_takes_its_workers_down_within_10_s(tmp_path):
    proc, _, db = start_sweep_process(tmp_path, "--workers", "2")
    kids = {}
    try:
        kids = wait_until_running(proc, db, n_running=2, n_children=3)  # 2 workers + the resource tracker
        os.kill(proc.pid, signal.SIGKILL)  # the parent only; its workers must notice by themselves
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while still_alive(kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert still_alive(kids) == [], [open(f"/proc/{p}/cmdline").read() for p in still_alive(kids)]
        out, err = proc.communicate(timeout=10)  # the pipes close: nobody holds them open any more
        assert proc.returncode == -signal.SIGKILL
    finally:
        cleanup(proc, kids)
    assert {s for (s,) in rows(db, "SELECT status FROM runs")} <= {"done", "running"}


@needs_proc
@pytest.mark.parametrize("workers, gap", [("2", 0.01), ("0", 0.05)])
def test_a_double_ctrl_c_gives_one_line_and_exit_130_and_no_traceback(tmp_path, workers, gap):
    proc, spec, db = start_sweep_process(tmp_path, "--workers", workers)
    kids = {}
    try:
        kids = wait_until_running(proc, db, n_running=max(1, int(workers)), n_children=int(workers))
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group, workers too
        time.sleep(gap)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        err = err.decode()
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "Exception ignored" not in err and "KeyboardInterrupt" not in err, err
        assert err.splitlines() == [f"error: interrupted; finished runs are in {db}, rerun with --resume"]
        deadline = time.monotonic() + 10
        while still_alive(kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert still_alive(kids) == []
    finally:
        cleanup(proc, kids)
    if workers != "0":  # what was interrupted is resumable (once is enough: it costs the remaining runs)
        res = invoke(spec, "--out", db, "--workers", "0", "--resume")
        assert res.exit_code == 0 and "4 of 4 grid points done" in res.stdout, res.output


@needs_proc
def test_a_killed_worker_fails_its_run_and_stops_the_sweep_with_one_line(tmp_path):
    proc, spec, db = start_sweep_process(tmp_path, "--workers", "2")
    kids = {}
    try:
        kids = wait_until_running(proc, db, n_running=2, n_children=3)
        workers = [p for p in kids if "spawn_main" in open(f"/proc/{p}/cmdline").read()]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)  # as the out-of-memory killer would
        out, err = proc.communicate(timeout=60)
        err = err.decode()
        assert proc.returncode == 1, err  # a failure, not bad input (issue 32)
        assert err.count("\n") == 1 and "a worker process died unexpectedly (killed by SIGKILL" in err, err
        assert "--resume" in err and "Traceback" not in err
        deadline = time.monotonic() + 10
        while still_alive(kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert still_alive(kids) == []
    finally:
        cleanup(proc, kids)
    failed = rows(db, "SELECT error FROM runs WHERE status = 'failed'")
    assert len(failed) == 1 and "the worker process died (killed by SIGKILL" in failed[0][0]


def test_a_spec_without_a_sweep_table_is_refused_in_one_line(tmp_path):
    """otafl sweep on a plain run spec used to run it as a one-point grid, silently."""
    import subprocess
    import sys

    spec = tmp_path / "one.toml"
    spec.write_text('[data]\nname = "synthetic"\n')
    out = tmp_path / "r.sqlite"
    res = subprocess.run([sys.executable, "-m", "otafl", "sweep", str(spec), "--out", str(out)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.count("\n") == 1 and "has no [sweep] table" in res.stderr and "otafl run" in res.stderr
    assert not out.exists()
    # a --set sweep.KEY=... makes the grid explicit, as before
    res = subprocess.run([sys.executable, "-m", "otafl", "sweep", str(spec), "--dry-run",
                          "--set", 'sweep.axes={"sampling.p" = [0.1, 0.2]}'], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "2 runs" in res.stdout, res.stderr
