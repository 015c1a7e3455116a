"""Publishing a run folder (issue 32): two runs into one --out never lose results; a kill -9
at any moment of ``run --overwrite`` leaves the old folder or the new one, whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import otafl.publish as publish
from otafl.cli.main import cli
from otafl.publish import PublishConflict, RunFolder
from otafl.publish import clean_stale

REPO = str(Path(__file__).resolve().parents[1])
TINY = """
[data]
name = "synthetic"
users = 20
[train]
rounds = 5
eval_every = 5
[privacy]
accountants = ["paper"]
"""


def _files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def _seed(folder: Path) -> int:
    return json.loads((folder / "summary.json").read_text())["seed"]


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY)
    return tmp_path


def _run_meanwhile(monkeypatch, *args):
    """While the next run trains, ``otafl run tiny.toml ARGS`` runs to its end (the issue's
    two runs started at once, the first finishing first), deterministically."""
    import otafl.fl.loop as loop

    real, done = loop.run_experiment, []

    def hooked(spec, **kw):
        if not done:
            done.append(True)
            from otafl.api.run import run_to_folder
            from otafl.config import load_spec

            run_to_folder(load_spec("tiny.toml", [f"train.{a}" for a in args]), "X")
        return real(spec, **kw)

    monkeypatch.setattr(loop, "run_experiment", hooked)


@pytest.mark.parametrize("premade", [True, False], ids=["mkdir-X", "no-X"])
def test_two_runs_into_one_out_publish_one_and_keep_the_other_aside_exit_1(tiny, monkeypatch, premade):
    if premade:
        (tiny / "X").mkdir()
    _run_meanwhile(monkeypatch, "seed=1")
    res = CliRunner().invoke(cli, ["run", "tiny.toml", "--out", "X", "--seed", "2", "--quiet"])
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: output folder 'X' was filled by another run"), lines
    assert "'X-2'" in lines[0]
    assert _seed(tiny / "X") == 1 and _seed(tiny / "X-2") == 2  # nothing replaced, nothing lost
    assert sorted(p.name for p in tiny.iterdir()) == ["X", "X-2", "tiny.toml"]  # no stage left


def test_overwrite_replaces_a_run_published_meanwhile(tiny, monkeypatch):
    _run_meanwhile(monkeypatch, "seed=1")
    res = CliRunner().invoke(cli, ["run", "tiny.toml", "--out", "X", "--seed", "2", "--quiet", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert _seed(tiny / "X") == 2 and sorted(p.name for p in tiny.iterdir()) == ["X", "tiny.toml"]


@pytest.mark.parametrize("fallback", [False, True], ids=["renameat2", "no-renameat2"])
def test_overwrite_swaps_the_folder_and_carries_other_files_over(tmp_path, monkeypatch, fallback):
    if fallback:
        monkeypatch.setattr(publish, "_libc_renameat2", lambda: None)
    out = tmp_path / "X"
    out.mkdir()
    (out / "summary.json").write_text("old")
    (out / "rounds.csv").write_text("old")
    (out / ".summary.json.abc.bak").write_text("left by an older version")
    (out / "notes.txt").write_text("mine")
    (out / "figs").mkdir()
    (out / "figs" / "a.png").write_text("png")
    with RunFolder(out, overwrite=True) as folder:
        folder.publish({"seed": 7}, [{"round": 1}])
    assert sorted(p.name for p in out.iterdir()) == ["figs", "notes.txt", "rounds.csv", "summary.json"]
    assert json.loads((out / "summary.json").read_text())["seed"] == 7
    assert (out / "notes.txt").read_text() == "mine" and (out / "figs" / "a.png").read_text() == "png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X"]


@pytest.mark.parametrize("fallback", [False, True], ids=["renameat2", "no-renameat2"])
def test_publish_never_renames_over_a_folder_filled_meanwhile(tmp_path, monkeypatch, fallback):
    if fallback:
        monkeypatch.setattr(publish, "_libc_renameat2", lambda: None)
    out = tmp_path / "X"
    with pytest.raises(PublishConflict) as caught, RunFolder(out) as folder:
        out.mkdir()
        (out / "summary.json").write_text("theirs")
        folder.publish({"seed": 7}, [])
    assert caught.value.kept == tmp_path / "X-2"
    assert (out / "summary.json").read_text() == "theirs" and _seed(tmp_path / "X-2") == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X", "X-2"]


def test_an_old_folder_set_aside_by_a_killed_overwrite_is_put_back_by_the_next_run(tmp_path):
    out, aside = tmp_path / "X", tmp_path / ".X.old-999999999"  # no such pid: it and its guard were killed
    aside.mkdir()
    (aside / "summary.json").write_text("old")
    clean_stale(out)
    assert (out / "summary.json").read_text() == "old" and not aside.exists()
    aside.mkdir()  # and when the new folder made it into place, the old one is removed
    clean_stale(out)
    assert not aside.exists() and (out / "summary.json").read_text() == "old"


KILLER = r"""
import os, shutil, signal, sys, tempfile
import otafl.publish as P
from pathlib import Path
out, at, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if "fallback" in mode:
    P._libc_renameat2 = lambda: None
