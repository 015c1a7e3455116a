"""`otafl plot` layout on fake stores: facets per second sweep axis, merged legends outside the
axes, point labels that neither collide nor clip, seeds wording, per-round vs total axes,
hollow markers for invalid bounds, the default accountant."""

import itertools

import pytest
from click.testing import CliRunner
from fakestore import default_summary, fake_store
from matplotlib.text import Text

from otafl.cli.main import cli
from otafl.report.plots import make_figure
from otafl.report.plots.common import INVALID_NOTE, renderer_of
from otafl.sweep.store import read_store

SNRS = [[10.0, 20.0, 40.0], [2.0, 10.0, 30.0], [2.0, 10.0, 4.0]]


def same_local(spec, accs):
    """tight and exact agree on the local epsilon (so their local curves are identical)."""
    out = default_summary(spec, accs)
    out["exact_epsilon_local_max"] = out["tight_epsilon_local_max"]
    out["exact_epsilon_local_total"] = out["tight_epsilon_local_total"]
    return out


@pytest.fixture(scope="module")
def two_axes(tmp_path_factory):
    return fake_store(tmp_path_factory.mktemp("two") / "r.sqlite", {"sampling.p": [0.2, 0.8], "channel.snr_db": SNRS},
                      points=[{"sampling.scheme": "channel-aware", "sampling.h_th": 2.0, "channel.snr_db": SNRS[1]}],
                      seeds=(0, 1),
                      accountants=("paper", "tight", "exact"), summary=same_local)


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    """Nine p on one horizontal line (same accuracy), crowded at small epsilon; one seed; no exact."""
    return fake_store(tmp_path_factory.mktemp("crowd") / "r.sqlite",
                      {"sampling.p": [round(0.1 * i, 1) for i in range(1, 10)]}, seeds=(0,),
                      accountants=("paper", "tight"))


def figure(db, kind, **kwargs):
    with read_store(db) as store:
        return make_figure(store, kind, **kwargs)


def legend_labels(fig):
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


@pytest.mark.parametrize("kind, panels", [("accuracy", 3), ("tradeoff", 3), ("privacy", 6), ("channel", 6)])
def test_one_panel_per_value_of_the_second_axis_in_numeric_order(two_axes, kind, panels):
    fig = figure(two_axes, kind)
    assert len(fig.axes) == panels
    titles = [ax.get_title() for ax in fig.axes if "snr_db" in ax.get_title()]
    order = [next(i for i, s in enumerate(["[2, 10, 4]", "[2, 10, 30]", "[10, 20, 40]"]) if s in t) for t in titles]
    assert order == sorted(order) and len(set(order)) == 3


def test_facet_none_draws_one_panel_and_a_bad_facet_exits_2(two_axes, tmp_path):
    assert len(figure(two_axes, "accuracy", facet="none").axes) == 1
    res = CliRunner().invoke(cli, ["plot", two_axes, "--kind", "accuracy", "--facet", "train.lr",
                                   "--out", str(tmp_path / "a.png")])
    assert res.exit_code == 2 and "channel.snr_db" in res.stderr and not (tmp_path / "a.png").exists()


@pytest.mark.parametrize("kind", ["accuracy", "privacy", "tradeoff"])
def test_one_legend_entry_per_distinct_curve_outside_the_axes(two_axes, kind):
    fig = figure(two_axes, kind)
    labels = legend_labels(fig)
    assert labels and len(labels) == len(set(labels))
    renderer = renderer_of(fig)
    for leg in fig.legends:
        box = leg.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_identical_curves_are_merged_into_one_entry(two_axes):
    fig = figure(two_axes, "privacy")
    labels = legend_labels(fig)
    assert "tight ≡ exact, uniform p" in labels
    local = fig.axes[1]  # first row, right: local DP; tight and exact share one line there
    assert sum(1 for ln in local.get_lines() if ln.get_label().startswith("tight")) == 1
    assert not any(ln.get_label().startswith("exact, uniform") for ln in local.get_lines())
    central = fig.axes[0]
    assert {"tight, uniform p", "exact, uniform p"} <= {ln.get_label() for ln in central.get_lines()}


def test_the_tradeoff_axis_states_the_per_round_delta_of_its_accountant(tmp_path):
    def with_deltas(spec, accs):
        out = default_summary(spec, accs)
        out.update({"paper_delta_central": 6.67e-06, "tight_delta_central": 6.67e-06, "exact_delta_central": 1e-05})
        return out

    db = fake_store(tmp_path / "r.sqlite", {"sampling.p": [0.2, 0.8]}, seeds=(0,),
                    accountants=("paper", "tight", "exact"), summary=with_deltas)
    assert xlabel(figure(db, "tradeoff")).endswith("per round (worst round; exact) at δ = 1e-05, user level")
    assert xlabel(figure(db, "tradeoff", accountant="tight")).endswith(
        "(worst round; tight) at δ = 6.67e-06, user level")
    assert "per round (worst round; paper, tight) at δ = 6.67e-06" in xlabel(
        figure(db, "tradeoff", accountant="paper,tight"))


def _inside(inner, outer, tol=1.0):
    return (inner.x0 >= outer.x0 - tol and inner.y0 >= outer.y0 - tol
            and inner.x1 <= outer.x1 + tol and inner.y1 <= outer.y1 + tol)


