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
