"""Opening a sweep's SQLite results file: the header and marker checks, connections, the
writer's advisory lock (and closing both), and SQLite errors as one line (:mod:`otafl.sweep.store`)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from otafl.errors import OtaflInputError
from otafl.sweep.durable import remove_files

try:  # POSIX advisory locks; elsewhere only SQLite's own per-transaction locking applies
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

APP_MARKER = "otafl-sweep"
READABLE_SCHEMAS = ("1", "2")  # schema 1: no recorded grid (upgraded to 2 when a sweep resumes it)
BUSY_TIMEOUT_MS = 5000
SQLITE_MAGIC = b"SQLite format 3\x00"


def _not_ours(path: Path, why: str) -> OtaflInputError:
    return OtaflInputError(f"{str(path)!r} is not an otafl results file ({why}); choose another path")


def _sqlite_error(path: Path, e: sqlite3.Error, reading: bool = False) -> OtaflInputError:
    msg = " ".join(str(e).split())
    if "locked" in msg or "busy" in msg:
        return _locked(path)
    if reading and ("readonly" in msg or "read-only" in msg or "unable to open" in msg or "disk I/O" in msg):
        return OtaflInputError(f"results file {str(path)!r} cannot be read ({msg}); a store in a read-only folder "
                               f"needs its -wal and -shm files beside it, or copy it to a writable folder")
    if "full" in msg:
        return OtaflInputError(f"results file {str(path)!r} cannot be written ({msg}); free some space or "
                               f"choose another --out path")
    if "readonly" in msg or "read-only" in msg or "unable to open" in msg or "disk I/O" in msg:
        return OtaflInputError(f"results file {str(path)!r} cannot be written ({msg}); check its permissions "
                               f"and free space, or choose another --out path")
    if "not a database" in msg or "malformed" in msg or "encrypted" in msg:
        return _not_ours(path, msg)
    return OtaflInputError(f"results file {str(path)!r}: {msg}")


def _locked(path: Path) -> OtaflInputError:
    return OtaflInputError(f"results file {str(path)!r} is locked by another process (another sweep writing "
                           f"it?); wait for it to finish or choose another --out path")


def _check_header(path: Path) -> None:
    with path.open("rb") as fh:
        if fh.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise _not_ours(path, "it is not an SQLite database")


def _check_marker(path: Path, conn: sqlite3.Connection) -> None:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" not in tables:
        raise _not_ours(path, "it has no otafl 'meta' table" if tables else "it is an empty SQLite database")
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    if meta.get("app") != APP_MARKER:
        raise _not_ours(path, f"its meta table says app = {meta.get('app')!r}, expected {APP_MARKER!r}")
    if meta.get("schema") not in READABLE_SCHEMAS:
        raise OtaflInputError(f"{str(path)!r} uses results schema {meta.get('schema')!r}; this otafl reads "
                              f"schema {' and '.join(READABLE_SCHEMAS)}")
    missing = sorted({"runs", "rounds"} - tables | ({"grid"} - tables if meta.get("schema") == "2" else set()))
    if missing:
        raise _not_ours(path, f"table {missing[0]!r} is missing")


def _connect(path: Path, mode: str, *, immutable: bool = False) -> sqlite3.Connection:
    """A connection (``mode`` ro, rw or rwc); ``immutable``: read without locks or a WAL
    (only for a file nobody can be writing, see :func:`read_only_folder_without_wal`)."""
    uri = f"file:{quote(str(path.resolve()), safe='/')}?mode={mode}{'&immutable=1' if immutable else ''}"
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                           isolation_level=None)  # explicit BEGIN/COMMIT
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def read_only_folder_without_wal(path: Path) -> bool:
    """True when ``path`` lies in a folder this process cannot write and has no WAL with
    content beside it: SQLite cannot make the -shm index a WAL-mode file needs there, but
    every committed run is in the file itself, and no sweep can be writing it (a writer
    keeps a -wal beside it), so it is read as immutable."""
    folder = path.resolve().parent
    if os.access(folder, os.W_OK):
        return False
    try:
        return os.stat(f"{path.resolve()}-wal").st_size == 0
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _writer_lock(path: Path) -> int | None:
    """Take the sweep-lifetime advisory lock on the results file; raise if another holds it."""
    if fcntl is None:  # pragma: no cover
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise _locked(path) from None
    return fd


def _close(conn: sqlite3.Connection | None, lock_fd: int | None, remove: Path | None = None) -> None:
    """Close the connection and the lock; ``remove``: delete that file (and its WAL) first."""
    if remove is not None:
        remove_files(remove)
    if conn is not None:
        conn.close()
    if lock_fd is not None:
        os.close(lock_fd)
