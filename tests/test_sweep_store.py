"""The SQLite results store, with fake run summaries (no training)."""

import math
import os
import sqlite3

import pytest

from otafl.errors import OtaflInputError
from otafl.sweep.executor import pending_points, run_sweep
from otafl.sweep.grid import expand_grid, grid_identity
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


# --------------------------------------------------------------------------- the sweep a file belongs to

BASE = {"data": {"name": "synthetic", "users": 8}, "channel": {"snr_db": 10.0}, "train": {"rounds": 2}}


def identity(sweep=None, base=BASE, overrides=()):
    sweep = {"axes": {"sampling.p": [0.4, 0.9]}, "seeds": [0, 1]} if sweep is None else sweep
    spec, points = expand_grid({**base, "sweep": sweep}, overrides=overrides)
    return grid_identity(spec, points), points


def start_sweep(path, grid, points, n_done=1):
    """A sweep file interrupted after ``n_done`` finished runs, the next one left ``running``."""
    with open_store(path, grid=grid) as store:
        for pt in points[:n_done]:
            store.mark_done(store.mark_running(pt.params, pt.train, pt.values), fake_summary(), fake_rounds())
        store.mark_running(points[n_done].params, points[n_done].train, points[n_done].values)


@pytest.mark.parametrize("sweep, overrides, needle", [
    (None, ["train.rounds=3"], "train.rounds: 2 in the store, 3 now"),
    ({"axes": {"sampling.p": [0.4, 0.5]}, "seeds": [0, 1]}, [], "sweep.axes.sampling.p: [0.4, 0.9] in the store, "
                                                                "[0.4, 0.5] now"),
    ({"axes": {"sampling.p": [0.4, 0.9]}, "seeds": [0, 1, 2]}, [], "sweep.seeds: [0, 1] in the store, [0, 1, 2] now"),
    ({"axes": {"sampling.p": [0.4, 0.9], "channel.snr_db": [0.0]}, "seeds": [0, 1]}, [],
     "sweep.axes.channel.snr_db: (none) in the store, [0.0] now"),
    (None, ["sweep.train=false"], "sweep.train: true in the store, false now"),
    (None, ["data.users=9"], "data.users: 8 in the store, 9 now"),
])
def test_resuming_a_file_of_another_sweep_is_refused_naming_the_first_differing_key(tmp_path, sweep, overrides,
                                                                                       needle):
    path = tmp_path / "r.sqlite"
    grid, points = identity()
    start_sweep(path, grid, points)
    other, _ = identity(sweep, overrides=overrides)
    with pytest.raises(OtaflInputError) as err:
        open_store(path, resume=True, grid=other)
    msg = str(err.value)
    assert "holds a different sweep" in msg and needle in msg and "\n" not in msg, msg
    with read_store(path) as store:  # untouched
        assert store.count() == 2 and store.count("running") == 1
        assert store.meta()["grid_sha256"] == grid.digest
    open_store(path, resume=True, grid=grid).close()  # the file is not locked by the refusal


def test_the_same_grid_written_differently_resumes(tmp_path):
    path = tmp_path / "r.sqlite"
    grid, points = identity({"axes": {"sampling.p": [0.4, 0.9], "channel.snr_db": [0.0, 10.0]}, "seeds": [0, 1]})
    start_sweep(path, grid, points)
    same, _ = identity({"axes": {"channel.snr_db": [10.0, 0.0], "sampling.p": [0.9, 0.4]}, "seeds": [1, 0]})
    assert same.digest == grid.digest and [e[0] for e in same.entries] != [e[0] for e in grid.entries]
    with open_store(path, resume=True, grid=same) as store:
        assert store.count() == 2


def test_an_empty_file_takes_the_grid_of_the_sweep_that_writes_it(tmp_path):
    path = tmp_path / "r.sqlite"
    first, _ = identity()
    open_store(path, grid=first).close()  # created, nothing run
    second, points = identity(overrides=["train.rounds=3"])
    with open_store(path, grid=second) as store:
        assert store.meta()["grid_sha256"] == second.digest and store.meta()["schema"] == "2"
        assert [e[0] for e in store.grid_entries()] == [pt.params for pt in points]


def test_stale_running_rows_of_a_resumed_sweep_are_rerun_in_place_and_never_duplicated(tmp_path):
    path = tmp_path / "r.sqlite"
    grid, points = identity()
    start_sweep(path, grid, points, n_done=1)
    with open_store(path, resume=True, grid=grid) as store:
        stale = store.status_of(points[1].params, True)
        assert stale[1] == "running"
        report = run_sweep(store, points, workers=0, progress=False)
        assert (report.total, report.skipped, report.done, report.failed) == (4, 1, 3, 0)
        assert store.status_of(points[1].params, True) == (stale[0], "done")  # same row, replaced
        assert store.count() == store.count("done") == len(points) == 4
        assert len(store.rounds(stale[0])) == 2  # the rerun's rounds (train.rounds = 2), not the stale ones
        assert pending_points(store, points) == []


def make_schema_1(path, points, n_done=2):
    """A results file as the previous otafl wrote it: schema 1, no recorded grid."""
    with open_store(path) as store:
        for pt in points[:n_done]:
            store.mark_done(store.mark_running(pt.params, pt.train, pt.values), fake_summary(), fake_rounds())
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE grid")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    conn.commit()
    conn.close()


def test_a_schema_1_file_is_read_and_a_resume_of_its_own_sweep_records_the_grid(tmp_path):
    path = tmp_path / "old.sqlite"
    grid, points = identity()
    make_schema_1(path, points)
    with read_store(path) as store:
        assert len(store.runs()) == 2 and store.grid_entries() == []
    with open_store(path, resume=True, grid=grid) as store:
        assert store.meta()["schema"] == "2" and store.meta()["grid_sha256"] == grid.digest
        assert len(store.grid_entries()) == 4 and store.count("done") == 2


def test_a_schema_1_file_of_another_sweep_is_refused_naming_the_key_and_left_at_schema_1(tmp_path):
    path = tmp_path / "old.sqlite"
    _, points = identity()
    make_schema_1(path, points)
    other, _ = identity(overrides=["train.rounds=5"])
    with pytest.raises(OtaflInputError, match=r"different sweep \(train.rounds: 2 in the store, 5 now \(grid point "
                                              r"sampling.p=0.4, train.seed=0\)\)"):
        open_store(path, resume=True, grid=other)
    with read_store(path) as store:
        assert store.meta()["schema"] == "1"


def test_a_file_of_a_newer_schema_is_refused_with_one_line(tmp_path):
    path = tmp_path / "new.sqlite"
    open_store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    for opener in (read_store, lambda p: open_store(p, resume=True)):
        with pytest.raises(OtaflInputError, match="uses results schema '99'; this otafl reads schema 1 and 2"):
            opener(path)
