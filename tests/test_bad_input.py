"""A table of bad inputs across every command: each exits 2 with one line on stderr, no
traceback, and leaves every file as it was (a finished run folder and a sweep store are
present, and must stay byte-identical)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import pytest
from procs import interruptible
from click.testing import CliRunner

from otafl.cli.main import cli

SPEC = """
[data]
name = "synthetic"
users = 6
[train]
rounds = 2
eval_every = 2
[privacy]
accountants = ["paper"]
"""

SWEEP = SPEC + """
[sweep]
seeds = [0]
[sweep.axes]
"sampling.p" = [0.5, 0.9]
"""

BAD = [
    # run: spec values, overrides, sizes, outputs
    (["run", "spec.toml", "--set", "sampling.p=1.5"], "sampling.p = 1.5"),
    (["run", "spec.toml", "--set", "sampling.p=0"], "sampling.p = 0.0"),
    (["run", "spec.toml", "--set", "channel.rho=-0.1"], "channel.rho"),
    (["run", "spec.toml", "--set", "channel.snr_db=500"], "channel.snr_db"),
    (["run", "spec.toml", "--set", "transmit.sigma2=-1"], "transmit.sigma2"),
    (["run", "spec.toml", "--set", "transmit.clip=0"], "transmit.clip"),
    (["run", "spec.toml", "--set", "transmit.clip=[1.0,2.0]"], "not a list"),
    (["run", "spec.toml", "--set", "transmit.sigma2=[0.1,0.2,0.3]"], "allowed lengths"),
    (["run", "spec.toml", "--set", "channel.large_scale_gain=[1.0,2.0]"], "allowed lengths"),
    (["run", "spec.toml", "--set", "data.users=0"], "data.users"),
    (["run", "spec.toml", "--set", "train.rounds=1000000000"], "memory limit"),
    (["run", "spec.toml", "--set", "model.name='two-layer'", "--set", "model.hidden=10000000"], "memory limit"),
    (["run", "spec.toml", "--set", "train.rounds=2.5"], "must be an integer"),
    (["run", "spec.toml", "--set", "privacy.accountants=['tigth']"], "'tigth'"),
    (["run", "spec.toml", "--set", "privacy.delta_l=1"], "privacy.delta_l"),
    (["run", "spec.toml", "--set", "sampling.scheme='sometimes'"], "sampling.scheme"),
    (["run", "spec.toml", "--set", "data.name='cifar'"], "data.name"),
    (["run", "spec.toml", "--set", "channel.preset='../../etc/passwd'"], ".toml suffix"),
    (["run", "spec.toml", "--set", "channel.preset='/etc/passwd'"], ".toml suffix"),
    (["run", "spec.toml", "--set", "channel.preset='nothere'"], "not found"),
    (["run", "spec.toml", "--set", "radio.power=1"], "radio"),
    (["run", "spec.toml", "--set", "sampling.pp=1"], "unknown key"),
    (["run", "spec.toml", "--set", "transmit.power_control='half'"], "transmit.power_control = 'half'"),
    (["run", "spec.toml", "--set", "transmit.power_control='privacy-budget'", "--set", "privacy.target_epsilon=0"],
     "privacy.target_epsilon = 0"),
    (["run", "spec.toml", "--set", "transmit.power_control='privacy-budget'"], "privacy.target_epsilon must be set"),
    (["run", "spec.toml", "--set", "transmit.power_control='schedule'", "--set", "transmit.power_schedule=[1.0,0.5,0.2]"],
     "allowed length is train.rounds = 2"),
    (["run", "spec.toml", "--set", "transmit.power_schedule=[1.0,1.5]"], "transmit.power_schedule = 1.5"),
    (["run", "spec.toml", "--set", "transmit.power_control='cotaf'"], "transmit.threshold must be set"),
    (["run", "spec.toml", "--set", "channel.csi='guessed'"], "channel.csi = 'guessed'"),
    (["run", "spec.toml", "--set", "channel.csi='estimated'", "--set", "channel.csi_error_var=-0.1"],
     "channel.csi_error_var = -0.1"),
    (["run", "spec.toml", "--set", "channel.csi='estimated'"], "exactly one of"),
    (["run", "spec.toml", "--set", "channel.csi_error_var=0.1"], "needs channel.csi = 'estimated'"),
    (["run", "spec.toml", "--set", "channel.csi='estimated'", "--set", "channel.pilot_snr_db=nan"],
     "channel.pilot_snr_db"),
    (["run", "spec.toml", "--set", "channel.csi='estimated'", "--set", "channel.pilot_snr_db=20",
      "--set", "train.aggregation='ideal'"], "needs train.aggregation = 'ota'"),
    (["run", "spec.toml", "--set", "channel.csi='estimated'", "--set", "channel.pilot_snr_db=20",
      "--set", "train.algorithm='fedavg'"], "needs train.algorithm = 'fedsgd'"),
    (["run", "spec.toml", "--set", "nodot"], "section.key"),
    (["run", "missing.toml"], "does not exist"),
    (["run", "broken.toml"], "malformed TOML"),
    (["run", "spec.toml", "--set", "data.dir='/no/such/dir'", "--set", "data.name='mnist'"], "mnist"),
    # group options
    (["--threads", "0", "bound", "--p", "0.5"], "--threads"),
    (["--memory-limit", "-1", "bound", "--p", "0.5"], "--memory-limit"),
    # bound
    (["bound", "--p", "1.5"], "p = 1.5"),
    (["bound", "--p", "0.5", "--sigma2", "-1"], "sigma2"),
    (["bound", "--p", "0.5", "--clip", "0"], "clip"),
    (["bound", "--p", "0.5", "--accountant", ""], "no accountant given"),
    (["bound", "--p", "0.5", "--accountant", ","], "no accountant given"),
    (["bound", "--p", "0.5", "--accountant", "tigth"], "tigth"),
    (["bound", "--p", "0.5", "--rounds", "1000000000000"], "memory limit"),
    (["bound", "--p", "0.5", "--dim", "1000000000000000000000"], "dim"),
    (["bound", "--p", "abc"], "abc"),
    (["bound", "--p", "0.5", "--channel", "/etc/passwd"], ".toml suffix"),
    (["bound", "--p", "0.5", "--delta-l", "0"], "delta"),
    # audit
    (["audit", "--p", "0.5", "--samples", "1000000000000"], "draws"),
    (["audit", "--p", "0.5", "--samples", "0"], "samples"),
    (["audit", "--p", "0.5", "--accountant", ""], "no accountant given"),
    (["audit", "--p", "0.5", "--accountant", "tigth"], "tigth"),
    # scaling, plot-accountants
    (["scaling", "--p", "1.5"], "1.5"),
    (["scaling", "--accountant", ""], "no accountant given"),
    (["plot-accountants", "--out", "fig.jpg"], "fig.jpg"),
    # sweep, table, plot on bad or foreign files
    (["sweep", "missing.toml", "--out", "new.sqlite"], "does not exist"),
    (["sweep", "sweep.toml", "--out", "store.sqlite"], "store.sqlite"),
    (["table", "missing.sqlite"], "missing.sqlite"),
    (["table", "spec.toml"], "spec.toml"),
    (["table", "store.sqlite", "--format", "pdf"], "pdf"),
    (["plot", "store.sqlite", "--kind", "accuracy", "--out", "fig.jpg"], "fig.jpg"),
    (["plot", "store.sqlite", "--kind", "pie", "--out", "fig.png"], "pie"),
    (["plot", "missing.sqlite", "--kind", "accuracy", "--out", "fig.png"], "missing.sqlite"),
    (["plot", "store.sqlite", "--kind", "accuracy", "--out", "/proc/fig.png"], "/proc/fig.png"),
    (["table", "store.sqlite", "--out", "/proc/table.md"], "/proc/table.md"),
    (["table", "store.sqlite", "--out", "spec.toml/table.md"], "spec.toml/table.md"),
    (["plot-accountants", "--p", "0.5", "--out", "/proc/acc.png"], "/proc/acc.png"),
    (["run", "spec.toml", "--out", "/proc/run"], "/proc/run"),
    (["run", "spec.toml", "--out", "done-run"], "done-run"),
    (["run", "spec.toml", "--out", ""], "--out"),
    # issue 21: infinite, non-numeric and oversized values, paths that cannot exist
    (["run", "spec.toml", "--set", "train.lr=inf"], "train.lr = inf is outside the allowed range (0, inf), finite"),
    (["run", "spec.toml", "--set", "train.weight_decay=inf"], "train.weight_decay = inf"),
    (["run", "spec.toml", "--set", "train.local_lr=inf"], "train.local_lr = inf"),
    (["run", "spec.toml", "--set", "transmit.record_clip=inf"], "transmit.record_clip = inf"),
    (["run", "spec.toml", "--set", "transmit.step_noise=inf"], "transmit.step_noise = inf"),
    (["run", "spec.toml", "--set", "digital.sigma2=inf"], "digital.sigma2 = inf"),
    (["run", "spec.toml", "--set", "channel.large_scale_gain=1e-300"], "channel.large_scale_gain = 1e-300"),
    (["run", "spec.toml", "--set", "transmit.sigma2=[0.1, 'a']"], "transmit.sigma2 = 'a' is not a number"),
    (["run", "spec.toml", "--set", "transmit.step_noise=1e-8"], "transmit.step_noise = 1e-08"),
    (["run", "spec.toml", "--set", "train.local_steps=100000000"], "train.local_steps = 100000000"),
    (["run", "spec.toml", "--out", "x" * 300], "over the limit of 255"),
    (["run", "spec.toml", "--out", "/".join(["y" * 200] * 25)], "over the limit of 4095"),
    (["sweep", "sweep.toml", "--out", "x" * 300 + ".sqlite"], "over the limit of 255"),
    (["bound", "--accountant", "steps", "--step-noise", "1e-8"], "step_noise = 1e-08"),
    (["bound", "--accountant", "steps", "--step-noise", "0.5", "--local-steps", "100000000"],
     "local_steps = 100000000"),
    (["scaling", "--k-max", "inf"], "k_max = inf"),
    (["scaling", "--out", "x" * 300 + ".png"], "over the limit of 255"),
    (["scaling", "--out", "/proc/x.png"], "/proc/x.png"),
    (["--memory-limit", "nan", "bound", "--p", "0.5"], "--memory-limit = nan"),
    # issue 21: checks that came too late, misleading messages
    (["run", "spec.toml", "--set", "privacy.accountants='paper'"], "must be a list of names, e.g. ['paper']"),
    (["run", "spec.toml", "--set", "train.rounds=3\nfoo=1"], "line break"),
    (["bound", "--p", "0.5", "--delta-target", "1e-5"], "give rounds (--rounds T) too"),
    (["plot-digital", "store.sqlite", "--out", "fig.png"], "no digital runs"),
    # calibrate
    (["calibrate", "spec.toml", "--target-epsilon", "-1", "--solve", "transmit.sigma2"], "target"),
    (["calibrate", "spec.toml", "--target-epsilon", "5", "--solve", "model.hidden"], "model.hidden"),
    # issue 32: named as given, checked even where unused
    (["calibrate", "spec.toml", "--target-epsilon", "5", "--solve", "transmit.sigma2", "--delta-total", "0"],
     "--delta-total = 0.0 is outside the allowed range (0, 1)"),
    (["calibrate", "spec.toml", "--target-epsilon", "5", "--solve", "transmit.sigma2", "--delta-total", "nan"],
     "--delta-total = nan"),
    (["run", "spec.toml", "--set", "transmit.threshold=nan"], "transmit.threshold = nan"),
    (["run", "spec.toml", "--set", "transmit.threshold=inf"], "transmit.threshold = inf"),
    (["run", "spec.toml", "--set", "data.name='mnist'", "--set", "data.dir='spec.toml'"],
     "data_dir 'spec.toml' is a file, not a folder"),
    (["run", "spec.toml", "--out", ".", "--overwrite"], "output folder '.' is the current folder or holds it"),
    (["bound", "--accountant", "exact", "--users", "1000000000", "--p", "1e-9", "--rounds", "3"],
     "users = 1000000000 with the exact accountant's totals over 3 rounds (per-user facts) needs about 104 GiB"),
    (["audit", "--users", "1000000000", "--p", "1e-9", "--samples", "10", "--rounds", "3"],
     "users = 1000000000 with the exact accountant's totals over 3 rounds"),
]


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with a spec, a broken spec, a finished run and a finished sweep store."""
    root = tmp_path_factory.mktemp("bad-input")
    (root / "spec.toml").write_text(SPEC)
    (root / "sweep.toml").write_text(SWEEP)
    (root / "broken.toml").write_text("[data\nusers = 3\n")
    old = os.getcwd()
    os.chdir(root)
    try:
        runner = CliRunner()
        assert runner.invoke(cli, ["run", "spec.toml", "--out", "done-run", "--quiet"]).exit_code == 0
        res = runner.invoke(cli, ["sweep", "sweep.toml", "--out", "store.sqlite", "--workers", "0", "--quiet"])
        assert res.exit_code == 0, res.output
    finally:
        os.chdir(old)
    return root


