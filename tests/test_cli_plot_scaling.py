"""`otafl plot --kind scaling`: accuracy and central epsilon against the swept K of a real
tiny sweep; the printed slope is the log-log fit of the stored per-round epsilons."""

import math

import matplotlib.image
import numpy as np
import pytest
from click.testing import CliRunner

from otafl.cli.main import cli
from otafl.report.plots import make_figure
from otafl.report.plots.versus import fit_slope
from otafl.sweep.store import read_store
from sweep_helpers import swept_store

SPEC = """
[data]
name = "synthetic"
samples = 600
batch_size = 1
[train]
rounds = 2
eval_every = 2
[privacy]
accountants = ["exact"]
[sweep]
seeds = [0]
[sweep.axes]
"data.users" = [10, 30, 90]
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return swept_store(tmp_path_factory.mktemp("plot_scaling"), SPEC)


def test_scaling_writes_a_png_and_prints_the_fitted_slope_of_the_stored_round_epsilons(results, tmp_path):
    out = tmp_path / "k.png"
    res = CliRunner().invoke(cli, ["plot", str(results), "--kind", "scaling", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and matplotlib.image.imread(out).shape[1] > 600
    with read_store(results) as store:
        runs = sorted(store.runs("done"), key=lambda r: r.params["data"]["users"])
    ks = [r.params["data"]["users"] for r in runs]
    eps = [r.summary["exact_epsilon_central"] for r in runs]
    slope = np.polyfit(np.log(ks), np.log(eps), 1)[0]
    assert slope < 0
    line = res.output.splitlines()[0]
    assert line.startswith("exact per-round central epsilon vs data.users") and "over 10-90 (3 points)" in line
    assert float(line.split("log-log slope ")[1].split()[0]) == pytest.approx(slope, abs=5e-4)


def test_scaling_axes_state_the_total_delta_and_the_legend_the_slope(results):
    with read_store(results) as store:
        fig = make_figure(store, "scaling")
        delta = store.runs("done")[0].summary["exact_delta_central_total"]
    acc_ax, eps_ax = fig.axes
    assert acc_ax.get_ylabel() == "final test accuracy (%)" and acc_ax.get_xlabel() == "users K"
    assert f"at δ = {delta:.3g}" in eps_ax.get_ylabel() and "total over T = 2 rounds" in eps_ax.get_ylabel()
    labels = [t.get_text() for t in eps_ax.get_legend().get_texts()]
    assert any("worst round" in t and "log-log slope -" in t for t in labels)
    assert [line.get_xdata().tolist() for line in acc_ax.get_lines()][0] == [10, 30, 90]


def test_scaling_without_the_swept_key_exits_2(results, tmp_path):
    res = CliRunner().invoke(cli, ["plot", str(results), "--kind", "scaling", "--x", "channel.snr_db",
                                   "--out", str(tmp_path / "k.png")])
    assert res.exit_code == 2 and "channel.snr_db" in res.stderr and "--x" in res.stderr


def test_fit_slope_is_exact_on_a_power_law_and_nan_on_one_point():
    assert fit_slope([10, 100, 1000], [2 * k ** -0.75 for k in (10, 100, 1000)]) == pytest.approx(-0.75)
    assert math.isnan(fit_slope([10], [1.0]))
