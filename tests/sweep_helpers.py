"""Helpers shared by the sweep tests (process pool and Ray executor)."""

import sqlite3

from click.testing import CliRunner

from otafl.cli.main import cli


def invoke(*args):
    """``otafl sweep ARGS --quiet`` through click's runner."""
    return CliRunner().invoke(cli, ["sweep", *args, "--quiet"])


def rows(db, sql):
    """The rows of one SQL query on a results file."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def swept_store(tmp, spec: str, *extra: str, name: str = "r.sqlite"):
    """Write ``spec`` to ``tmp/s.toml``, sweep it in-process into ``tmp/name`` (``extra``: more
    sweep options) and return the results file; the sweep must succeed."""
    (tmp / "s.toml").write_text(spec)
    db = tmp / name
    res = invoke(str(tmp / "s.toml"), "--out", str(db), "--workers", "0", *extra)
    assert res.exit_code == 0, res.output
    return db