def test_the_table_covers_every_command_with_at_least_forty_cases():
    commands = {next(a for a in args if not a.startswith("-") and not a[0].isdigit() and a != "nan")
                for args, _ in BAD}
    assert len(BAD) >= 40
    assert {"run", "bound", "audit", "scaling", "sweep", "table", "plot", "calibrate", "plot-accountants"} <= commands


def _assert_refused(workdir, monkeypatch, args, needle):
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("OTAFL_MEMORY_LIMIT_GB", raising=False)
    before = _snapshot(workdir)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output and needle in lines[0], lines[0]
    assert _snapshot(workdir) == before


@pytest.mark.parametrize("args, needle", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_input_exits_2_with_one_line_and_changes_no_file(workdir, monkeypatch, args, needle):
    _assert_refused(workdir, monkeypatch, args, needle)


RANGE = "[1e-30, 1e+30]"


def test_a_clip_whose_square_overflows_is_refused_not_read_as_perfect_privacy(workdir, monkeypatch):
    # L = 1e155: L^2 overflowed, the alignment gain became 0 and every epsilon read 0 (exact central 1).
    for args, name in ((["bound", "--accountant", "exact,tight,paper", "--clip", "1e155"], "clip = 1e+155"),
                       (["audit", "--clip", "1e155", "--samples", "100"], "clip = 1e+155"),
                       (["run", "spec.toml", "--set", "transmit.clip=1e155"], "transmit.clip = 1e+155"),
                       (["calibrate", "spec.toml", "--target-epsilon", "5", "--solve", "transmit.sigma2",
                         "--set", "transmit.clip=1e155"], "transmit.clip = 1e+155")):
        _assert_refused(workdir, monkeypatch, args, f"{name} is outside the allowed range {RANGE}")


def test_an_infinite_clip_in_a_spec_is_refused_not_reported_as_epsilon_zero(workdir, monkeypatch):
    _assert_refused(workdir, monkeypatch, ["run", "spec.toml", "--set", "transmit.clip=inf"],
                    f"transmit.clip = inf is outside the allowed range {RANGE}")


def test_an_infinite_n0_is_refused_not_printed_as_nan(workdir, monkeypatch):
    for args, name in ((["bound", "--accountant", "paper,tight", "--n0", "inf"], "n0 = inf"),
                       (["audit", "--n0", "inf", "--samples", "100"], "n0 = inf"),
                       (["run", "spec.toml", "--set", "channel.n0=inf"], "channel.n0 = inf")):
        _assert_refused(workdir, monkeypatch, args, f"{name} is outside the allowed range 0 or {RANGE}")


def test_noise_and_gains_beyond_the_float_range_are_refused(workdir, monkeypatch):
    for args, needle in ((["bound", "--sigma2", "1e31"], "sigma2 = 1e+31"),
                         (["bound", "--n0", "1e-40"], "n0 = 1e-40"),
                         (["run", "spec.toml", "--set", "transmit.sigma2=1e40"], "transmit.sigma2 = 1e+40"),
                         (["run", "spec.toml", "--set", "channel.large_scale_gain=1e-40"],
                          "channel.large_scale_gain = 1e-40"),
                         (["run", "spec.toml", "--set", "channel.large_scale_gain=inf"],
                          "channel.large_scale_gain = inf"),
                         (["calibrate", "spec.toml", "--target-epsilon", "5", "--solve", "transmit.clip",
                           "--range", "1e-3,1e40"], "1e+40")):
        _assert_refused(workdir, monkeypatch, args, needle)


def test_infinite_round_facts_are_refused_by_every_over_the_air_accountant():
    import math

    from otafl.errors import OtaflInputError
    from otafl.privacy.accountants import ACCOUNTANTS

    good = dict(participation_prob=0.5, users=10, noise_var=0.1, alignment_gain=1.0, n0=1.0, sensitivity=2.0,
                delta_l=1e-5, dim=10)
    for name in ("paper", "tight", "exact"):
        for bad, needle in ((dict(n0=math.inf), "n0 = inf"), (dict(sensitivity=math.inf), "sensitivity = inf"),
                            (dict(noise_var=math.inf), "noise_var = inf"),
                            (dict(alignment_gain=1e-160), "N0 / c_t^2 overflows")):
            with pytest.raises(OtaflInputError, match=needle.replace("^", r"\^")):
                ACCOUNTANTS[name].bound(**{**good, **bad})


# --------------------------------------------------------------------------- issue 21: outputs and stores


def _otafl(args, cwd, *, fsize: int | None = None, timeout: float = 120):
    """``python -m otafl ARGS`` in a subprocess (optionally under ``ulimit -f``: a full disk)."""
    import resource
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    env.pop("OTAFL_MEMORY_LIMIT_GB", None)

    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "otafl", *args], cwd=cwd, env=env, preexec_fn=limit,
                          capture_output=True, text=True, timeout=timeout)


