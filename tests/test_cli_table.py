"""`otafl table`: layout (columns, rows, grouping) on stored fake summaries, plus one real sweep."""

import csv
import io
import math

import pytest
from click.testing import CliRunner

from otafl.cli.main import cli
from otafl.report.table import METRICS, tradeoff_table
from otafl.sweep.grid import expand_grid
from otafl.sweep.store import open_store, read_store

ACCS = {0: 0.80, 1: 0.82, 2: 0.84}  # per seed: mean 82.0 %, sample std 2.0 %


def fake_results(path, axes, points=(), seeds=(0, 1, 2), central=lambda p, seed: 1.0 / p):
    """A results file whose runs have real specs (from a grid) and made-up summaries."""
    raw = {"data": {"name": "synthetic", "users": 10}, "train": {"rounds": 5},
           "sweep": {"axes": axes, "points": list(points), "seeds": list(seeds)}}
    _, grid = expand_grid(raw)
    with open_store(path) as store:
        for pt in grid:
            s = pt.spec
            p = s.sampling.p if s.sampling.scheme == "uniform" else 0.25
            summary = {"final_test_accuracy": ACCS[s.train.seed], "rounds": 5, "users": 10,
                       "mean_participants": 10 * p, "scheme": s.sampling.scheme, "seed": s.train.seed}
            for a in ("paper", "tight"):
                scale = 2.0 if a == "paper" else 1.0
                summary.update({f"{a}_epsilon_local_max": scale * 3.0, f"{a}_epsilon_local_total": scale * 15.0,
                                f"{a}_epsilon_central": scale * central(p, s.train.seed),
                                f"{a}_epsilon_central_total": scale * 5 * central(p, s.train.seed),
                                f"{a}_composition": "rdp"})
            rid = store.mark_running(pt.params, pt.train, pt.values)
            store.mark_done(rid, summary, [{"round": t + 1, "participants": 3} for t in range(5)])
    return str(path)


@pytest.fixture
def results(tmp_path):
    return fake_results(tmp_path / "r.sqlite", {"sampling.p": [0.8, 0.2, 0.5]},
                        points=[{"sampling.scheme": "channel-aware", "sampling.h_th": 2.0}])


def table(*args):
    return CliRunner().invoke(cli, ["table", *args])


def md_rows(text):
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_markdown_has_table_ii_columns_and_one_row_per_configuration(results):
    res = table(results)
    assert res.exit_code == 0, res.output
    head, align, *body = md_rows(res.stdout)
    expected = ["scheme", "p / h_th", "seeds", "accuracy (%)",
                *(f"{a} {short}" for a in ("paper", "tight") for _, short, _ in METRICS), "participants"]
    assert head == expected and len(align) == len(head)
    assert [r[:3] for r in body] == [["uniform", "p = 0.2", "3"], ["uniform", "p = 0.5", "3"],
                                     ["uniform", "p = 0.8", "3"], ["channel-aware", "h_th = 2", "3"]]
    assert all(r[3] == "82.0 ± 2.0" for r in body)
    assert body[0][head.index("tight ε_c round")] == "5" and body[0][head.index("paper ε_c round")] == "10"
    assert body[3][-1] == "2.5"
    assert "mean ± std over seeds" in res.stdout


def test_csv_is_numbers_with_mean_and_std_columns(results):
    res = table(results, "--format", "csv")
    assert res.exit_code == 0, res.output
    got = list(csv.DictReader(io.StringIO(res.stdout)))
    assert len(got) == 4
    assert list(got[0])[:8] == ["scheme", "setting", "p", "h_th", "seeds", "accuracy_mean", "accuracy_std",
                                "paper_epsilon_local_max"]
    assert float(got[1]["p"]) == 0.5 and got[1]["h_th"] == "" and got[3]["h_th"] == "2.0"
    assert float(got[0]["accuracy_mean"]) == pytest.approx(0.82)
    assert float(got[0]["accuracy_std"]) == pytest.approx(0.02)
    assert float(got[0]["tight_epsilon_central_total"]) == pytest.approx(25.0)


