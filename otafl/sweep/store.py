"""The SQLite results store of a sweep: one file, queryable, safe against crashes.

Schema (``SCHEMA_VERSION`` 2)::

    meta(key TEXT PRIMARY KEY, value TEXT)   -- ('app', 'otafl-sweep'), ('schema', '2'), ('created_at', ...),
                                             -- the sweep's identity: ('grid_sha256', ...), ('grid_points', N),
                                             -- ('sweep', JSON [[key, value], ...]: sweep.* keys and the spec
                                             --  values every point shares, for "what differs" messages)
    grid(idx INTEGER PRIMARY KEY,           -- the sweep's grid points in run order
         params TEXT, train INTEGER, point TEXT, UNIQUE(params, train))
    runs(id INTEGER PRIMARY KEY,
         params TEXT,          -- the run's full spec as canonical JSON (Spec.canonical_json)
         train INTEGER,        -- 1: trained, 0: bounds only
         point TEXT,           -- JSON of the grid values that made the run, {"sampling.p": 0.1, "train.seed": 0}
         status TEXT,          -- running | done | failed
         error TEXT,           -- one line, for failed runs
         started_at REAL, finished_at REAL,     -- Unix time [s]
         summary TEXT,         -- the whole run summary as JSON (non-finite floats as "nan"/"inf")
         <one column per scalar summary field>, -- added when first seen: final_test_accuracy,
                                                -- paper_epsilon_central, mean_participants, ...
         UNIQUE(params, train))
    rounds(run_id INTEGER REFERENCES runs(id) ON DELETE CASCADE, round INTEGER,
           <one column per per-round field>, PRIMARY KEY(run_id, round))

A results file belongs to one sweep: the first sweep that writes it records its grid
(:class:`GridIdentity`), and a later ``--resume`` with a different grid (another spec
file, other axes, seeds or ``--set`` values) is refused with one line naming the first
differing key, e.g. ``train.rounds: 3 in the store, 4 now``. Schema 1 files (no recorded
grid) are read as before; resuming one records the grid if every stored run belongs to it
(and upgrades the file to schema 2), otherwise it is refused the same way.

A run's row becomes ``running`` when the run is handed to a worker (committed at once).
The finished run's ``runs`` update, any new columns and all of its ``rounds`` rows are ONE
transaction, so a crash leaves each run either ``done`` with all its rounds or not
``done``. Flat columns store NaN as NULL (SQLite has no NaN; ``summary`` keeps it);
+-inf stays a REAL, so ``WHERE paper_epsilon_central < 1`` works as expected.

Concurrency: WAL journal and a busy timeout, so ``otafl table`` can read while a sweep
writes. Only the sweep's parent process writes; it holds an advisory ``flock`` on the
file for the whole sweep (released by the OS even on SIGKILL), so a second sweep on the
same file stops with a one-line "locked" error instead of running the same points twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from otafl.errors import OtaflInputError
from otafl.results import jsonable, unjson
from otafl.sweep.durable import ShmGuard, SideFileWatch, StoreLost, check_intact, inode_of, side_inodes
from otafl.sweep.sqlite_files import (APP_MARKER, _check_header, _check_marker, _close, _connect, _not_ours,
                                      _sqlite_error, _writer_lock, read_only_folder_without_wal)
from otafl.sweep.identity import GridIdentity, grid_difference

__all__ = ["APP_MARKER", "SCHEMA_VERSION", "STATUSES", "GridIdentity", "ResultStore", "StoreLost", "StoredRun",
           "discard_if_empty", "open_store", "read_store"]

SCHEMA_VERSION = 2
STATUSES = ("running", "done", "failed")

FIXED_RUN_COLUMNS = ("id", "params", "train", "point", "status", "error", "started_at", "finished_at", "summary")
FIXED_ROUND_COLUMNS = ("run_id", "round")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_GRID_TABLE = ("CREATE TABLE grid("
               " idx INTEGER PRIMARY KEY, params TEXT NOT NULL, train INTEGER NOT NULL, point TEXT,"
               " UNIQUE(params, train))")
_SCHEMA = (
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE runs("
    " id INTEGER PRIMARY KEY, params TEXT NOT NULL, train INTEGER NOT NULL, point TEXT,"
    " status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')), error TEXT,"
    " started_at REAL, finished_at REAL, summary TEXT, UNIQUE(params, train))",
    "CREATE TABLE rounds("
    " run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, round INTEGER NOT NULL,"
    " PRIMARY KEY(run_id, round))",
    _GRID_TABLE,
)
def _scalar(value: Any) -> Any:
    """Python scalar for SQLite: tensors/numpy 0-d -> number, bool -> 0/1; None for non-scalars."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)) or value is None:
        return value
    return None


