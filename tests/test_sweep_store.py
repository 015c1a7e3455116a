"""The SQLite results store, with fake run summaries (no training)."""

import math
import os
import sqlite3

import pytest

from otafl.errors import OtaflInputError
from otafl.sweep.executor import pending_points, run_sweep
from otafl.sweep.grid import expand_grid
from otafl.sweep.store import APP_MARKER, open_store, read_store

X = "{\"x\": 1}"  # a run's params (canonical JSON text)


def fake_summary(p=0.5, acc=0.8):
    return {"final_test_accuracy": acc, "rounds": 3, "users": 10, "scheme": "uniform", "seed": 0,
            "paper_epsilon_central": 0.7 / p, "paper_defined": True, "tight_epsilon_central": math.inf,
            "tight_reason": "mu_t <= K beta_t", "tight_epsilon_local_max": math.nan, "per_user": [1, 2],
            "bad key!": 1.0}


def fake_rounds(n=3):
    return [{"round": t + 1, "participants": 4 + t, "test_accuracy": math.nan if t < n - 1 else 0.8,
             "alignment_gain": 0.1 * (t + 1)} for t in range(n)]


def test_new_file_has_marker_and_a_done_run_has_flat_columns(tmp_path):
    path = tmp_path / "r.sqlite"
    with open_store(path) as store:
        rid = store.mark_running('{"a":1}', True, {"sampling.p": 0.5})
        assert store.status_of('{"a":1}', True) == (rid, "running")
        store.mark_done(rid, fake_summary(), fake_rounds())
        assert store.status_of('{"a":1}', True) == (rid, "done")
        assert store.status_of('{"a":1}', False) is None
    conn = sqlite3.connect(path)
    assert dict(conn.execute("SELECT key, value FROM meta"))["app"] == APP_MARKER
    row = conn.execute("SELECT status, paper_epsilon_central, paper_defined, tight_epsilon_central, "
                       "tight_epsilon_local_max, tight_reason, final_test_accuracy FROM runs").fetchone()
    assert row == ("done", pytest.approx(1.4), 1, math.inf, None, "mu_t <= K beta_t", 0.8)
    cols = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    assert "per_user" not in cols and "bad key!" not in cols  # kept in the summary JSON only
    assert conn.execute("SELECT COUNT(*), SUM(participants) FROM rounds").fetchone() == (3, 15)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    with read_store(path) as store:
        (run,) = store.runs()
        assert run.summary["per_user"] == [1, 2] and math.isnan(run.summary["tight_epsilon_local_max"])
        assert run.point == {"sampling.p": 0.5}
        recs = store.rounds(run.id)
        assert [r["round"] for r in recs] == [1, 2, 3] and math.isnan(recs[0]["test_accuracy"])


def test_a_run_that_fails_to_store_leaves_no_partial_rows(tmp_path):
    with open_store(tmp_path / "r.sqlite") as store:
        rid = store.mark_running(X, True, {})
        broken = fake_rounds() + [{"participants": 1, "new_column": 2.0}]  # no "round": fails last
        with pytest.raises(KeyError):
            store.mark_done(rid, fake_summary(), broken)
        assert store.status_of(X, True) == (rid, "running")
        assert store.conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0] == 0
        cols = {r[1] for r in store.conn.execute("PRAGMA table_info(runs)")}
        assert "paper_epsilon_central" not in cols  # the ALTER TABLE was rolled back too


def test_rerunning_a_point_replaces_its_rounds_and_keeps_one_row(tmp_path):
    with open_store(tmp_path / "r.sqlite") as store:
        rid = store.mark_running(X, True, {})
        store.mark_failed(rid, "boom\nwith a second line")
        assert store.runs("failed")[0].error == "boom with a second line"
        assert store.mark_running(X, True, {}) == rid
        store.mark_done(rid, fake_summary(), fake_rounds(3))
        store.mark_done(rid, fake_summary(), fake_rounds(2))
        assert store.count() == 1
        assert len(store.rounds(rid)) == 2


def test_existing_results_need_resume(tmp_path):
    path = tmp_path / "r.sqlite"
    with open_store(path) as store:
        store.mark_running(X, True, {})
    with pytest.raises(OtaflInputError, match="--resume"):
        open_store(path)
    with open_store(path, resume=True) as store:
        assert store.count("running") == 1


def test_a_second_writer_is_refused_while_the_first_holds_the_file(tmp_path):
    path = tmp_path / "r.sqlite"
    with open_store(path):
        with pytest.raises(OtaflInputError, match="locked by another process"):
            open_store(path, resume=True)
        with read_store(path) as reader:  # readers are welcome
            assert reader.count() == 0
    open_store(path, resume=True).close()  # released


@pytest.mark.parametrize("content", [b"hello, not a database\n", b"SQLite format 3\x00" + b"\x00" * 100])
def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path, content):
    path = tmp_path / "r.sqlite"
    path.write_bytes(content)
    with pytest.raises(OtaflInputError, match="not an otafl results file"):
        open_store(path, resume=True)
    assert path.read_bytes() == content


def test_a_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers(id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(OtaflInputError, match="not an otafl results file.*no otafl 'meta' table"):
        open_store(path, resume=True)
    with pytest.raises(OtaflInputError, match="not an otafl results file"):
        read_store(path)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta(key TEXT, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('app', 'someone-else')")
    conn.commit()
    conn.close()
    with pytest.raises(OtaflInputError, match="app = 'someone-else'"):
        open_store(path, resume=True)


def test_unwritable_locations_give_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OtaflInputError, match="cannot create folder"):
        open_store(blocker / "sub" / "r.sqlite")
    with pytest.raises(OtaflInputError, match="is a folder"):
        open_store(tmp_path)
    with pytest.raises(OtaflInputError, match="does not exist"):
        read_store(tmp_path / "missing.sqlite")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_file_is_refused(tmp_path):
    path = tmp_path / "r.sqlite"
    open_store(path).close()
    path.chmod(0o444)
    with pytest.raises(OtaflInputError, match="cannot be written"):
        open_store(path, resume=True)


def test_pending_points_skip_done_and_keep_running_and_failed(tmp_path):
    _, points = expand_grid({"data": {"name": "synthetic"}, "sweep": {"axes": {"sampling.p": [0.1, 0.2, 0.3, 0.4]}}})
    with open_store(tmp_path / "r.sqlite") as store:
        a = store.mark_running(points[0].params, True, points[0].values)
        store.mark_done(a, fake_summary(), fake_rounds())
        b = store.mark_running(points[1].params, True, points[1].values)
        store.mark_failed(b, "x")
        store.mark_running(points[2].params, True, points[2].values)
        assert [pt.index for pt in pending_points(store, points)] == [1, 2, 3]
        report = run_sweep(store, points[:1], workers=0, progress=False)  # all done: nothing runs
        assert (report.total, report.skipped, report.done) == (1, 1, 0)


def test_permission_denied_is_one_line(tmp_path, monkeypatch):
    import otafl.sweep.store as store_mod

    monkeypatch.setattr(store_mod.os, "access", lambda *a, **k: False)
    with pytest.raises(OtaflInputError, match="cannot be written \\(permission denied\\)"):
        open_store(tmp_path / "r.sqlite")
