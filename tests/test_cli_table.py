"""`otafl table`: layout (columns, rows, grouping, accountants, flags) on stored fake summaries,
plus one real sweep."""

import csv
import io
import math

import pytest
from click.testing import CliRunner
from fakestore import fake_store

from otafl.cli.main import cli
from otafl.report.table import DEFAULT_COLUMNS, sort_key, tradeoff_table
from otafl.sweep.store import open_store, read_store


@pytest.fixture
def results(tmp_path):
    return fake_store(tmp_path / "r.sqlite", {"sampling.p": [0.8, 0.2, 0.5]},
                      points=[{"sampling.scheme": "channel-aware", "sampling.h_th": 2.0}])


@pytest.fixture
def with_exact(tmp_path):
    return fake_store(tmp_path / "e.sqlite", {"sampling.p": [0.8, 0.2]}, accountants=("paper", "tight", "exact"))


def table(*args):
    return CliRunner().invoke(cli, ["table", *map(str, args)])


def md_rows(text):
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def csv_rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_markdown_default_columns_first_accountant_and_one_row_per_configuration(results):
    res = table(results)
    assert res.exit_code == 0, res.output
    head, align, *body = md_rows(res.stdout)
    assert head == ["scheme", "p / h_th", "seeds", "accuracy (%)", "paper ε_l per round",
                    "paper ε_l total (T = 5, basic)", "paper ε_c per round", "paper ε_c total (T = 5, rdp)",
                    "participants"]
    assert len(align) == len(head)
    assert [r[:3] for r in body] == [["uniform", "p = 0.2", "3"], ["uniform", "p = 0.5", "3"],
                                     ["uniform", "p = 0.8", "3"], ["channel-aware", "h_th = 2", "3"]]
    assert all(r[3] == "82.0 ± 2.0" for r in body)
    assert body[1][head.index("paper ε_c per round")] == "4.00"
    assert body[1][head.index("paper ε_c total (T = 5, rdp)")] == "20.0"
    assert body[3][-1] == "2.5"
    assert "mean ± std over 3 seeds" in res.stdout and "tight ε" not in res.stdout


def test_default_accountant_is_exact_when_the_runs_carry_it(with_exact):
    head = md_rows(table(with_exact).stdout)[0]
    assert [h.split()[0] for h in head[4:8]] == ["exact"] * 4


def test_accountant_option_picks_and_orders_accountants(with_exact):
    res = table(with_exact, "--accountant", "tight,paper", "--columns", "setting,eps_central_round")
    head, _, *body = md_rows(res.stdout)
    assert head == ["p / h_th", "tight ε_c per round", "paper ε_c per round"]
    assert body[0] == ["p = 0.2", "5.00", "10.0 !"]
    head = md_rows(table(with_exact, "--accountant", "all", "--columns", "eps_central_total").stdout)[0]
    assert [h.split()[0] for h in head] == ["paper", "tight", "exact"]


@pytest.mark.parametrize("name, needle", [("magic", "paper, tight, exact"), ("exact", "present: paper, tight")])
def test_an_unknown_or_absent_accountant_exits_2(results, name, needle):
    res = table(results, "--accountant", name)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and needle in res.stderr and name in res.stderr


def test_columns_pick_and_order_in_every_format(results):
    cols = "accuracy,setting,eps_central_total,participants"
    head = md_rows(table(results, "--columns", cols).stdout)[0]
    assert head == ["accuracy (%)", "p / h_th", "paper ε_c total (T = 5, rdp)", "participants"]
    text = table(results, "--columns", cols, "--format", "text").stdout.splitlines()
    assert text[0].split("  ")[0] == "accuracy (%)" and text[0].index("p / h_th") < text[0].index("ε_c total")
    got = csv_rows(table(results, "--columns", cols, "--format", "csv").stdout)
    assert list(got[0]) == ["accuracy_mean", "accuracy_std", "setting", "paper_epsilon_central_total",
                            "mean_participants"]
    tex = table(results, "--columns", cols, "--format", "latex").stdout
    header = [ln for ln in tex.splitlines() if ln.startswith("accuracy")][0]
    assert header.index(r"$p$ / $h_\mathrm{th}$") < header.index(r"$\varepsilon_\mathrm{c}$")


def test_per_accountant_columns_form_one_block_per_accountant(with_exact):
    head = md_rows(table(with_exact, "--accountant", "paper,exact",
                         "--columns", "eps_central_total,setting,valid,composition").stdout)[0]
    assert head == ["paper ε_c total (T = 5, rdp)", "paper valid", "paper composition",
                    "exact ε_c total (T = 5, rdp)", "exact valid", "exact composition", "p / h_th"]