def _affinity(value: Any) -> str | None:
    """Declared type of a new flat column holding ``value``; None: not a scalar (JSON only)."""
    v = _scalar(value)
    if v is None:
        return None if value is not None else ""
    return {int: "INTEGER", float: "REAL", str: "TEXT"}[type(v)]


@dataclass(frozen=True)
class StoredRun:
    """One ``runs`` row read back: identity, status, decoded spec and summary."""

    id: int
    params: dict
    train: bool
    point: dict
    status: str
    error: str | None
    summary: dict


class ResultStore:
    """A sweep's results file (see the module docstring). Open with :func:`open_store`
    (writing) or :func:`read_store` (reading)."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock_fd: int | None = None):
        self.path = path
        self.conn = conn
        self._lock_fd = lock_fd
        st = os.fstat(lock_fd) if lock_fd is not None else None
        self._inode = (st.st_dev, st.st_ino) if st is not None else None
        self._run_cols = self._columns("runs")
        self._round_cols = self._columns("rounds")
        # a writer's -wal and -shm (open now): removed at once should the file be deleted or replaced
        self._side = side_inodes(path) if self._inode is not None else {}
        self._shm = ShmGuard(path) if self._inode is not None else None  # a truncated -shm: SIGBUS otherwise
        self._watch = SideFileWatch(path, self._inode, self._side, shm=self._shm) if self._inode is not None else None

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def close(self) -> None:
        self._stop_watch()
        if self._shm is not None:
            self._shm.repair()  # closing checkpoints through the index
        self.conn.close()
        if self._shm is not None:  # after the connection: closing an fd of the -shm drops SQLite's locks on it
            self._shm.close()
        if self._lock_fd is not None:  # after the connection: closing an fd drops the process's locks
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction; an SQLite error (a full disk, a vanished file) becomes a
        one-line :class:`StoreLost` (or :class:`OtaflInputError` for a lock) and rolls back."""
        if self._shm is not None and self._shm.repair():
            raise self._shm.lost(self.path, self.count("done"))
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            err = _sqlite_error(self.path, e)
            if "locked" in str(err):
                raise err from None
            raise StoreLost(f"{err}; {self.count('done')} finished run(s) kept, rerun with --resume") from None
        self.check_intact()

    def check_intact(self) -> None:
        """Raise :class:`StoreLost` if the results file was deleted or replaced since it was
        opened (a deleted one is first written back from the open connection)."""
        if self._inode is not None:
            inode, self._inode = self._inode, None  # report once
            try:
                check_intact(self.conn, self.path, inode, lambda: self.count("done"), self._side)
            except StoreLost as e:
                self._inode = e.written_back  # the file now at the path is ours only if written back
                raise
            self._inode = inode

    def _columns(self, table: str) -> set[str]:
        return {row[1] for row in self.conn.execute(f'PRAGMA table_info("{table}")')}

    def _flat_fields(self, table: str, known: set[str], record: Mapping[str, Any], fixed: tuple[str, ...]) -> list[str]:
        """Scalar fields of ``record`` that get a column (adding new columns); inside a transaction."""
        fields = []
        for name, value in record.items():
            if name in fixed or not _IDENT.match(name):
                continue
            kind = _affinity(value)
            if kind is None:
                continue
            if name not in known:
                self.conn.execute(f'ALTER TABLE "{table}" ADD COLUMN "{name}" {kind}'.rstrip())
                known.add(name)
            fields.append(name)
        return fields

    # -- queries ------------------------------------------------------------------------
    def count(self, status: str | None = None) -> int:
        if status is None:
            return int(self.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
        return int(self.conn.execute("SELECT COUNT(*) FROM runs WHERE status = ?", (status,)).fetchone()[0])

    def status_of(self, params: str, train: bool) -> tuple[int, str] | None:
        """(id, status) of the run with these params, or None if it was never started."""
        row = self.conn.execute("SELECT id, status FROM runs WHERE params = ? AND train = ?",
                                (params, int(train))).fetchone()
        return (int(row[0]), str(row[1])) if row else None

    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta"))

    def grid_entries(self) -> list[tuple[str, bool, str]]:
        """The recorded grid (params, train, point JSON) in run order; empty if none is recorded."""
        if "grid" not in self._tables():
            return []
        return [(p, bool(t), pt) for p, t, pt in
                self.conn.execute("SELECT params, train, point FROM grid ORDER BY idx")]

    def _tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    # -- the sweep this file belongs to ---------------------------------------------------
    def check_grid(self, grid: GridIdentity) -> None:
        """Raise a one-line :class:`OtaflInputError` unless this file's runs belong to ``grid``.

        A file with no runs fits any grid. A file with a recorded grid fits only the same
        grid (same digest). A file without one (schema 1) fits if every stored run is a
        point of ``grid``.
        """
        if self.count() == 0:
            return
        meta = self.meta()
        recorded = meta.get("grid_sha256")
        if recorded == grid.digest:
            return
        if recorded is None:
            ids = {(p, bool(t)) for p, t, _ in grid.entries}
            stored = [(p, bool(t), pt) for p, t, pt in self.conn.execute(
                "SELECT params, train, point FROM runs ORDER BY id")]
            if all((p, t) in ids for p, t, _ in stored):
                return
            why = grid_difference(None, grid, stored)
        else:
            desc = json.loads(meta["sweep"]) if "sweep" in meta else None
            why = grid_difference(desc, grid, self.grid_entries())
        raise OtaflInputError(f"results file {str(self.path)!r} holds a different sweep ({why}); resume it with "
                              f"the command that started it, or choose another --out path")

    def record_grid(self, grid: GridIdentity) -> None:
        """Record ``grid`` as this file's sweep (after :meth:`check_grid`); upgrades schema 1."""
        meta = self.meta()
        if meta.get("schema") == str(SCHEMA_VERSION) and meta.get("grid_sha256") == grid.digest:
            return
        with self._transaction():
            if "grid" not in self._tables():
                self.conn.execute(_GRID_TABLE)
            self.conn.execute("DELETE FROM grid")
            self.conn.executemany("INSERT INTO grid(idx, params, train, point) VALUES (?, ?, ?, ?)",
                                  ((i, p, int(t), pt) for i, (p, t, pt) in enumerate(grid.entries)))
            self.conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [("schema", str(SCHEMA_VERSION)), ("grid_sha256", grid.digest),
                 ("grid_points", str(len(grid.entries))),
                 ("sweep", json.dumps(jsonable([list(kv) for kv in grid.description])))])

    # -- writes -------------------------------------------------------------------------
    def mark_running(self, params: str, train: bool, point: Mapping[str, Any]) -> int:
        """Insert (or reset) the run's row as ``running``, committed at once; returns its id."""
        with self._transaction():
            self.conn.execute(
                "INSERT INTO runs(params, train, point, status, started_at) VALUES (?, ?, ?, 'running', ?) "
                "ON CONFLICT(params, train) DO UPDATE SET status = 'running', error = NULL, "
                "started_at = excluded.started_at, finished_at = NULL, point = excluded.point",
                (params, int(train), json.dumps(jsonable(dict(point)), sort_keys=True), time.time()))
            row = self.conn.execute("SELECT id FROM runs WHERE params = ? AND train = ?",
                                    (params, int(train))).fetchone()
        return int(row[0])

    def mark_done(self, run_id: int, summary: Mapping[str, Any], rounds: Iterable[Mapping[str, Any]]) -> None:
        """Store a finished run, its summary columns and all of its rounds, in ONE transaction."""
        rounds = list(rounds)
        with self._transaction():
            cols = self._flat_fields("runs", self._run_cols, summary, FIXED_RUN_COLUMNS)
            sets = "".join(f', "{c}" = ?' for c in cols)
            self.conn.execute(
                f"UPDATE runs SET status = 'done', error = NULL, finished_at = ?, summary = ?{sets} WHERE id = ?",
                (time.time(), json.dumps(jsonable(dict(summary)), sort_keys=True),
                 *(_scalar(summary[c]) for c in cols), run_id))
            self.conn.execute("DELETE FROM rounds WHERE run_id = ?", (run_id,))
            for rec in rounds:
                rcols = self._flat_fields("rounds", self._round_cols, rec, FIXED_ROUND_COLUMNS)
                names = ", ".join(["run_id", "round", *(f'"{c}"' for c in rcols)])
                marks = ", ".join("?" * (2 + len(rcols)))
                self.conn.execute(f"INSERT INTO rounds({names}) VALUES ({marks})",
                                  (run_id, int(rec["round"]), *(_scalar(rec[c]) for c in rcols)))

    def mark_failed(self, run_id: int, error: str) -> None:
        """Record a failed run with a one-line error (``--resume`` reruns it)."""
        with self._transaction():
            self.conn.execute("UPDATE runs SET status = 'failed', error = ?, finished_at = ? WHERE id = ?",
                              (" ".join(str(error).split())[:2000], time.time(), run_id))

    # -- reads --------------------------------------------------------------------------
    def runs(self, status: str | None = "done") -> list[StoredRun]:
        """Runs with ``status`` (None: all), in id order, with decoded params and summary."""
        sql = "SELECT id, params, train, point, status, error, summary FROM runs"
        args: tuple = ()
        if status is not None:
            sql += " WHERE status = ?"
            args = (status,)
        with self._damage_is_one_line():
            rows = self.conn.execute(sql + " ORDER BY id", args).fetchall()
        out = []
        for rid, params, train, point, st, err, summary in rows:
            with self._damage_is_one_line(f"run {rid}"):
                out.append(StoredRun(id=int(rid), params=_json_object(params, "params"), train=bool(train),
                                     point=_json_object(point, "point") if point else {}, status=st, error=err,
                                     summary=unjson(_json_object(summary, "summary")) if summary else {}))
        return out

    def rounds(self, run_id: int) -> list[dict]:
        """The run's per-round rows in round order; NULL (a stored NaN) comes back as NaN."""
        with self._damage_is_one_line(f"run {run_id}"):
            cur = self.conn.execute("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,))
            names = [d[0] for d in cur.description]
            return [{n: (math.nan if v is None else v) for n, v in zip(names, row)} for row in cur]

    @contextlib.contextmanager
    def _damage_is_one_line(self, where: str = "") -> Iterator[None]:
        """A row that cannot be decoded (invalid JSON or UTF-8, a wrong type: a damaged or
        hand-edited file) refuses the whole file in one line; no row is silently skipped."""
        try:
            yield
        except (ValueError, TypeError, RecursionError, sqlite3.Error) as e:
            if isinstance(e, OtaflInputError):
                raise
            if isinstance(e, sqlite3.Error) and not isinstance(e, (sqlite3.OperationalError, sqlite3.DataError)):
                raise _sqlite_error(self.path, e, reading=True) from None
            why = " ".join(str(e).split())[:200]
            raise OtaflInputError(f"results file {str(self.path)!r} is damaged ({where + ': ' if where else ''}{why}); "
                                  f"restore it from a copy or rerun the sweep into a new file") from None


# --------------------------------------------------------------------------- opening


def _json_object(text: Any, column: str) -> Any:
    """A JSON object column's value; a ValueError naming the column if it is not one."""
    if not isinstance(text, str):
        raise ValueError(f"{column} is {type(text).__name__}, not JSON text")
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{column} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{column} is a JSON {type(value).__name__}, not an object")
    return value


def open_store(path: str | Path, *, resume: bool = False, grid: GridIdentity | None = None) -> ResultStore:
    """Open (or create) a results file for a sweep to write.

    Without ``resume``, a file that already holds runs is refused, so a second sweep never
    mixes silently into the first; with ``resume`` its runs are kept and the sweep skips
    the ``done`` ones. With ``grid`` (:func:`otafl.sweep.grid.grid_identity`), the file
    records the sweep it belongs to, and a file holding runs of a different sweep is
    refused, naming the first differing key (:meth:`ResultStore.check_grid`). A path that
    is a folder, a file that is not an otafl results file, one locked by another sweep, or
    one that cannot be written: one-line :class:`OtaflInputError`.
    """
    from otafl.results import check_path_fits, output_target

    check_path_fits(path, "results file")
    p = Path(path)
    if p.is_dir():
        raise OtaflInputError(f"results path {str(p)!r} is a folder; give a file name such as results.sqlite")
    p = output_target(p, "results file")  # too long, a device node, a FIFO: refused before anything is made
    if p.is_file() and p.stat().st_size > 0:
        if not os.access(p, os.R_OK):
            raise OtaflInputError(f"results file {str(p)!r} cannot be read (permission denied)")
        _check_header(p)
    parent = p.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OtaflInputError(f"cannot create folder {str(parent)!r} for the results file: {e.strerror}") from None
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise OtaflInputError(f"results file {str(p)!r} cannot be written (permission denied); "
                              f"choose another --out path")
    created = not p.exists()
    lock_fd = _writer_lock(p)
    conn = store = None
    try:
        conn = _connect(p, "rwc")
        conn.execute("BEGIN IMMEDIATE")
        if not conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            if not created and p.stat().st_size > 0:  # someone's SQLite database: table and plot refuse it too
                raise _not_ours(p, "it is an SQLite database without tables")
            for stmt in _SCHEMA:
                conn.execute(stmt)
            conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)",
                             [("app", APP_MARKER), ("schema", str(SCHEMA_VERSION)), ("created_at", repr(time.time()))])
        conn.execute("COMMIT")
        _check_marker(p, conn)
        conn.execute("PRAGMA journal_mode = WAL")
        store = ResultStore(p, conn, lock_fd)
        if grid is not None:
            store.check_grid(grid)
        n = store.count()
        if not resume and n > 0:
            raise OtaflInputError(f"results file {str(p)!r} already holds {n} run(s); pass --resume to continue "
                                  f"that sweep, or choose another --out path")
        if grid is not None:
            store.record_grid(grid)
    except BaseException as e:
        if store is not None:
            store._stop_watch()
        _close(conn, lock_fd, p if created else None)
        if store is not None and store._shm is not None:
            store._shm.close()  # after the connection (closing an fd of the -shm drops SQLite's locks on it)
        if isinstance(e, sqlite3.Error):
            raise _sqlite_error(p, e) from None
        raise
    store.created = created
    return store