def _one_error_line(proc, code=2, needle=""):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0], lines[0]


SWEEP8 = SPEC.replace("rounds = 2", "rounds = 3") + """
[sweep]
seeds = [0, 1, 2, 3]
[sweep.axes]
"sampling.p" = [0.5, 0.9]
"""


def test_a_results_file_deleted_during_a_sweep_stops_it_and_is_written_back(tmp_path, monkeypatch):
    import otafl.sweep.executor as executor

    (tmp_path / "s.toml").write_text(SWEEP8)
    db = tmp_path / "r.sqlite"
    real, calls = executor.run_point, []

    def run_and_delete(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            for f in tmp_path.glob("r.sqlite*"):
                f.unlink()
        return real(*a, **kw)

    monkeypatch.setattr(executor, "run_point", run_and_delete)
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.toml"), "--out", str(db), "--workers", "0", "--quiet"])
    assert res.exit_code == 2 and "runs done" not in res.stdout, res.output
    assert res.stderr.strip().startswith("error: ") and "was deleted during the sweep" in res.stderr
    assert "3 finished run(s) were written back" in res.stderr  # the third finished into the deleted file
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.toml"), "--out", str(db), "--workers", "0",
                                   "--quiet", "--resume"])
    assert res.exit_code == 0 and "3 skipped" in res.stdout, res.output