calls = [0]
def wrap(owner, name):
    real = getattr(owner, name)
    def step(*a, **k):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    setattr(owner, name, step)
for owner, name in [(os, "rename"), (os, "replace"), (os, "rmdir"), (os, "mkdir"), (os, "link"), (os, "unlink"),
                    (os, "chmod"), (shutil, "rmtree"), (tempfile, "mkstemp"), (P, "renameat2")]:
    wrap(owner, name)
with P.RunFolder(out, overwrite="overwrite" in mode) as folder:
    folder.publish({"run": "new"}, [{"round": 1}, {"round": 2}])
print(calls[0])
"""


def _kill_at_every_step(tmp_path: Path, mode: str, old: dict[str, str] | None) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}

    def start(root: Path, at: int) -> subprocess.Popen:
        root.mkdir()
        if old is not None:
            (root / "X").mkdir()
            for name, text in old.items():
                (root / "X" / name).write_text(text)
        return subprocess.Popen([sys.executable, "-c", KILLER, str(root / "X"), str(at), mode], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    clean = start(tmp_path / "whole", 0)
    out, err = clean.communicate(timeout=60)
    assert clean.returncode == 0, err
    steps = int(out)
    new = _files(tmp_path / "whole" / "X")
    assert json.loads(new["summary.json"]) == {"run": "new"}
    procs = [(start(tmp_path / f"kill-{at}", at), tmp_path / f"kill-{at}") for at in range(1, steps + 1)]
    for proc, root in procs:
        proc.communicate(timeout=60)
        assert proc.returncode == -9, (root, proc.returncode)
    deadline = time.monotonic() + 15  # the guard processes clean up within about a second
    for proc, root in procs:
        while sorted(p.name for p in root.iterdir()) not in ([], ["X"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = sorted(p.name for p in root.iterdir())
        assert left in ([], ["X"]), (root.name, left)
        if old is None and left == []:
            continue
        assert (root / "X").is_dir(), root.name
        assert _files(root / "X") in (old, new), (root.name, _files(root / "X"))


OLD = {"rounds.csv": "round\n0\n", "summary.json": '{"run": "old"}\n'}


@pytest.mark.parametrize("mode", ["overwrite", pytest.param("overwrite-fallback", marks=pytest.mark.slow)])
def test_kill_9_at_any_step_of_overwrite_leaves_the_old_folder_or_the_new_one_whole(tmp_path, mode):
    _kill_at_every_step(tmp_path, mode, OLD)


@pytest.mark.parametrize("mode", ["new", pytest.param("new-fallback", marks=pytest.mark.slow)])
def test_kill_9_at_any_step_of_a_new_run_leaves_no_folder_or_the_whole_one(tmp_path, mode):
    _kill_at_every_step(tmp_path, mode, None)