def discard_if_empty(store: ResultStore) -> bool:
    """Close ``store``; delete its file if this sweep created it and finished no run (and the
    file at its path is still that one: a file that replaced it is never deleted)."""
    empty = False
    store._stop_watch()
    if store._shm is not None:
        store._shm.repair()
    if getattr(store, "created", False) and store._inode is not None and inode_of(store.path) == store._inode:
        with contextlib.suppress(sqlite3.Error):
            empty = store.count("done") + store.count("failed") == 0
    _close(store.conn, store._lock_fd, store.path if empty else None)
    store._lock_fd = None
    if store._shm is not None:
        store._shm.close()  # after the connection (closing an fd of the -shm drops SQLite's locks on it)
    return empty


def read_store(path: str | Path) -> ResultStore:
    """Open a results file for reading (``otafl table``, ``otafl plot``); works during a sweep."""
    p = Path(path)
    if not p.exists():
        raise OtaflInputError(f"results file {str(p)!r} does not exist")
    if not p.is_file():
        raise _not_ours(p, "it is a folder" if p.is_dir() else "it is not a regular file")
    if p.stat().st_size == 0:
        raise _not_ours(p, "it is empty")
    _check_header(p)
    conn = None
    try:
        # mode=ro cannot open a WAL database whose -shm is missing in a read-only folder; rw
        # is used where the folder allows it, and the reader issues no writes. In a read-only
        # folder without a WAL (a copied or archived store) the file is read as immutable.
        mode = "rw" if os.access(p.resolve().parent, os.W_OK) and os.access(p, os.W_OK) else "ro"
        try:
            conn = _connect(p, mode)
            _check_marker(p, conn)
        except sqlite3.Error:
            if mode == "rw" or not read_only_folder_without_wal(p):
                raise
            _close(conn, None)
            conn = None
            conn = _connect(p, "ro", immutable=True)
            _check_marker(p, conn)
        return ResultStore(p, conn)
    except sqlite3.Error as e:
        _close(conn, None)
        raise _sqlite_error(p, e, reading=True) from None
    except BaseException:
        _close(conn, None)
        raise