def test_a_full_disk_during_a_sweep_is_one_line_exit_2_and_keeps_the_finished_runs(tmp_path):
    (tmp_path / "s.toml").write_text(SWEEP8)
    proc = _otafl(["sweep", "s.toml", "--out", "r.sqlite", "--workers", "0", "--quiet"], tmp_path, fsize=120_000)
    _one_error_line(proc, 2, "cannot be written")
    assert "finished run(s) kept" in proc.stderr
    assert not (tmp_path / "r.sqlite").exists() or (tmp_path / "r.sqlite").stat().st_size > 0


def test_a_sweep_refused_by_a_full_disk_leaves_no_results_file(tmp_path):
    (tmp_path / "s.toml").write_text(SWEEP8)
    proc = _otafl(["sweep", "s.toml", "--out", "r.sqlite", "--workers", "0", "--quiet"], tmp_path, fsize=4096)
    _one_error_line(proc, 2, "r.sqlite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


def test_a_scaling_figure_on_a_full_disk_is_one_line_and_leaves_no_file(tmp_path):
    proc = _otafl(["scaling", "--points", "3", "--exact-points", "2", "--out", str(tmp_path / "k.png")],
                  tmp_path, fsize=2048)
    _one_error_line(proc, 2, "k.png")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_point_whose_digital_bits_cannot_hold_the_sum_is_refused_before_the_store_exists(tmp_path,
                                                                                                 monkeypatch):
    spec = SPEC.replace('accountants = ["paper"]', 'accountants = ["digital"]') + (
        '[digital]\nmechanism = "ddg"\n[sweep]\n[sweep.axes]\n"digital.bits" = [16, 3]\n'
        '"train.aggregation" = ["digital"]\n')
    (tmp_path / "s.toml").write_text(spec)
    monkeypatch.chdir(tmp_path)
    _assert_refused(tmp_path, monkeypatch, ["sweep", "s.toml", "--out", "r.sqlite"], "digital.bits = 3")
    assert not (tmp_path / "r.sqlite").exists()


def test_a_sweep_on_cuda_without_cuda_is_refused_before_the_store_exists(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    (tmp_path / "s.toml").write_text(SWEEP8)
    _assert_refused(tmp_path, monkeypatch, ["sweep", "s.toml", "--out", "r.sqlite", "--device", "cuda"], "cuda")
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:1", "not a host"])
def test_a_ray_sweep_with_a_bad_address_leaves_no_store(tmp_path, monkeypatch, address):
    pytest.importorskip("ray")
    (tmp_path / "s.toml").write_text(SWEEP8)
    _assert_refused(tmp_path, monkeypatch, ["sweep", "s.toml", "--out", "r.sqlite", "--executor", "ray", "--quiet",
                                            "--address", address], "Ray")
    assert not (tmp_path / "r.sqlite").exists()


# --------------------------------------------------------------------------- issue 21: the steps accountant, divergence


def test_the_steps_bound_at_small_step_noise_falls_back_to_rdp_quickly_and_says_so():
    import time

    t0 = time.perf_counter()
    res = CliRunner().invoke(cli, ["bound", "--accountant", "steps", "--step-noise", "0.1", "--local-steps", "5",
                                   "--record-sampling", "0.5", "--rounds", "50"])
    assert res.exit_code == 0, res.output
    assert time.perf_counter() - t0 < 30
    assert "note: steps:" in res.stderr and "composed with rdp instead" in res.stderr


def test_a_pld_over_the_memory_limit_is_never_built():
    from otafl.privacy.analysis.pld import pld_fits, set_memory_budget, take_notes
    from otafl.privacy.analysis.steps import StepRound

    take_notes()
    small = [(StepRound(0.5, 0.5, 1.0, 5), 10)]
    try:
        set_memory_budget(8 * 2**30)
        assert pld_fits(small, 1e-4) and take_notes() == []
        set_memory_budget(2**20)  # 1 MiB: no PLD fits
        assert not pld_fits(small, 1e-4) and "composed with rdp" in take_notes()[0]
        assert not pld_fits([(StepRound(0.5, 0.5, 0.1, 5), 50)], 1e-4)
    finally:
        set_memory_budget(None)


def test_a_run_whose_model_turns_non_finite_stops_with_one_line_exit_1_and_says_so_in_summary(tmp_path,
                                                                                              monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC.replace("rounds = 2", "rounds = 6"))
    res = CliRunner().invoke(cli, ["run", "spec.toml", "--set", "train.lr=1e300", "--out", "r", "--quiet"])
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training diverged at round 1 of 6"), res.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["diverged_at_round"] == 1 and summary["rounds"] == 1 and summary["rounds_planned"] == 6


def test_plain_otafl_prints_its_help_not_an_error_line():
    res = CliRunner().invoke(cli, [])
    assert res.exit_code == 0 and res.stdout.startswith("Usage:") and "Commands:" in res.stdout


DIGITAL = SPEC.replace('accountants = ["paper"]', 'accountants = ["digital"]').replace(
    "[train]", '[train]\naggregation = "digital"')


def test_calibrating_a_knob_that_a_digital_run_ignores_is_refused(tmp_path, monkeypatch):
    (tmp_path / "d.toml").write_text(DIGITAL)
    _assert_refused(tmp_path, monkeypatch, ["calibrate", "d.toml", "--target-epsilon", "5", "--solve",
                                            "transmit.sigma2"], "a digital run ignores it")


def test_a_digital_run_whose_every_round_overflows_exits_1_with_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.toml").write_text(DIGITAL)
    res = CliRunner().invoke(cli, ["run", "d.toml", "--set", "digital.mechanism='skellam'", "--set",
                                   "digital.scale=1e15", "--out", "r", "--quiet"])
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "overflowed 2^digital.bits in all 2 rounds" in lines[0], res.stderr


def test_a_terminated_or_killed_run_leaves_no_output_folder_nor_its_stage(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "spec.toml").write_text(SPEC.replace("rounds = 2", "rounds = 100000"))
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = subprocess.Popen([sys.executable, "-m", "otafl", "run", "spec.toml", "--out", "r", "--quiet"],
                                cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(".r.partial-") for p in tmp_path.iterdir()):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(sig)
        err = proc.communicate(timeout=30)[1]
        assert not (tmp_path / "r").exists()
        if sig == signal.SIGTERM:
            assert proc.returncode == 143 and err.strip().splitlines() == [
                "error: terminated by SIGTERM; no results written to r"], err
        deadline = time.monotonic() + 10  # after kill -9 the guard process removes the stage
        while sorted(p.name for p in tmp_path.iterdir()) != ["spec.toml"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"], sig


def test_a_stage_left_by_a_dead_run_is_removed_by_the_next_run_into_that_folder(tmp_path):
    stale = tmp_path / ".r.partial-999999999"  # no such pid: its guard was killed too
    stale.mkdir()
    (stale / "summary.json").write_text("{}")
    (tmp_path / "spec.toml").write_text(SPEC)
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "r"), "--quiet"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r", "spec.toml"]


# --------------------------------------------------------------------------- hostile campaign 21, second round


def _node(path: Path, kind: str) -> None:
    """A character device (like /dev/full, 1:7), a FIFO, inside tmp_path only; skipped where not allowed."""
    import stat

    try:
        if kind == "fifo":
            os.mkfifo(path)
        else:
            os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 7))
    except (OSError, AttributeError) as e:
        pytest.skip(f"cannot make a {kind} here: {e}")


