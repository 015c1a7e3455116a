"""A new user's machine: a copy of the repository, a new virtual environment, the README's
set-up command, then the README's test command, which must pass. Twice, side by side (each
suite runs one process, so two share 2 cores without slowing each other much):

- ``lock``: the README's command as written, ``pip install -c constraints.txt torch==2.13.0
  -e ".[test]"``: the versions the tests last passed with;
- ``newest``: the same without ``-c constraints.txt``: the newest versions pyproject.toml allows
  (torch stays pinned on the command line, as the README says).

The inner suite is the default one (the README's ``pytest -q``, which leaves out ``-m slow``),
so this test, in the slow pass, never runs itself. Both commands are read from the README, so
a changed README is what is tested. Slow pass: each install and suite takes minutes.

Under ``.ci/run`` the ``lock`` route is CI's own first two steps (a new venv, the README's install
command with ``-c constraints.txt``, the README's test command, all passed before the slow pass
starts); ``.ci/run`` says so with ``OTAFL_CI_LOCK_ROUTE=passed`` and only ``newest`` runs here,
which saves CI a duplicate install and suite (~6 min). ``.ci/run`` also writes that install's
``pip freeze`` to ``OTAFL_CI_LOCK_FREEZE``: where the newest route's own install freezes to the
same list (every distribution at the same version: the lock is up to date), the README's test
command already passed on exactly those versions in this CI run, and the route says so instead
of running the same suite a second time (4 CPU-minutes); any differing version runs it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SAME = ("the newest allowed versions are the lock's (the same pip freeze): "
        "the README's test command passed on them in this CI run")


def readme_commands() -> tuple[str, str]:
    """(install, test): the README's set-up command (up to its ``&&``) and its test command."""
    text = (ROOT / "README.md").read_text()
    install = re.search(r"^\$ (pip install [^\n]*?) && otafl run", text, re.M)
    test = re.search(r"^\$ (MPLBACKEND=Agg python -m pytest -q)$", text, re.M)
    assert install and test, "the README's set-up or test command moved"
    return install.group(1), test.group(1)


def copy_tree(dest: Path) -> None:
    """The files a clone has (tracked, and new ones git does not ignore), nothing else."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the repository's files from local ones")
    for rel in filter(None, listed.stdout.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def test_the_readme_command_parser_reads_the_readme():
    install, test = readme_commands()
    assert install.startswith("pip install -c constraints.txt torch==2.13.0 -e") and '".[test]"' in install
    assert test == "MPLBACKEND=Agg python -m pytest -q"


def _start(route: str, tmp: Path, install: str, test: str) -> tuple[subprocess.Popen, Path]:
    repo, venv, log = tmp / route / "repo", tmp / route / "venv", tmp / f"{route}.log"
    repo.mkdir(parents=True)
    copy_tree(repo)
    if route == "newest":
        install = install.replace("-c constraints.txt ", "")
        assert "constraints" not in install
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OTAFL_SITE_DIR")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), OMP_NUM_THREADS="1")
    freeze = tmp / f"{route}.freeze"
    run_test = f"echo '$ {test}' && {test}"
    lock_freeze = os.environ.get("OTAFL_CI_LOCK_FREEZE", "") if route == "newest" else ""
    if lock_freeze and os.environ.get("OTAFL_CI_LOCK_ROUTE") == "passed" and Path(lock_freeze).is_file():
        run_test = (f"if cmp -s {shlex.quote(str(freeze))} {shlex.quote(lock_freeze)}; then echo {shlex.quote(SAME)}; "
                    f"else {run_test}; fi")
    script = " && ".join([f"{shlex.quote(sys.executable)} -m venv {shlex.quote(str(venv))}",
                          f"echo '$ {install}'", install, f"pip freeze --exclude-editable > {shlex.quote(str(freeze))}",
                          f"cat {shlex.quote(str(freeze))}", run_test])
    proc = subprocess.Popen(["bash", "-c", script], cwd=repo, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, log


def test_the_readme_install_and_test_commands_pass_in_new_venvs(tmp_path):
    install, test = readme_commands()
    t0 = time.monotonic()
    routes = ("newest",) if os.environ.get("OTAFL_CI_LOCK_ROUTE") == "passed" else ("lock", "newest")
    runs = {route: _start(route, tmp_path, install, test) for route in routes}
    failures = {}
    for route, (proc, log) in runs.items():
        try:
            code = proc.wait(timeout=3600)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        text = log.read_text(errors="replace")
        print(f"{route}: exit {code} after {time.monotonic() - t0:.0f} s; {text.strip().splitlines()[-1:]}")
        last = text.strip().splitlines()[-1] if text.strip() else ""
        if code != 0 or not (re.search(r"^\d+ passed", last) or (route == "newest" and last == SAME)):
            failures[route] = text[-4000:]
    assert failures == {}, "\n\n".join(f"--- {r} ---\n{t}" for r, t in failures.items())
