"""A sweep's results file that vanishes or stops taking writes mid-sweep: noticed, reported
in one line, and what was committed kept where possible (:mod:`otafl.sweep.store`)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Callable

from otafl.errors import OtaflInputError

__all__ = ["StoreLost", "check_intact", "remove_files"]


class StoreLost(OtaflInputError):
    """The results file was deleted or replaced, or a write failed (a full disk), during a sweep."""


def remove_files(path: Path) -> None:
    """Delete a results file and its SQLite side files, ignoring any that are absent."""
    for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        with contextlib.suppress(OSError):
            f.unlink()


def check_intact(conn: sqlite3.Connection, path: Path, inode: tuple[int, int],
                 count_done: Callable[[], int]) -> None:
    """Raise :class:`StoreLost` unless ``path`` is still the file (device, inode) the sweep opened.

    A deleted file is written back from the still-open connection (every committed run),
    when its path is free, so ``--resume`` can continue; a replaced one is left alone.
    """
    try:
        st = os.stat(path)
        now = (st.st_dev, st.st_ino)
    except OSError:
        now = None
    if now == inode:
        return
    kept = "the file now there is left as it is"
    if now is None:
        try:
            n = count_done()
            dst = sqlite3.connect(str(path))
            try:
                conn.backup(dst)
            finally:
                dst.close()
            kept = f"its {n} finished run(s) were written back to it"
        except (sqlite3.Error, OSError) as e:
            remove_files(path)
            kept = f"its runs could not be written back ({' '.join(str(e).split())}) and are lost"
    raise StoreLost(f"results file {str(path)!r} was {'deleted' if now is None else 'replaced'} during the "
                    f"sweep; {kept}; rerun with --resume")