def _refused_here(cwd: Path, args, needle: str):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(cli, args)
    finally:
        os.chdir(old)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    return lines[0]


def test_no_writer_replaces_a_device_node_a_fifo_or_a_link_to_one(workdir, tmp_path):
    import stat

    store = str(workdir / "store.sqlite")
    (tmp_path / "spec.toml").write_text(SWEEP)
    _node(tmp_path / "dev", "char")
    _node(tmp_path / "pipe.png", "fifo")
    os.symlink("pipe.png", tmp_path / "to-pipe.md")
    os.symlink("missing.md", tmp_path / "dangling.md")
    (tmp_path / "r").mkdir()
    _node(tmp_path / "r" / "summary.json", "fifo")
    cases = [(["table", store, "--out", "dev"], "'dev' exists and is a character device"),
             (["table", store, "--out", "pipe.png"], "is a FIFO (named pipe)"),
             (["table", store, "--out", "to-pipe.md"], "is a symbolic link to a FIFO"),
             (["table", store, "--out", "dangling.md"], "is a symbolic link to a missing file"),
             (["plot", store, "--kind", "accuracy", "--out", "pipe.png"], "is a FIFO"),
             (["scaling", "--points", "3", "--exact-points", "2", "--out", "pipe.png"], "is a FIFO"),
             (["plot-accountants", "--out", "pipe.png"], "is a FIFO"),
             (["plot-digital", store, "--out", "pipe.png"], "is a FIFO"),
             (["calibrate", "spec.toml", "--target-epsilon", "100", "--solve", "train.rounds", "--write", "dev",
               "--overwrite"], "'dev' exists and is a character device"),
             (["sweep", "spec.toml", "--out", "dev"], "results file 'dev' exists and is a character device"),
             (["run", "spec.toml", "--out", "r", "--overwrite", "--quiet"], "'r/summary.json' exists and is a FIFO")]
    for args, needle in cases:
        _refused_here(tmp_path, args, needle)
    assert stat.S_ISCHR(os.lstat(tmp_path / "dev").st_mode) and stat.S_ISFIFO(os.lstat(tmp_path / "pipe.png").st_mode)
    assert os.path.islink(tmp_path / "to-pipe.md") and os.path.islink(tmp_path / "dangling.md")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "r" / "summary.json").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.md", "dev", "pipe.png", "r", "spec.toml",
                                                          "to-pipe.md"]


