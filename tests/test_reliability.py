"""Issue 32's reliability cases: memory, exit codes, tracebacks, messages (each as
docs/guides/failure.md promises: one ``error:`` line and the documented exit code)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from procs import interruptible
from click.testing import CliRunner

from otafl.cli.main import cli

REPO = str(Path(__file__).resolve().parents[1])


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    env.pop("OTAFL_MEMORY_LIMIT_GB", None)
    return env


def _one_line(res, code: int, needle: str = "") -> str:
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == code, (res.exit_code, res.output, res.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    assert needle in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------- 2. memory


def test_tight_and_paper_at_a_billion_users_and_tiny_p_answer_without_gigabytes():
    """delta' came out as 1 and the binomial quantile summed all 1e9 counts (8 GB, OOM after 109 s)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = CliRunner().invoke(cli, ["bound", "--quiet", "--accountant", "paper,tight", "--rounds", "3",
                                   "--users", "1000000000", "--p", "1e-9", "--format", "json"])
    assert res.exit_code == 0, res.output
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 2 * 2**20, grown_kib  # under 2 GiB more than before (measured: ~0.3 GB in all)


# --------------------------------------------------------------------------- 5. exit codes


def test_ctrl_c_of_a_command_without_its_own_handler_is_interrupted_exit_130(monkeypatch):
    import otafl.api.audit_run

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(otafl.api.audit_run, "audit_run", interrupted)
    res = CliRunner().invoke(cli, ["audit-run", str(Path(REPO) / "experiments" / "audit-ota.toml"), "--trials", "10",
                                   "--quiet"])
    assert res.exit_code == 130, (res.exit_code, res.output)
    assert res.stderr.strip().splitlines() == ["error: interrupted"], res.stderr


def test_bound_at_tiny_p_prints_no_scipy_warning():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = CliRunner().invoke(cli, ["bound", "--quiet", "--p", "1e-9", "--rounds", "3", "--accountant", "exact"])
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert [w for w in seen if issubclass(w.category, RuntimeWarning)] == []


# --------------------------------------------------------------------------- 4. tracebacks


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_full_standard_output_is_one_line_exit_2(fmt):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "otafl", "bound", "--quiet", "--users", "20", "--p", "0.5",
                               "--format", fmt], stdout=full, stderr=subprocess.PIPE, text=True, env=_env(),
                              timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["error: cannot write to standard output: No space left on device"]


def test_a_round_pld_with_a_vanishing_noise_puts_its_loss_at_infinity_not_on_a_huge_grid():
    """digital.sigma2 = 1e-30 asked for a grid of ~1e18 points ("array is too big")."""
    from otafl.privacy.analysis.distributed import MAX_PLD_POINTS, gaussian_round_pld

    pld = gaussian_round_pld(participation_prob=0.5, weights=[0.5, 0.5], noise_std=[1e-15, 1.0], sensitivity=2.0,
                             interval=1e-3)
    pmf = pld._pmf_remove
    assert len(pmf._probs) <= MAX_PLD_POINTS
    assert pmf._infinity_mass == pytest.approx(0.25, abs=1e-12)  # the vanishing-noise half of the mass p
    assert pld.get_epsilon_for_delta(0.2) == math.inf and math.isfinite(pld.get_epsilon_for_delta(0.3))


def test_a_digital_run_with_a_vanishing_noise_reports_inf_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text('[data]\nname = "synthetic"\nusers = 20\n[train]\nrounds = 2\n'
                                        'eval_every = 2\n')
    res = CliRunner().invoke(cli, ["run", "tiny.toml", "--out", "X", "--quiet", "--set", "train.aggregation='digital'",
                                   "--set", "digital.mechanism='gaussian'", "--set", "digital.sigma2=1e-30"])
    assert res.exit_code == 0, res.output
    assert "eps_central inf" in res.stdout


# --------------------------------------------------------------------------- doccheck.py


