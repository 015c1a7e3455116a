"""A table of bad inputs across every command: each exits 2 with one line on stderr, no
traceback, and leaves every file as it was (a finished run folder and a sweep store are
present, and must stay byte-identical)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
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
    # calibrate
    (["calibrate", "spec.toml", "--target-epsilon", "-1", "--solve", "transmit.sigma2"], "target"),
    (["calibrate", "spec.toml", "--target-epsilon", "5", "--solve", "model.hidden"], "model.hidden"),
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
    commands = {next(a for a in args if not a.startswith("-") and not a[0].isdigit()) for args, _ in BAD}
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
