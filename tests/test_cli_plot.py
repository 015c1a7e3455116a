"""`otafl plot`: every kind from a real tiny sweep is a valid PNG / SVG / PDF with labelled axes."""

import xml.etree.ElementTree as ET

import matplotlib.image
import pytest
from click.testing import CliRunner

from otafl.cli.main import cli
from otafl.report.plots import KINDS, make_figure, regenerate_gains
from otafl.sweep.store import read_store
from sweep_helpers import swept_store

SPEC = """
[data]
name = "synthetic"
users = 9
[channel]
snr_db = [0.0, 10.0, 20.0]
[train]
rounds = 6
eval_every = 2
[privacy]
accountants = ["paper", "tight"]
[sweep]
seeds = [0, 1]
[sweep.axes]
"sampling.p" = [0.4, 1.0]
[[sweep.points]]
"sampling.scheme" = "channel-aware"
"sampling.h_th" = 1.5
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plot")
    db = swept_store(tmp, SPEC)
    swept_store(tmp, SPEC, "--set", "sweep.train=false", name="bounds.sqlite")  # beside it, for the bounds tests
    return db


def plot(*args):
    return CliRunner().invoke(cli, ["plot", *map(str, args)])


SWEPT_P_KINDS = [k for k in KINDS if k != "scaling"]  # scaling sweeps data.users: tests/test_cli_plot_scaling.py


@pytest.mark.parametrize("kind", SWEPT_P_KINDS)
def test_every_kind_writes_a_valid_png(results, tmp_path, kind):
    out = tmp_path / f"{kind}.png"
    res = plot(results, "--kind", kind, "--out", out)
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(out)
    assert img.ndim == 3 and img.shape[0] > 400 and img.shape[1] > 600


@pytest.mark.parametrize("kind", SWEPT_P_KINDS)
def test_every_axis_is_labelled_and_the_figure_has_a_legend(results, kind):
    with read_store(results) as store:
        fig = make_figure(store, kind)
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        assert ax.get_ylabel() or not spec.is_first_col()  # panels side by side share the y label
        assert ax.get_xlabel() or not spec.is_last_row() or fig._supxlabel is not None
    assert fig.legends or all(ax.get_legend() is not None for ax in fig.axes if ax.get_subplotspec().is_last_col())
    assert all(t.get_fontsize() >= 12 for ax in fig.axes for t in [ax.xaxis.label, ax.yaxis.label])


def test_svg_and_pdf_by_suffix(results, tmp_path):
    assert plot(results, "--kind", "privacy", "--out", tmp_path / "p.svg").exit_code == 0
    assert ET.parse(tmp_path / "p.svg").getroot().tag.endswith("svg")
    assert plot(results, "--kind", "tradeoff", "--out", tmp_path / "t.pdf").exit_code == 0
    data = (tmp_path / "t.pdf").read_bytes()
    assert data.startswith(b"%PDF-") and b"%%EOF" in data[-64:]


def test_channel_traces_are_the_runs_own_fading_draw(results):
    """The per-user gains the channel figure regenerates average to the stored mean gain of
    every round (so the traces are the ones the run saw), and one trace per SNR group is drawn."""
    with read_store(results) as store:
        run = store.runs()[0]
        stored = [r["mean_gain"] for r in store.rounds(run.id)]
        fig = make_figure(store, "channel")
    h, groups, snr = regenerate_gains(run)
    assert h.shape == (6, 9) and groups.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert h.mean(dim=1).tolist() == pytest.approx(stored, rel=1e-12, abs=0)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["user 0 (0 dB group)", "user 3 (10 dB group)", "user 6 (20 dB group)", "mean over all users"]


def test_bad_suffix_exits_2_and_writes_nothing(results, tmp_path):
    res = plot(results, "--kind", "accuracy", "--out", tmp_path / "a.jpg")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and ".png, .svg, .pdf" in res.stderr
    assert not (tmp_path / "a.jpg").exists()


def test_accuracy_of_a_bounds_only_sweep_exits_2_but_privacy_works(results, tmp_path):
    bounds = results.parent / "bounds.sqlite"
    res = plot(bounds, "--kind", "accuracy", "--out", tmp_path / "a.png")
    assert res.exit_code == 2 and "train = false" in res.stderr
    assert plot(bounds, "--kind", "privacy", "--out", tmp_path / "p.png").exit_code == 0


def test_unknown_kind_or_accountant_exits_2(results, tmp_path):
    res = plot(results, "--kind", "histogram", "--out", tmp_path / "a.png")
    assert res.exit_code == 2 and "histogram" in res.stderr
    res = plot(results, "--kind", "tradeoff", "--accountant", "magic", "--out", tmp_path / "a.png")
    assert res.exit_code == 2 and "magic" in res.stderr and res.stderr.count("\n") == 1
    res = plot(results, "--kind", "tradeoff", "--accountant", "exact", "--out", tmp_path / "a.png")
    assert res.exit_code == 2 and "present: paper, tight" in res.stderr


def test_options_reach_the_figure(results, tmp_path):
    out = tmp_path / "t.png"
    res = plot(results, "--kind", "tradeoff", "--accountant", "tight", "--epsilon", "total", "--out", out)
    assert res.exit_code == 0, res.output
    with read_store(results) as store:
        fig = make_figure(store, "tradeoff", accountant="tight", epsilon="total")
    assert fig.axes[0].get_xlabel() == "central ε total over T = 6 rounds (tight) at δ = 1e-05, user level"
    assert plot(results, "--kind", "accuracy", "--facet", "none", "--out", out).exit_code == 0


def test_a_tradeoff_of_an_snr_sweep_at_one_p_is_one_curve_along_the_snr(tmp_path):
    """An SNR sweep at one p used to draw one panel per SNR, each with a single dot."""
    from fakestore import fake_store

    def snr_summary(spec, accountants):  # more SNR, more accuracy and more leakage
        snr = spec.channel.snr_db if isinstance(spec.channel.snr_db, float) else spec.channel.snr_db[0]
        out = {"final_test_accuracy": 0.7 + snr / 100, "rounds": 5, "users": 10, "mean_participants": 5.0,
               "scheme": "uniform", "seed": spec.train.seed}
        for a in accountants:
            out.update({f"{a}_epsilon_central": 1 + snr / 10, f"{a}_epsilon_central_total": 5 + snr,
                        f"{a}_classic_valid": True, f"{a}_defined": True})
        return out

    with read_store(fake_store(tmp_path / "snr.sqlite", {"channel.snr_db": [0.0, 10.0, 20.0]}, seeds=(0,),
                               accountants=("exact",), summary=snr_summary)) as store:
        fig = make_figure(store, "tradeoff")
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == 1
    (line,) = [ln for ln in panels[0].lines if len(ln.get_xdata()) > 1]
    assert list(line.get_xdata()) == [1.0, 2.0, 3.0] and list(line.get_ydata()) == pytest.approx([70, 80, 90])
    labels = {t.get_text() for t in panels[0].texts}
    assert {"snr_db = 0", "snr_db = 10", "snr_db = 20"} <= labels, labels
    # with p swept too, the curves run along p and the SNR values are panels, as before
    with read_store(fake_store(tmp_path / "both.sqlite", {"channel.snr_db": [0.0, 10.0], "sampling.p": [0.3, 0.6]},
                               seeds=(0,), accountants=("exact",))) as store:
        fig = make_figure(store, "tradeoff")
    assert len([ax for ax in fig.axes if ax.lines]) == 2