@pytest.mark.parametrize("cols, needle", [("accuracy,bogus", "'bogus'"), (",", "names no column")])
def test_an_unknown_column_exits_2_naming_the_choices(results, cols, needle):
    res = table(results, "--columns", cols)
    assert res.exit_code == 2 and needle in res.stderr and "eps_central_total" in res.stderr


def test_csv_is_numbers_with_mean_std_and_validity_columns(results):
    res = table(results, "--format", "csv")
    assert res.exit_code == 0, res.output
    got = csv_rows(res.stdout)
    assert len(got) == 4
    assert list(got[0]) == ["scheme", "setting", "p", "h_th", "seeds", "accuracy_mean", "accuracy_std",
                            "paper_epsilon_local_max", "paper_epsilon_local_total", "paper_epsilon_central",
                            "paper_epsilon_central_total", "paper_classic_valid", "mean_participants"]
    assert float(got[1]["p"]) == 0.5 and got[1]["h_th"] == "" and got[3]["h_th"] == "2.0"
    assert float(got[0]["accuracy_mean"]) == pytest.approx(0.82)
    assert float(got[0]["accuracy_std"]) == pytest.approx(0.02)
    assert float(got[0]["paper_epsilon_central_total"]) == pytest.approx(50.0)
    assert [r["paper_classic_valid"] for r in got] == ["false", "true", "true", "false"]


def test_validity_flags_in_every_format(results):
    """paper is invalid at p = 0.2 and for channel-aware (p 0.25): those ε cells carry the mark,
    the note explains it; valid rows carry none."""
    md = table(results).stdout
    _, _, *body = md_rows(md)
    assert all(c.endswith(" !") for c in body[0][4:8]) and not any("!" in c for c in body[1])
    assert "!: paper's classic Gaussian step is outside its validity range" in md
    text = table(results, "--format", "text").stdout
    lines = text.splitlines()
    assert lines[2].split()[-3:] == ["50.0", "!", "2.0"] and "!" not in lines[3]
    assert "!: paper's" in " ".join(text.split())  # the legend is wrapped at 100 columns
    tex = table(results, "--format", "latex").stdout
    rows = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
    assert r"{10.0}^{\dagger}" in rows[0] and r"\dagger" not in rows[1] and r"$\dagger$: paper's" in tex
    valid_col = md_rows(table(results, "--columns", "setting,valid").stdout)
    assert [r[1] for r in valid_col[2:]] == ["no", "yes", "yes", "no"]


def test_no_flag_and_no_note_for_an_accountant_that_is_always_valid(results):
    out = table(results, "--accountant", "tight").stdout
    assert "!" not in out


def test_list_valued_and_numeric_axes_sort_as_numbers(tmp_path):
    snrs = [[10.0, 20.0, 40.0], [2.0, 10.0, 30.0], [2.0, 10.0, 4.0]]
    db = fake_store(tmp_path / "r.sqlite", {"sampling.p": [0.5], "channel.snr_db": snrs,
                                            "transmit.sigma2": [0.5, 10.0, 2.0]}, seeds=(0,))
    head, _, *body = md_rows(table(db).stdout)
    assert head[2:4] == ["channel.snr_db", "transmit.sigma2"]
    assert [r[2] for r in body[::3]] == ["[2, 10, 4]", "[2, 10, 30]", "[10, 20, 40]"]
    assert [r[3] for r in body[:3]] == ["0.5", "2", "10"]
    assert sort_key((2, 10, 30)) < sort_key((10, 20, 40)) and sort_key(9.0) < sort_key(10)


def test_swept_keys_become_columns_and_group_by_pools_the_rest(tmp_path):
    db = fake_store(tmp_path / "r.sqlite", {"sampling.p": [0.2, 0.5], "channel.snr_db": [0.0, 20.0]}, seeds=(0, 1))
    head, _, *body = md_rows(table(db).stdout)
    assert head[2] == "channel.snr_db" and len(body) == 4
    assert [r[2] for r in body] == ["0", "20", "0", "20"]
    res = table(db, "--group-by", "train.rounds")  # a key that does not vary: SNRs pooled with seeds
    head, _, *body = md_rows(res.stdout)
    assert head[2] == "train.rounds" and len(body) == 2 and body[0][3] == "4"
    assert md_rows(table(db, "--columns", "setting,channel.snr_db").stdout)[0] == ["p / h_th", "channel.snr_db"]


