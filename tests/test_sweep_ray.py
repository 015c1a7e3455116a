"""`otafl sweep --executor ray`: tiny synthetic sweeps on a local Ray instance.

The Ray tests (marked slow: starting Ray takes 10-20 s) are skipped when ray is not
installed (``pip install -e ".[ray]"``). Each one runs Ray in a temporary directory of its
own (``RAY_TMPDIR``) and tags every process it starts with an environment variable, so it
can check in /proc that no Ray process (``raylet``, ``gcs_server``, workers) outlives it,
and kill any straggler by pid.
"""

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
from procs import interruptible

from otafl.cli.main import cli
from sweep_helpers import invoke, rows
from otafl.sweep.executor import DEFAULT_EXECUTOR, EXECUTORS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "OTAFL_TEST_RAY"  # environment variable carried by every process a test's Ray starts
ROUNDS = 3
SPEC = f"""
[data]
name = "synthetic"
users = 6
[train]
rounds = {ROUNDS}
eval_every = 3
[sweep]
seeds = [0]
[sweep.axes]
"sampling.p" = [0.4, 0.6, 0.9]
"""
LONG_SPEC = SPEC.replace(f"rounds = {ROUNDS}", "rounds = 400").replace("users = 6", "users = 20")  # to interrupt


def write_spec(tmp_path, text=SPEC):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return str(path)


def statuses(db):
    try:
        return dict(rows(db, "SELECT status, COUNT(*) FROM runs GROUP BY status"))
    except sqlite3.OperationalError:  # not created yet
        return {}


# --------------------------------------------------------------------------- without Ray

def test_the_executor_choices_are_the_registry():
    opt = next(p for p in cli.commands["sweep"].params if p.name == "executor")
    assert list(opt.type.choices) == list(EXECUTORS) and {"process", "ray"} <= set(EXECUTORS)
    assert opt.default == DEFAULT_EXECUTOR == "process"


def test_without_ray_the_ray_executor_exits_2_with_the_install_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    db = tmp_path / "r.sqlite"
    res = invoke(write_spec(tmp_path), "--out", str(db), "--executor", "ray")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert 'pip install -e ".[ray]"' in res.stderr
    assert not db.exists()


@pytest.mark.parametrize("args, needle", [
    (["--address", "auto"], "--address auto is for --executor ray"),
    (["--executor", "ray", "--workers", "0"], "--workers 0"),
])
def test_options_that_do_not_fit_the_executor_exit_2_before_writing(tmp_path, args, needle):
    db = tmp_path / "r.sqlite"
    res = invoke(write_spec(tmp_path), "--out", str(db), *args)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and needle in res.stderr, res.output
    assert not db.exists()


# --------------------------------------------------------------------------- on a local Ray instance

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def tagged_processes(tag):
    """{pid: command} of live processes (zombies excluded) started with ``MARK=tag``, but this one."""
    found = {}
    needle = f"{MARK}={tag}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
            if stat[stat.rindex(")") + 2] in "ZX":
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                found[int(name)] = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def assert_all_gone(tag, within_s=15.0):
    """Wait for every process tagged ``tag`` to end; kill stragglers (by pid) and fail if any."""
    deadline = time.monotonic() + within_s
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    assert left == {}, f"Ray processes outlived the test: {left}"


@pytest.fixture
def ray_env(monkeypatch):
    """Environment for a test's own Ray: a private temp dir, the tag, otafl importable, no usage stats."""
    pytest.importorskip("ray", reason='ray is not installed (pip install -e ".[ray]")')
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs Linux /proc to check that no Ray process outlives the test")
    tag = uuid.uuid4().hex
    tmp = tempfile.mkdtemp(prefix="otr-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {MARK: tag, "RAY_TMPDIR": tmp, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        yield tag, dict(os.environ)
        assert_all_gone(tag)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def local_ray(ray_env):
    """A local Ray instance in this process (2 CPUs), shut down after the test."""
    import ray

    tag, _ = ray_env
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        names = " ".join(tagged_processes(tag).values())
        assert "raylet" in names and "gcs_server" in names  # what the leftover check looks for
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_ray_sweep_stores_every_point_and_resume_reruns_only_the_interrupted_ones(tmp_path, local_ray):
    spec, db = write_spec(tmp_path), str(tmp_path / "r.sqlite")
    res = invoke(spec, "--out", db, "--executor", "ray", "--workers", "2")
    assert res.exit_code == 0, res.output
    assert "3 runs done, 0 skipped" in res.stdout and "3 of 3 grid points done" in res.stdout
    assert rows(db, "SELECT id, status FROM runs ORDER BY id") == [(1, "done"), (2, "done"), (3, "done")]
    assert rows(db, "SELECT COUNT(*), COUNT(DISTINCT run_id) FROM rounds") == [(3 * ROUNDS, 3)]
    assert local_ray.is_initialized()  # the caller's Ray is used and left running

    conn = sqlite3.connect(db)  # as a killed sweep leaves it: two runs in flight
    conn.execute("UPDATE runs SET status = 'running' WHERE id IN (1, 3)")
    conn.commit()
    conn.close()
    res = invoke(spec, "--out", db, "--executor", "ray", "--resume")  # --workers: the cluster's 2 CPUs
    assert res.exit_code == 0, res.output
    assert "2 runs done, 1 skipped (already done), 0 failed" in res.stdout
    assert rows(db, "SELECT id, status FROM runs ORDER BY id") == [(1, "done"), (2, "done"), (3, "done")]
    assert rows(db, "SELECT COUNT(*), COUNT(DISTINCT run_id) FROM rounds") == [(3 * ROUNDS, 3)]


def start_ray_sweep(tmp_path, env):
    """A real `otafl sweep --executor ray` process (it starts its own local Ray) in a new session."""
    spec, db = write_spec(tmp_path, LONG_SPEC), str(tmp_path / "r.sqlite")
    proc = subprocess.Popen([sys.executable, "-m", "otafl", "sweep", spec, "--out", db, "--quiet",
                             "--executor", "ray", "--workers", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # two runs submitted and a task computing
        computing = "ray::_ray_task" in " ".join(tagged_processes(env[MARK]).values())
        if computing and statuses(db).get("running", 0) >= 2:
            return proc, spec, db
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the ray sweep did not get going: {proc.communicate()[1].decode()[-2000:]}")


def stop(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.slow
def test_a_double_ctrl_c_cancels_the_ray_tasks_with_one_line_and_exit_130(tmp_path, ray_env):
    tag, env = ray_env
    proc, spec, db = start_ray_sweep(tmp_path, env)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
        err = err.decode()
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert err.splitlines() == [f"error: interrupted; finished runs are in {db}, rerun with --resume"]
        assert_all_gone(tag, within_s=10)  # the sweep's own Ray instance ended with it
    finally:
        stop(proc)
    assert set(statuses(db)) <= {"done", "running"} and statuses(db).get("running", 0) >= 1


@pytest.mark.slow
def test_sigkill_of_the_driver_takes_its_local_ray_instance_down(tmp_path, ray_env):
    tag, env = ray_env
    proc, _, db = start_ray_sweep(tmp_path, env)
    try:
        names = " ".join(tagged_processes(tag).values())
        assert "raylet" in names and "gcs_server" in names
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: Ray's processes must follow by themselves
        proc.wait(timeout=30)
        proc.communicate(timeout=10)  # nothing of Ray's holds the driver's pipes open
        # Ray's agents too (not fate-shared; alone they would wait out a 60 s timeout): the guard ends them
        assert_all_gone(tag, within_s=10)
    finally:
        stop(proc)
    assert set(statuses(db)) <= {"done", "running"}