def test_point_labels_neither_collide_nor_leave_the_axes(crowded):
    fig = figure(crowded, "tradeoff", facet="none")
    ax = fig.axes[0]
    renderer = renderer_of(fig)
    anns = [t for t in ax.texts if t.get_text().startswith("p = ")]
    assert sorted(t.get_text() for t in anns) == [f"p = {0.1 * i:.1g}" for i in range(1, 10)]
    boxes = [Text.get_window_extent(t, renderer) for t in anns]  # the text, not its leader line
    assert all(_inside(b, ax.get_window_extent(renderer)) for b in boxes)
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


@pytest.mark.parametrize("kind", ["accuracy", "privacy", "tradeoff", "channel"])
def test_axis_labels_and_titles_do_not_collide(two_axes, kind):
    fig = figure(two_axes, kind, **({"accountant": "all"} if kind == "tradeoff" else {}))  # a long x label
    renderer = renderer_of(fig)
    texts = [t for ax in fig.axes for t in (ax.xaxis.label, ax.yaxis.label, ax.title) if t.get_text()]
    texts += [t for t in (fig._suptitle, fig._supxlabel) if t is not None]
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


@pytest.mark.parametrize("kind", ["accuracy", "privacy", "tradeoff", "channel"])
def test_no_text_is_clipped_by_the_figure(two_axes, kind):
    fig = figure(two_axes, kind)
    renderer = renderer_of(fig)
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]  # ticks, tick labels, axis labels, title
    boxes += [t.get_window_extent(renderer) for ax in fig.axes for t in ax.texts]  # point labels
    boxes += [leg.get_window_extent(renderer) for leg in fig.legends]
    boxes += [t.get_window_extent(renderer) for t in (fig._suptitle, fig._supxlabel) if t is not None]
    assert all(_inside(b, fig.bbox, tol=2.0) for b in boxes)


def test_seeds_wording(two_axes, crowded):
    assert "mean ± std over 2 seeds" in figure(two_axes, "tradeoff")._suptitle.get_text()
    assert "1 seed: no error bars" in figure(crowded, "tradeoff")._suptitle.get_text()
    assert "1 seed: no band" in figure(crowded, "accuracy")._suptitle.get_text()
    assert "mean over 2 seeds" in figure(two_axes, "privacy")._suptitle.get_text()


def xlabel(fig):
    """The x label: the figure's shared one under several panels, else the panel's."""
    return fig._supxlabel.get_text() if fig._supxlabel is not None else fig.axes[0].get_xlabel()


def test_axes_say_per_round_or_total_and_name_the_default_accountant(two_axes, crowded):
    assert "per round (worst round; exact)" in xlabel(figure(two_axes, "tradeoff"))  # exact present: the default
    assert "per round (worst round; paper)" in xlabel(figure(crowded, "tradeoff"))  # else the first present
    x = xlabel(figure(two_axes, "tradeoff", epsilon="total", accountant="tight"))
    assert "total over T = 5 rounds (tight)" in x
    fig = figure(two_axes, "privacy", epsilon="total")
    assert "central ε total over T = 5 rounds" in fig.axes[0].get_ylabel()
    labels = [t.replace("\n", " ") for t in legend_labels(fig)]
    assert "paper (rdp, δ = 2e-05), uniform p" in labels  # the central total at its run's delta_total
    assert "paper (basic, δ = 1e-05), uniform p" in labels  # the local total at its own


def test_invalid_points_are_hollow_with_a_legend_note(two_axes):
    fig = figure(two_axes, "privacy", accountant="paper")
    assert INVALID_NOTE in legend_labels(fig)
    hollow = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_markerfacecolor() == "white"]
    assert hollow and all(len(ln.get_xdata()) == 1 and ln.get_xdata()[0] == 0.2 for ln in hollow)
    assert INVALID_NOTE not in legend_labels(figure(two_axes, "privacy", accountant="tight"))


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Central epsilon 1/p from 2.5 to 53: a log axis with one decade tick (10) in view, where matplotlib labels the minor ticks too (2x10^0 3x10^0 ...); three panels."""
    return fake_store(tmp_path_factory.mktemp("wide") / "r.sqlite",
                      {"sampling.p": [0.019, 0.05, 0.1, 0.4], "train.algorithm": ["fedsgd", "fedavg", "scaffold"]}, seeds=(0,),
                      accountants=("tight",))


def test_log_epsilon_axis_tick_labels_do_not_overlap(wide):
    fig = figure(wide, "tradeoff", accountant="tight", facet="train.algorithm")
    assert len(fig.axes) == 3 and all(ax.get_xscale() == "log" for ax in fig.axes)
    renderer = renderer_of(fig)
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels(minor=False) + ax.get_xticklabels(minor=True)
                  if t.get_visible() and t.get_text() and _inside(t.get_window_extent(renderer),
                                                                   ax.get_window_extent(renderer).expanded(1, 2))]
        assert labels  # the decades at least
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2)), [t.get_text() for t in labels]


def test_privacy_legend_states_each_accountants_delta_per_round(two_axes):
    def summary(spec, accs):
        out = same_local(spec, accs)
        for a in accs:  # per-round deltas: exact at one value, tight's growing as p falls
            out[f"{a}_delta_central"] = 1e-5 if a == "exact" else 1e-4 / spec.sampling.p
            out[f"{a}_delta_local"] = 1e-5
        return out

    db = fake_store(two_axes.replace("r.sqlite", "d.sqlite"), {"sampling.p": [0.2, 0.8]}, seeds=(0,),
                    accountants=("tight", "exact"), summary=summary)
    labels = [t.replace("\n", " ") for t in legend_labels(figure(db, "privacy", accountant="all"))]
    assert "tight (δ_c = 0.000125–0.0005, δ_l = 1e-05), uniform p" in labels
    assert "exact (δ_c = 1e-05, δ_l = 1e-05), uniform p" in labels