def test_an_output_that_links_to_a_regular_file_writes_that_file_and_keeps_the_link(workdir, tmp_path):
    (tmp_path / "real.md").write_text("old\n")
    os.symlink("real.md", tmp_path / "link.md")
    res = CliRunner().invoke(cli, ["table", str(workdir / "store.sqlite"), "--out", str(tmp_path / "link.md")])
    assert res.exit_code == 0, res.output
    assert os.path.islink(tmp_path / "link.md") and (tmp_path / "real.md").read_text().startswith("| scheme")


def test_bound_users_beyond_the_memory_limit_or_exact_floats_are_refused_before_allocating(workdir, monkeypatch):
    monkeypatch.setenv("OTAFL_MEMORY_LIMIT_GB", "8")  # --memory-limit sets it in this process: undone at the end
    _assert_refused(workdir, monkeypatch, ["--memory-limit", "1", "bound", "--users", "100000000000000",
                                           "--accountant", "tight"], "users = 100000000000000 with the tight")
    _assert_refused(workdir, monkeypatch, ["bound", "--users", "100000000000000000000", "--accountant", "exact"],
                    "users = 100000000000000000000 is outside the allowed range [1, 9.0072e+15]")
    _assert_refused(workdir, monkeypatch, ["audit", "--users", "100000000000000", "--samples", "10"],
                    "users = 100000000000000 is outside the allowed range [1, 1e+12]")