def test_latex_is_a_booktabs_tabular_with_one_line_per_row(results, tmp_path):
    out = tmp_path / "t.tex"
    res = table(results, "--format", "latex", "--out", str(out))
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert r"\begin{tabular}" in text and r"\toprule" in text and r"\bottomrule" in text
    assert r"\multicolumn{4}{c}{paper}" in text and r"82.0 $\pm$ 2.0" in text
    body = text.split(r"\midrule")[1].split(r"\bottomrule")[0]
    assert len([ln for ln in body.splitlines() if ln.endswith(r"\\")]) == 4
    assert r"h\_th = 2" in body


def test_swept_keys_become_columns_and_group_by_pools_the_rest(tmp_path):
    db = fake_results(tmp_path / "r.sqlite", {"sampling.p": [0.2, 0.5], "channel.snr_db": [0.0, 20.0]}, seeds=(0, 1))
    head, _, *body = md_rows(table(db).stdout)
    assert head[2] == "channel.snr_db" and len(body) == 4
    assert [r[2] for r in body] == ["0", "20", "0", "20"]
    res = table(db, "--group-by", "train.rounds")  # a key that does not vary: SNRs pooled with seeds
    head, _, *body = md_rows(res.stdout)
    assert head[2] == "train.rounds" and len(body) == 2 and body[0][3] == "4"


def test_infinite_bounds_are_shown_as_infinite(tmp_path):
    db = fake_results(tmp_path / "r.sqlite", {"sampling.p": [0.1, 0.9]}, seeds=(0,),
                      central=lambda p, seed: math.inf if p < 0.5 else 1.0)
    with read_store(db) as store:
        tab = tradeoff_table(store.runs())
    assert math.isinf(tab.rows[0].leakage["paper"]["epsilon_central"])
    body = md_rows(table(db).stdout)[2:]
    assert "∞" in body[0] and "∞" not in body[1]
    assert "inf" in table(db, "--format", "csv").stdout


@pytest.mark.parametrize("args, needle", [
    (["--group-by", "channel.snr"], "not a spec key"),
    (["--format", "html"], "html"),
])
def test_bad_options_exit_2_with_one_line(results, args, needle):
    res = table(results, *args)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and needle in res.stderr


def test_missing_foreign_or_empty_results_exit_2(tmp_path):
    res = table(str(tmp_path / "nope.sqlite"))
    assert res.exit_code == 2 and "does not exist" in res.stderr
    (tmp_path / "x.sqlite").write_text("not sqlite")
    res = table(str(tmp_path / "x.sqlite"))
    assert res.exit_code == 2 and "not an otafl results file" in res.stderr
    open_store(tmp_path / "empty.sqlite").close()
    res = table(str(tmp_path / "empty.sqlite"))
    assert res.exit_code == 2 and "no finished" in res.stderr


def test_table_of_a_real_sweep(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[data]\nname = "synthetic"\nusers = 8\n[channel]\nsnr_db = 10.0\n[train]\nrounds = 3\n'
                    '[sweep]\nseeds = [0, 1]\n[sweep.axes]\n"sampling.p" = [0.5, 1.0]\n'
                    '[[sweep.points]]\n"sampling.scheme" = "channel-aware"\n')
    db = str(tmp_path / "r.sqlite")
    res = CliRunner().invoke(cli, ["sweep", str(spec), "--out", db, "--workers", "0", "--quiet"])
    assert res.exit_code == 0, res.output
    res = table(db)
    assert res.exit_code == 0, res.output
    head, _, *body = md_rows(res.stdout)
    assert len(body) == 3 and head[:4] == ["scheme", "p / h_th", "seeds", "accuracy (%)"]
    assert [r[1] for r in body] == ["p = 0.5", "p = 1", "h_th = 2"]
    assert all(r[2] == "2" and "±" in r[3] for r in body)
    for r in body:  # every leakage cell is a number or infinity
        assert all(c == "∞" or float(c) >= 0 for c in r[4:-1])