def test_infinite_bounds_are_shown_as_infinite(tmp_path):
    def summary(spec, accs):
        from fakestore import default_summary
        out = default_summary(spec, accs)
        if spec.sampling.p < 0.5:
            out.update({f"{a}_epsilon_central": math.inf for a in accs})
        return out

    db = fake_store(tmp_path / "r.sqlite", {"sampling.p": [0.1, 0.9]}, seeds=(0,), summary=summary)
    with read_store(db) as store:
        tab = tradeoff_table(store.runs())
    assert math.isinf(tab.rows[0].leakage["paper"]["epsilon_central"])
    body = md_rows(table(db).stdout)[2:]
    assert "∞ !" in body[0] and not any("∞" in c for c in body[1])
    assert "inf" in table(db, "--format", "csv").stdout
    assert r"$\infty" in table(db, "--format", "latex").stdout


def test_one_seed_says_so(tmp_path):
    db = fake_store(tmp_path / "r.sqlite", {"sampling.p": [0.2, 0.9]}, seeds=(1,))
    out = table(db).stdout
    assert "1 seed (no std)" in out and md_rows(out)[2][3] == "82.0"


@pytest.mark.parametrize("args, needle", [
    (["--group-by", "channel.snr"], "not a spec key"),
    (["--format", "html"], "html"),
])
def test_bad_options_exit_2_with_one_line(results, args, needle):
    res = table(results, *args)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and needle in res.stderr


def test_missing_foreign_or_empty_results_exit_2(tmp_path):
    res = table(tmp_path / "nope.sqlite")
    assert res.exit_code == 2 and "does not exist" in res.stderr
    (tmp_path / "x.sqlite").write_text("not sqlite")
    res = table(tmp_path / "x.sqlite")
    assert res.exit_code == 2 and "not an otafl results file" in res.stderr
    open_store(tmp_path / "empty.sqlite").close()
    res = table(tmp_path / "empty.sqlite")
    assert res.exit_code == 2 and "no finished" in res.stderr


def test_table_of_a_real_sweep(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[data]\nname = "synthetic"\nusers = 8\n[channel]\nsnr_db = 10.0\n[train]\nrounds = 3\n'
                    '[privacy]\naccountants = ["paper", "tight"]\n'
                    '[sweep]\nseeds = [0, 1]\n[sweep.axes]\n"sampling.p" = [0.5, 1.0]\n'
                    '[[sweep.points]]\n"sampling.scheme" = "channel-aware"\n')
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(cli, ["sweep", str(spec), "--out", str(db), "--workers", "0", "--quiet"])
    assert res.exit_code == 0, res.output
    res = table(db, "--accountant", "paper,tight")
    assert res.exit_code == 0, res.output
    head, _, *body = md_rows(res.stdout)
    assert len(body) == 3 and head[:4] == ["scheme", "p / h_th", "seeds", "accuracy (%)"]
    assert len(head) == len(DEFAULT_COLUMNS) - 1 + 4  # no grouping key; 2 x 4 leakage columns
    assert all("(T = 3, " in h for h in head if " total " in h)
    assert [r[1] for r in body] == ["p = 0.5", "p = 1", "h_th = 2"]
    assert all(r[2] == "2" and "±" in r[3] for r in body)
    for r in body:  # every leakage cell is a number or infinity, maybe flagged
        assert all(c.removesuffix(" !") == "∞" or float(c.removesuffix(" !")) >= 0 for c in r[4:-1])
    flags = csv_rows(table(db, "--format", "csv", "--accountant", "paper").stdout)
    assert {r["paper_classic_valid"] for r in flags} <= {"true", "false"}


def test_an_older_results_file_without_flags_or_local_composition(tmp_path):
    def old(spec, accs):
        from fakestore import default_summary
        out = default_summary(spec, accs)
        return {k: v for k, v in out.items() if not k.endswith(("_classic_valid", "_composition_local"))}

    db = fake_store(tmp_path / "r.sqlite", {"sampling.p": [0.2, 0.9]}, seeds=(0,), summary=old)
    head, _, *body = md_rows(table(db).stdout)
    assert "paper ε_l total (T = 5)" in head and "paper ε_c total (T = 5, rdp)" in head
    assert not any("!" in c for r in body for c in r)
    assert {r["paper_classic_valid"] for r in csv_rows(table(db, "--format", "csv").stdout)} == {""}


def test_legend_and_latex_caption_state_the_totals_delta(tmp_path, results):
    res = table(results)
    assert "Totals at deltas 1e-05 to 2e-05" in res.stdout  # the fake runs mix local and central deltas
    one = tradeoff_table(read_store(results).runs("done"))
    for r in one.rows:
        for a in r.leakage:
            r.leakage[a]["delta_local_total"] = r.leakage[a]["delta_central_total"] = 1e-5
    from otafl.report.table_format import render_table
    assert "Every total at delta = 1e-05." in render_table(one, "md")
    assert r"$\delta$ = 1e-05" in render_table(one, "latex").split(r"\caption{")[1].split("\n")[0]