DOCCHECK = str(Path(REPO) / "tests" / "doccheck.py")


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    ("folder", "is a folder"),
    (b"PK\x03\x04\x00\x00binary", "is a binary file"),
    ("caf\u00e9\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 3)"),
], ids=["missing", "folder", "binary", "latin-1"])
def test_doccheck_refuses_what_is_no_utf8_page_in_one_line(tmp_path, content, needle):
    page = tmp_path / "page.md"
    if content == "folder":
        page.mkdir()
    elif content is not None:
        page.write_bytes(content)
    proc = subprocess.run([sys.executable, DOCCHECK, str(page)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {str(page)!r} ") and needle in lines[0], lines


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_of_doccheck_ends_its_commands_and_is_one_line_exit_130(tmp_path, jobs):
    import signal
    import time

    pages = []
    for name in ("a", "b"):
        page = tmp_path / f"{name}.md"
        page.write_text(f"```console\n$ echo $$ > {tmp_path}/{name}.pid; sleep 60\n```\n")
        pages.append(str(page))
    proc = subprocess.Popen([sys.executable, DOCCHECK, "--jobs", jobs, *pages], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    pidfiles = [tmp_path / "a.pid"] + ([tmp_path / "b.pid"] if jobs == "2" else [])
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text().strip() for p in pidfiles):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    assert err.splitlines() == ["error: interrupted; no page was rewritten"], err
    for p in pidfiles:  # the commands (each a session of its own) are gone too
        pid = int(p.read_text())
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}") or " Z " in open(f"/proc/{pid}/stat").read(), pid


# --------------------------------------------------------------------------- 6. messages and checks


SWEEP_P = """
[data]
name = "synthetic"
users = 6
[train]
rounds = 2
eval_every = 2
[privacy]
accountants = ["paper"]
[sweep]
seeds = [0]
[sweep.axes]
"sampling.p" = [0.5, 0.9]
"""


def test_a_scaling_plot_against_the_swept_p_plots_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SWEEP_P)
    res = CliRunner().invoke(cli, ["sweep", "s.toml", "--out", "s.sqlite", "--workers", "0", "--quiet"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["plot", "s.sqlite", "--kind", "scaling", "--x", "sampling.p", "--out", "f.png"])
    assert res.exit_code == 0, res.output
    assert "vs sampling.p (uniform): log-log slope" in res.stdout and "over 0.5-0.9 (2 points)" in res.stdout
    assert (tmp_path / "f.png").stat().st_size > 0
    res = CliRunner().invoke(cli, ["plot", "s.sqlite", "--kind", "scaling", "--x", "channel.snr_db", "--out", "g.png"])
    _one_line(res, 2, "swept keys: sampling.p (choose one with --x)")


def test_a_list_whose_quotes_the_shell_stripped_is_read_as_a_list():
    from otafl.config import parse_override

    assert parse_override("privacy.accountants=[exact,tight]") == ("privacy", "accountants", ["exact", "tight"])
    assert parse_override("privacy.accountants=[exact, tight,]")[2] == ["exact", "tight"]
    assert parse_override("a.b=[1,x]")[2] == [1, "x"]
    assert parse_override("a.b=[a,[b]]")[2] == "[a,[b]]"  # nested: left as a string (then refused by name)


def test_a_run_with_a_shell_stripped_accountants_list_accounts_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text('[data]\nname = "synthetic"\nusers = 6\n[train]\nrounds = 2\neval_every = 2\n')
    res = CliRunner().invoke(cli, ["run", "t.toml", "--out", "X", "--quiet", "--set",
                                   "privacy.accountants=[paper,tight]"])
    assert res.exit_code == 0, res.output
    assert "  paper: " in res.stdout and "  tight: " in res.stdout


def test_a_string_of_accountants_suggests_its_names_as_a_list(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text('[privacy]\naccountants = "[exact,tight]"\n')
    res = CliRunner().invoke(cli, ["run", "t.toml", "--out", "X"])
    _one_line(res, 2, "must be a list of names, e.g. ['exact', 'tight']")


def test_a_sweep_refuses_an_sqlite_database_without_tables_and_leaves_it_alone(tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SWEEP_P)
    sqlite3.connect("theirs.sqlite").execute("PRAGMA user_version = 7").connection.close()
    before = (tmp_path / "theirs.sqlite").read_bytes()
    res = CliRunner().invoke(cli, ["sweep", "s.toml", "--out", "theirs.sqlite", "--workers", "0", "--quiet"])
    _one_line(res, 2, "'theirs.sqlite' is not an otafl results file (it is an SQLite database without tables)")
    assert (tmp_path / "theirs.sqlite").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml", "theirs.sqlite"]


def test_a_nan_threshold_in_a_sweep_axis_is_refused_before_the_store_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SWEEP_P.replace('"sampling.p" = [0.5, 0.9]', '"transmit.threshold" = [1.0, nan]'))
    res = CliRunner().invoke(cli, ["sweep", "s.toml", "--out", "s.sqlite", "--workers", "0", "--quiet"])
    _one_line(res, 2, "transmit.threshold = nan")
    assert not (tmp_path / "s.sqlite").exists()


@pytest.mark.parametrize("env, value, needle", [
    ("OTAFL_MEMORY_LIMIT_GB", "abc", "environment variable OTAFL_MEMORY_LIMIT_GB = 'abc' is refused for --memory-limit"),
    ("OTAFL_MEMORY_LIMIT_GB", "inf", "environment variable OTAFL_MEMORY_LIMIT_GB = inf is outside"),
    ("OTAFL_THREADS", "0", "environment variable OTAFL_THREADS = '0' is refused for --threads"),
])
def test_a_bad_environment_variable_is_named_not_the_option(monkeypatch, env, value, needle):
    monkeypatch.setenv(env, value)
    res = CliRunner().invoke(cli, ["bound", "--quiet"])
    _one_line(res, 2, needle)


# --------------------------------------------------------------------------- 4. a truncated -shm


SHM_KILLER = r"""
import os, sys, time
import otafl.sweep.store as store
wait = float(sys.argv[1])
real, calls = store.ResultStore.mark_done, []
def mark_done(self, *a, **k):
    calls.append(1)
    if len(calls) == 2:  # another process truncates the index SQLite maps, between two commits
        os.truncate(f"{self.path}-shm", 0)
        time.sleep(wait)  # 0: the commit finds it; 0.6: the watch thread has restored it meanwhile
    return real(self, *a, **k)
store.ResultStore.mark_done = mark_done
from otafl.cli.main import cli
cli(["sweep", "s.toml", "--out", "s.sqlite", "--workers", "0", "--quiet"])
"""


@pytest.mark.parametrize("wait", ["0", "0.6"], ids=["at-the-commit", "by-the-watch-thread"])
def test_a_truncated_shm_index_stops_the_sweep_with_one_line_not_sigbus(tmp_path, wait):
    (tmp_path / "s.toml").write_text(SWEEP_P.replace("seeds = [0]", "seeds = [0, 1]"))
    proc = subprocess.run([sys.executable, "-c", SHM_KILLER, wait], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(), timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # was -7 (SIGBUS), no message
    assert proc.stderr.splitlines() == [
        "error: the index s.sqlite-shm of results file 's.sqlite' was truncated by another process during the "
        "sweep (restored: 1 finished run(s) kept); rerun with --resume"], proc.stderr
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.toml"), "--out", str(tmp_path / "s.sqlite"),
                                   "--workers", "0", "--quiet", "--resume"])
    assert res.exit_code == 0 and "3 runs done, 1 skipped (already done)" in res.stdout, res.output
