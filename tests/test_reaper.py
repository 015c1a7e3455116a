"""The guard process (otafl.reaper): cleans up after a parent killed outright, and only then."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from otafl.reaper import Reaper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def parent(tmp_path, body):
    """A child python that starts a Reaper, runs ``body``, prints 'ready' and sleeps (to be killed);
    the lines ``body`` printed are in ``proc.printed``."""
    code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        sys.path.insert(0, {REPO!r})
        from otafl.reaper import Reaper
        guard = Reaper()
        tmp = {str(tmp_path)!r}
    """) + textwrap.dedent(body) + "\nprint('ready', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    proc.printed = []  # what body printed before 'ready'
    while (line := proc.stdout.readline().strip()) != "ready":
        assert line, "the parent ended before it was ready"
        proc.printed.append(line)
    return proc


def wait_until(cond, within_s=10.0):
    deadline = time.monotonic() + within_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] not in "ZX"
    except OSError:
        return False


def test_a_killed_parent_s_registered_paths_are_removed_and_kept_ones_stay(tmp_path):
    proc = parent(tmp_path, """
        os.makedirs(os.path.join(tmp, 'made', 'stage', 'deep'))
        open(os.path.join(tmp, 'made', 'stage', 'deep', 'f'), 'w').close()
        open(os.path.join(tmp, 'file'), 'w').close()
        os.makedirs(os.path.join(tmp, 'kept'))
        guard.remove_if_empty(os.path.join(tmp, 'made'))
        guard.remove(os.path.join(tmp, 'made', 'stage'))
        guard.remove(os.path.join(tmp, 'file'))
        guard.remove(os.path.join(tmp, 'kept'))
        guard.keep(os.path.join(tmp, 'kept'))
    """)
    proc.kill()
    proc.wait()
    assert wait_until(lambda: sorted(os.listdir(tmp_path)) == ["kept"]), os.listdir(tmp_path)


def test_a_folder_registered_if_empty_survives_when_something_else_is_in_it(tmp_path):
    proc = parent(tmp_path, """
        os.makedirs(os.path.join(tmp, 'runs', 'stage'))
        open(os.path.join(tmp, 'runs', 'someone-else'), 'w').close()
        guard.remove_if_empty(os.path.join(tmp, 'runs'))
        guard.remove(os.path.join(tmp, 'runs', 'stage'))
    """)
    proc.kill()
    proc.wait()
    assert wait_until(lambda: os.listdir(tmp_path / "runs") == ["someone-else"])
    time.sleep(0.5)
    assert os.listdir(tmp_path / "runs") == ["someone-else"]


def test_a_closed_guard_does_nothing_and_exits(tmp_path):
    victim = tmp_path / "keep-me"
    victim.mkdir()
    guard = Reaper()
    guard.remove(victim)
    guard.close()
    assert guard._proc.returncode == 0 and victim.exists()
    with Reaper() as g:  # as a context manager
        g.remove(victim)
    assert victim.exists()


@linux_only
def test_a_killed_parent_s_descendants_are_ended_even_once_reparented(tmp_path):
    # a grandchild in a session of its own, re-parented when its parent exits (like Ray's agents
    # when the raylet dies): the guard still knows it from before and ends it
    proc = parent(tmp_path, """
        guard.tree()
        mid = subprocess.Popen([sys.executable, '-c',
            'import subprocess, sys, time; '
            'p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True); '
            'print(p.pid, flush=True); time.sleep(600)'], stdout=subprocess.PIPE, text=True)
        grand = int(mid.stdout.readline())
        time.sleep(0.8)  # the guard records the tree every 0.25 s
        print(mid.pid, grand, flush=True)
    """)
    mid, grand = map(int, proc.printed[0].split())
    os.kill(mid, signal.SIGKILL)  # the grandchild is re-parented now
    assert wait_until(lambda: not alive(mid))
    assert alive(grand)
    proc.kill()
    proc.wait()
    try:
        assert wait_until(lambda: not alive(grand), within_s=10), "the guard left the grandchild running"
    finally:
        if alive(grand):
            os.kill(grand, signal.SIGKILL)


@linux_only
def test_a_parent_that_ends_normally_leaves_its_children_alone(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        guard = Reaper()
        guard.tree()  # the sleeper is this process's child
        time.sleep(0.6)
        guard.close()
        time.sleep(0.3)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
