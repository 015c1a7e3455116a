"""A sweep's results file that vanishes or stops taking writes mid-sweep: noticed, reported
in one line, and what was committed kept where possible (:mod:`otafl.sweep.store`)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Callable

from otafl.errors import OtaflInputError

__all__ = ["ShmGuard", "SideFileWatch", "StoreLost", "check_intact", "inode_of", "remove_files",
           "remove_own_side_files", "side_inodes"]

#: The WAL and shared-memory index of a WAL-mode database. SQLite finds them by NAME only: a
#: WAL left beside a file that replaced the database would be replayed into that file by its
#: next reader (and checkpointed into it for good), so a sweep removes its own at once.
SIDE_SUFFIXES = ("-wal", "-shm")
WATCH_INTERVAL_S = 0.2


class StoreLost(OtaflInputError):
    """The results file was deleted or replaced, or a write failed (a full disk), during a sweep.
    ``written_back``: (device, inode) of the copy written back at the path of a deleted file."""

    written_back: tuple[int, int] | None = None


def inode_of(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path`` (links followed); None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def side_inodes(path: Path) -> dict[str, tuple[int, int]]:
    """(device, inode) of ``path-wal`` and ``path-shm`` as they are now (the ones this
    process's connection opened, when called right after opening it)."""
    out = {}
    for suffix in SIDE_SUFFIXES:
        with contextlib.suppress(OSError):
            st = os.lstat(f"{path}{suffix}")
            out[suffix] = (st.st_dev, st.st_ino)
    return out


def remove_own_side_files(path: Path, side: dict[str, tuple[int, int]]) -> None:
    """Unlink ``path-wal`` / ``path-shm`` if they are still the files recorded in ``side``
    (same inode); another database's side files of the same name are left alone. The open
    connection keeps using its unlinked files and, its database being moved, closes without
    a checkpoint (SQLite checks that), so nothing of ours reaches the file now at ``path``."""
    for suffix, inode in side.items():
        name = f"{path}{suffix}"
        try:
            st = os.lstat(name)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == inode:
            with contextlib.suppress(OSError):
                os.unlink(name)


SHM_REGION = 32768  # SQLite maps its -shm index in regions of 32 KiB, ...
FRAMES_PER_REGION = 4062  # ... each indexing this many WAL frames (the first region a few less)


class ShmGuard:
    """The sweep's ``-shm``, held open. SQLite maps that index into memory, so a truncation
    by another process (issue 32) killed the sweep with SIGBUS and no message at its next
    access. :meth:`repair`, called by the watch thread every :data:`WATCH_INTERVAL_S` and
    before each transaction, extends a truncated index back to its size (zeros: SQLite then
    rebuilds it from the WAL, where every committed run is) and remembers that it did; the
    sweep then stops with one line (:meth:`ResultStore._transaction`). A truncation in the
    milliseconds of a commit itself is not covered."""

    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self.wal = f"{path}-wal"
        self.repaired = False
        try:
            self.fd: int | None = os.open(f"{path}-shm", os.O_RDWR)
            self.largest = os.fstat(self.fd).st_size
        except OSError:
            self.fd, self.largest = None, 0

    def _wal_regions_bytes(self) -> int:
        """The index size the WAL's frames need (a growth between two looks is not missed)."""
        try:
            with open(self.wal, "rb") as fh:
                head = fh.read(32)
                size = os.fstat(fh.fileno()).st_size
        except OSError:
            return 0
        page = int.from_bytes(head[8:12], "big") if len(head) == 32 else 0
        if page < 512:
            return 0
        frames = max(0, size - 32) // (page + 24)
        return SHM_REGION * (1 + frames // FRAMES_PER_REGION)

    def repair(self) -> bool:
        """Extend the index back if it shrank since the last look; True if it did (now or before)."""
        with self._lock:
            if self.fd is None:
                return self.repaired
            try:
                size = os.fstat(self.fd).st_size
                if size >= self.largest:
                    self.largest = size
                    return self.repaired
                os.ftruncate(self.fd, max(self.largest, self._wal_regions_bytes()))
                self.repaired = True
            except OSError:
                pass
            return self.repaired

    @staticmethod
    def lost(path: Path, done: int) -> StoreLost:
        return StoreLost(f"the index {str(path)}-shm of results file {str(path)!r} was truncated by another "
                         f"process during the sweep (restored: {done} finished run(s) kept); rerun with --resume")

    def close(self) -> None:
        with self._lock:
            if self.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
                self.fd = None


class SideFileWatch:
    """A daemon thread that checks every :data:`WATCH_INTERVAL_S` seconds that ``path`` is
    still the file (``inode``) a sweep writes and, the moment it was deleted or replaced,
    removes the sweep's own side files (:func:`remove_own_side_files`): a reader of the new
    file in the meantime (``otafl table``) would otherwise replay our WAL into it. The sweep
    itself notices at its next commit (:func:`check_intact`) and stops with one line."""

    def __init__(self, path: Path, inode: tuple[int, int], side: dict[str, tuple[int, int]],
                 interval: float = WATCH_INTERVAL_S, shm: ShmGuard | None = None):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(path, inode, side, interval, shm), daemon=True,
                                        name="otafl-store-watch")
        self._thread.start()

    def _watch(self, path: Path, inode: tuple[int, int], side: dict[str, tuple[int, int]], interval: float,
               shm: ShmGuard | None) -> None:
        while not self._stop.wait(interval):
            if shm is not None:
                shm.repair()
            if inode_of(path) != inode:
                remove_own_side_files(path, side)
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def remove_files(path: Path) -> None:
    """Delete a results file and its SQLite side files, ignoring any that are absent."""
    for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        with contextlib.suppress(OSError):
            f.unlink()


def check_intact(conn: sqlite3.Connection, path: Path, inode: tuple[int, int],
                 count_done: Callable[[], int], side: dict[str, tuple[int, int]] | None = None) -> None:
    """Raise :class:`StoreLost` unless ``path`` is still the file (device, inode) the sweep opened.

    First the sweep's own ``-wal`` and ``-shm`` (``side``, :func:`side_inodes`) are removed.
    A deleted file is written back from the still-open connection (every committed run),
    when its path is free, so ``--resume`` can continue; a replaced one is left alone.
    """
    now = inode_of(path)
    if now == inode:
        return
    remove_own_side_files(path, side or {})
    kept = "the file now there is left as it is"
    written_back = None
    if now is None:
        try:
            n = count_done()
            dst = sqlite3.connect(str(path))
            try:
                conn.backup(dst)
            finally:
                dst.close()
            kept = f"its {n} finished run(s) were written back to it"
            written_back = inode_of(path)
        except (sqlite3.Error, OSError) as e:
            remove_files(path)
            kept = f"its runs could not be written back ({' '.join(str(e).split())}) and are lost"
    err = StoreLost(f"results file {str(path)!r} was {'deleted' if now is None else 'replaced'} during the "
                    f"sweep; {kept}; rerun with --resume")
    err.written_back = written_back
    raise err
