"""A guard process that cleans up after this process when it dies without the chance to
(``kill -9``, the out-of-memory killer): the staging folder of ``otafl run`` and the
processes of a Ray instance that a sweep started.

:class:`Reaper` starts ``python -I -S otafl/reaper.py PARENT_PID`` (standard library only,
about 20 ms) with a pipe on its standard input and tells it, one JSON line at a time, what
to do if the parent dies: remove a path (``remove``; ``remove_if_empty`` for a folder; taken back
by ``keep``), put a folder set aside back in place (``restore``), or end every
process that descends from the parent (``tree``: the guard records the parent's
descendants every :data:`POLL_S` while the parent lives, since a dead parent's children
are re-parented and can no longer be found through it). :meth:`Reaper.close` (a normal end,
an exception, Ctrl-C, SIGTERM) tells the guard to exit without doing anything.

The guard acts when its pipe reaches end-of-file without that ``close`` or when it is
re-parented (its parent is gone, even if a forked child still holds the pipe): it sends
SIGTERM to the recorded processes that still run (same pid *and* start time, so a reused pid
is never hit), SIGKILL after :data:`GRACE_S` to those left, removes the paths, and exits.
It runs in a session of its own, so a signal to the parent's process group (Ctrl-C, ``kill
-9 -PGID``) does not take it down before it has cleaned up; it never outlives its parent by
more than that cleanup. Descendant tracking needs Linux ``/proc`` and is a no-op elsewhere.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

POLL_S = 0.25  # how often the guard records the parent's descendants, and checks its parent
GRACE_S = 2.0  # SIGTERM -> SIGKILL


class Reaper:
    """The parent's side of the guard process (a context manager: ``close`` on exit)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)

    def _send(self, op: str, arg: str | None = None) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write((json.dumps([op, arg]) + "\n").encode())
            stdin.flush()
        except OSError:  # the guard is gone: nothing to guard with, the work goes on
            pass

    def remove(self, path: str | os.PathLike) -> None:
        """Remove ``path`` (a file or a folder tree) if this process dies before :meth:`keep`."""
        self._send("remove", os.path.abspath(path))

    def remove_if_empty(self, path: str | os.PathLike) -> None:
        """Remove the folder ``path`` if this process dies before :meth:`keep` and it is empty then
        (a parent folder this process created; paths are handled last registered, first removed)."""
        self._send("rmdir", os.path.abspath(path))

    def restore(self, aside: str | os.PathLike, path: str | os.PathLike) -> None:
        """If this process dies: rename ``aside`` back to ``path`` when ``path`` is missing (or an
        empty folder), else remove ``aside`` (``run --overwrite`` sets the old folder aside while it swaps)."""
        self._send("restore", [os.path.abspath(aside), os.path.abspath(path)])

    def keep(self, path: str | os.PathLike) -> None:
        """Take back :meth:`remove` / :meth:`remove_if_empty` for ``path`` (renamed into place, removed)."""
        self._send("keep", os.path.abspath(path))

    def tree(self) -> None:
        """End every descendant of this process (recorded from now on) if it dies."""
        self._send("tree")

    def close(self) -> None:
        """A normal end: the guard exits and does nothing."""
        self._send("exit")
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> "Reaper":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- guard side


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None if
    ``pid`` is gone or a zombie (which holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None if ``pid`` is gone."""
    fields = _stat(pid)
    return fields[19] if fields else None


def _descendants(root: int, skip: int) -> dict[int, str]:
    """{pid: start time} of every live descendant of ``root`` (but ``skip``), from /proc."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        fields = _stat(name) if name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(name))
            starts[int(name)] = fields[19]
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid == skip or pid in found:
            continue
        found[pid] = starts[pid]
        todo.extend(children.get(pid, []))
    return found


def _end(processes: dict[int, str]) -> None:
    """SIGTERM, then after GRACE_S SIGKILL, the recorded processes that are still the same ones."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = {pid for pid, start in processes.items() if _start_time(pid) == start}
        for pid in live:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGKILL or not live:
            return
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(_start_time(p) == processes[p] for p in live):
            time.sleep(0.05)


def _guard(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the parent
    paths: list[tuple[str, str]] = []  # (op, path), in the order registered
    tracking = False
    seen: dict[int, str] = {}
    buf = b""
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:  # read everything the parent sent, even once it is gone
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # end-of-file without "exit": the parent died
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                op, arg = json.loads(line)
                if op == "exit":
                    return
                if op in ("remove", "rmdir", "restore"):
                    paths.append((op, arg))
                elif op == "keep":
                    paths = [(o, p) for o, p in paths if p != arg]
                elif op == "tree":
                    tracking = True
            continue
        if os.getppid() != parent:  # re-parented: the parent died (a forked child may hold the pipe)
            break
        if tracking:
            seen.update(_descendants(parent, os.getpid()))
    if tracking:
        seen.update(_descendants(parent, os.getpid()))  # a last look (empty once re-parented)
        _end(seen)
    for op, path in reversed(paths):  # innermost (last registered) first
        try:
            if op == "rmdir":
                os.rmdir(path)  # only if empty
            elif op == "restore":
                aside, target = path
                try:
                    os.rmdir(target)  # an empty claim (mkdir before the rename) is not the new folder
                except OSError:
                    pass
                if not os.path.lexists(target):
                    os.rename(aside, target)
                elif os.path.lexists(aside):
                    shutil.rmtree(aside, ignore_errors=True)
            elif os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    _guard(int(sys.argv[1]))