def test_a_results_file_replaced_during_a_sweep_keeps_its_content_and_gets_none_of_our_wal(tmp_path, monkeypatch):
    import time

    import otafl.sweep.executor as executor
    from otafl.sweep.store import open_store, read_store

    (tmp_path / "s.toml").write_text(SWEEP8)
    db = tmp_path / "r.sqlite"
    open_store(tmp_path / "other.sqlite").close()  # an empty results file of another sweep
    real, calls, seen = executor.run_point, [], []

    def run_and_replace(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            os.replace(tmp_path / "other.sqlite", db)
            time.sleep(1.0)  # the sweep's watch removes its -wal and -shm well before its next commit
            seen.append(sorted(p.name for p in tmp_path.iterdir()))
            with read_store(db) as store:  # a reader meanwhile sees the new file, not our runs
                seen.append(store.count())
        return real(*a, **kw)

    monkeypatch.setattr(executor, "run_point", run_and_replace)
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.toml"), "--out", str(db), "--workers", "0", "--quiet"])
    assert res.exit_code == 2 and "was replaced during the sweep" in res.stderr, res.output
    assert seen == [["r.sqlite", "s.toml"], 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite", "s.toml"]
    with read_store(db) as store:
        assert store.count() == 0


def test_a_replaced_store_is_never_deleted_as_the_sweeps_own_empty_file(tmp_path, monkeypatch):
    import otafl.sweep.executor as executor
    from otafl.sweep.store import open_store, read_store

    (tmp_path / "s.toml").write_text(SWEEP8)
    db = tmp_path / "r.sqlite"
    open_store(tmp_path / "other.sqlite").close()
    real = executor.run_point

    def replace_first(*a, **kw):  # before the sweep's first result: it would discard its empty file
        os.replace(tmp_path / "other.sqlite", db)
        return real(*a, **kw)

    monkeypatch.setattr(executor, "run_point", replace_first)
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.toml"), "--out", str(db), "--workers", "0", "--quiet"])
    assert res.exit_code == 2 and "was replaced" in res.stderr, res.output
    with read_store(db) as store:
        assert store.count() == 0


def test_sgd_with_a_learning_rate_beyond_float32_is_refused(workdir, monkeypatch):
    _assert_refused(workdir, monkeypatch, ["run", "spec.toml", "--set", "train.optimizer='sgd'", "--set",
                                           "train.lr=1e39", "--out", "r"],
                    "train.lr = 1e+39 is outside the allowed range (0, 3.40282e+38] for train.optimizer = 'sgd'")


def test_a_weight_decay_beyond_float32_is_refused_before_training(workdir, monkeypatch):
    _assert_refused(workdir, monkeypatch, ["run", "spec.toml", "--set", "train.weight_decay=1e39", "--out", "r"],
                    "train.weight_decay = 1e+39 is outside the allowed range [0, 3.40282e+38]")


def test_a_store_in_a_read_only_folder_prints_its_table(workdir, tmp_path):
    import shutil
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(workdir / "store.sqlite", ro / "store.sqlite")
    mounted = subprocess.run(["mount", "--bind", str(ro), str(ro)], capture_output=True).returncode == 0
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("cannot bind-mount a read-only folder here")
        ro.chmod(0o555)  # not root: a folder without write permission
    try:
        if mounted and subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        assert not os.access(ro, os.W_OK)
        res = CliRunner().invoke(cli, ["table", str(ro / "store.sqlite")])
        assert res.exit_code == 0 and res.stdout.startswith("| scheme"), res.output
        assert sorted(p.name for p in ro.iterdir()) == ["store.sqlite"]
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=True)
        else:
            ro.chmod(0o755)


def test_a_negative_synthetic_size_is_named_by_its_spec_key(workdir, monkeypatch):
    _assert_refused(workdir, monkeypatch, ["run", "spec.toml", "--set", "data.samples=-1"],
                    "data.samples = -1 is outside the allowed range [20, inf)")


def test_a_synthetic_data_set_over_the_memory_limit_is_refused_before_it_is_drawn(workdir, monkeypatch):
    _assert_refused(workdir, monkeypatch, ["run", "spec.toml", "--set", "data.samples=10000000000"],
                    "data.samples = 10000000000 (the synthetic data set) needs about 3.2 TiB, over the memory limit")


def test_digital_bits_bound_the_users_of_digital_runs_only(monkeypatch):
    from otafl.config import load_spec
    from otafl.errors import OtaflInputError

    monkeypatch.delenv("OTAFL_MEMORY_LIMIT_GB", raising=False)

    big = ["data.name='synthetic'", "data.users=40000", "data.samples=100000"]
    assert load_spec(None, big).data.users == 40000  # over the air: digital.bits is not used
    assert load_spec(str(Path(__file__).resolve().parents[1] / "experiments" / "large-k.toml"),
                     ["data.users=50000", "data.samples=200000"]).data.users == 50000
    with pytest.raises(OtaflInputError, match=r"digital.bits = 16 is outside the allowed range for skellam"):
        load_spec(None, big + ["train.aggregation='digital'", "privacy.accountants=['digital']"])


def test_deeply_nested_values_are_one_line_not_a_recursion_error(workdir, monkeypatch, tmp_path):
    deep = "[" * 5000 + "]" * 5000
    _assert_refused(workdir, monkeypatch, ["run", "spec.toml", "--set", f"data.name={deep}"],
                    "--set data.name: the value nests lists or tables too deeply")
    (tmp_path / "deep.toml").write_text(f"[data]\nname = {deep}\n")
    _assert_refused(tmp_path, monkeypatch, ["run", "deep.toml"], "lists or tables nested too deeply")


def test_digital_scale_and_theta_beyond_float_range_are_refused(tmp_path, monkeypatch):
    (tmp_path / "d.toml").write_text(DIGITAL)
    _assert_refused(tmp_path, monkeypatch, ["run", "d.toml", "--set", "digital.scale=1e300"],
                    "digital.scale = 1e+300 is outside the allowed range [1e-30, 1e+30]")
    _assert_refused(tmp_path, monkeypatch, ["run", "d.toml", "--set", "digital.mechanism='pbm'", "--set",
                                            "digital.theta=1e-300"],
                    "digital.theta = 1e-300 is outside the allowed range [1e-30, 0.5)")
    _assert_refused(tmp_path, monkeypatch, ["run", "d.toml", "--set", "digital.sigma2=1e300"],
                    "digital.sigma2 = 1e+300 is outside the allowed range 0 or [1e-30, 1e+30]")


def test_calibrate_write_with_a_name_too_long_is_refused_before_the_search(workdir, monkeypatch):
    _assert_refused(workdir, monkeypatch, ["calibrate", "spec.toml", "--target-epsilon", "100", "--solve",
                                           "train.rounds", "--write", "x" * 300 + ".toml"],
                    "has a name of 305 bytes, over the limit of 255")


def test_a_sweep_into_a_device_node_creates_nothing_beside_it(tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    _node(tmp_path / "n", "char")
    _refused_here(tmp_path, ["sweep", "sweep.toml", "--out", "n", "--workers", "0"],
                  "results file 'n' exists and is a character device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n", "sweep.toml"]


def test_a_store_with_a_damaged_row_is_refused_in_one_line(workdir, tmp_path):
    import shutil
    import sqlite3

    for name, value in (("json.sqlite", "'{x'"), ("utf8.sqlite", "cast(x'7bff22' as text)"),
                        ("list.sqlite", "'[1, 2]'")):
        shutil.copy(workdir / "store.sqlite", tmp_path / name)
        with contextlib.closing(sqlite3.connect(tmp_path / name)) as conn, conn:
            conn.execute(f"UPDATE runs SET params = {value} WHERE rowid = 1")
        for args in (["table", name], ["plot", name, "--kind", "accuracy", "--out", "f.png"]):
            _refused_here(tmp_path, args, f"results file '{name}' is damaged (")
    assert not (tmp_path / "f.png").exists()


def _signal_otafl(tmp_path, args, sig, ready, settle=0.5):
    import subprocess
    import sys
    import time

    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "otafl", *args], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while not ready():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    time.sleep(settle)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc.returncode, proc.stderr.read()


def test_ctrl_c_of_a_run_is_one_line_exit_130_and_leaves_no_folder(tmp_path):
    import signal

    (tmp_path / "spec.toml").write_text(SPEC.replace("rounds = 2", "rounds = 100000"))
    code, err = _signal_otafl(tmp_path, ["run", "spec.toml", "--out", "r", "--quiet"], signal.SIGINT,
                              lambda: any(p.name.startswith(".r.partial-") for p in tmp_path.iterdir()))
    assert code == 130 and err.strip().splitlines() == ["error: interrupted; no results written to r"], (code, err)
    assert not (tmp_path / "r").exists()


def _running(db: Path) -> bool:
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'running'").fetchone()[0] > 0
    except sqlite3.Error:
        return False


SWEEP_LONG = SPEC.replace("rounds = 2", "rounds = 100000") + '[sweep]\nseeds = [0]\n[sweep.axes]\n"sampling.p" = [0.5, 0.9]\n'


@pytest.mark.parametrize("executor", ["process", pytest.param("ray", marks=pytest.mark.slow)])
def test_sigterm_of_a_sweep_is_one_line_exit_143_and_keeps_the_store(tmp_path, executor):
    import signal

    if executor == "ray":
        pytest.importorskip("ray")
    (tmp_path / "s.toml").write_text(SWEEP_LONG)
    db = tmp_path / "r.sqlite"
    code, err = _signal_otafl(tmp_path, ["sweep", "s.toml", "--out", "r.sqlite", "--workers", "2", "--quiet",
                                         "--executor", executor], signal.SIGTERM, lambda: _running(db), settle=1.0)
    assert code == 143 and err.strip().splitlines() == [
        "error: terminated by SIGTERM; finished runs are in r.sqlite, rerun with --resume"], (code, err)
    assert _running(db)  # its runs in flight stay `running` for --resume
