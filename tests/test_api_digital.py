"""otafl.api.digital (calibration, fewest bits) and the comparison's table and figure."""

from __future__ import annotations

import math

from click.testing import CliRunner

from otafl.api.digital import calibrate_sigma2, communication_curves, digital_privacy, minimal_bits
from otafl.cli.main import cli
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon
from otafl.sweep.grid import expand_grid
from otafl.sweep.store import open_store


def test_calibration_inverts_the_analytic_gaussian_within_one_percent():
    kw = dict(users=20, dim=16, p=1.0, rounds=1, delta_l=1e-5, delta_total=1e-5)
    s2 = calibrate_sigma2("gaussian", target=2.0, key="epsilon_central", **kw)
    assert digital_privacy("gaussian", sigma2=s2, **kw)["epsilon_central"] <= 2.0
    eps_below = float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(20 * s2 / 1.02), delta=1e-5))
    assert eps_below > 2.0  # 2 % less noise would miss the target


def test_fewest_bits_shrink_for_pbm_and_grow_for_skellam_as_noise_grows():
    grid = [0.001, 0.01, 0.1, 1.0, 10.0]
    pbm = [minimal_bits("pbm", sigma2=s, users=200, dim=7850) for s in grid]
    skellam = [minimal_bits("skellam", sigma2=s, users=200, dim=7850) for s in grid]
    ddg = [minimal_bits("ddg", sigma2=s, users=200, dim=7850) for s in grid]
    assert pbm == sorted(pbm, reverse=True) and pbm[0] > pbm[-1] == 8  # 2^8 - 1 >= K = 200 is the floor
    assert skellam == sorted(skellam) and skellam[0] < skellam[-1]
    assert ddg == skellam  # same rounding budget and field (discrete Gaussian shares of the same variance)
    assert minimal_bits("gaussian", sigma2=0.1, users=200, dim=7850) == 0


def test_communication_curves_cover_every_discrete_mechanism():
    curves = communication_curves(users=20, dim=64, p=0.5, rounds=3, sigma2=(0.1, 1.0))
    assert [r["mechanism"] for r in curves["rows"]] == ["skellam", "skellam", "ddg", "ddg", "pbm", "pbm"]
    by = {(r["mechanism"], r["sigma2"]): r for r in curves["rows"]}
    for s2 in (0.1, 1.0):  # more noise, smaller epsilon
        assert by[("ddg", s2)]["epsilon_central_total"] <= by[("skellam", s2)]["epsilon_central_total"] * (1 + 1e-6)
    assert by[("ddg", 1.0)]["epsilon_central_total"] < by[("ddg", 0.1)]["epsilon_central_total"]


def test_every_communication_curve_point_states_the_delta_of_its_epsilon():
    curves = communication_curves(users=20, dim=64, p=0.5, rounds=3, sigma2=(0.1,), delta_total=1e-6)
    assert {r["delta_total"] for r in curves["rows"]} == {1e-6}


def _store(path):
    raw = {"data": {"name": "synthetic", "users": 10}, "train": {"rounds": 5},
           "privacy": {"accountants": ["tight"]},
           "sweep": {"points": [{"train.aggregation": "ota"},
                                *({"train.aggregation": "digital", "digital.mechanism": m,
                                   "privacy.accountants": ["digital"]} for m in ("pbm", "skellam", "ddg"))],
                     "seeds": [0]}}
    _, grid = expand_grid(raw)
    with open_store(path) as store:
        for i, pt in enumerate(grid):
            digital = pt.spec.train.aggregation == "digital"
            acc = "digital" if digital else "tight"
            summary = {"final_test_accuracy": 0.8 + 0.01 * i, "rounds": 5, "users": 10, "mean_participants": 5.0,
                       "channel_uses_per_round": 1e5 * (i + 1) if digital else 16.0,
                       "energy_per_round": 1e3 * (i + 1), "outages_per_round": 0.5 * i,
                       f"{acc}_epsilon_central": 1.0, f"{acc}_epsilon_central_total": 5.0 + i,
                       f"{acc}_epsilon_local_max": 9.0, f"{acc}_epsilon_local_total": 90.0}
            rid = store.mark_running(pt.params, pt.train, pt.values)
            store.mark_done(rid, summary, [{"round": 1, "participants": 5}])
    return str(path)


def test_the_table_shows_cost_columns_and_blanks_digital_keys_of_over_the_air_rows(tmp_path):
    path = _store(tmp_path / "r.sqlite")
    res = CliRunner().invoke(cli, ["table", path])
    assert res.exit_code == 0, res.output
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in res.stdout.splitlines() if ln.startswith("|")]
    head, _, *body = rows
    assert head[-3:] == ["channel uses", "energy", "outages"]
    mech = head.index("digital.mechanism")
    by_agg = {r[head.index("train.aggregation")] + r[mech]: r for r in body}
    assert by_agg["ota–"][-3] == "16.0" and by_agg["digitalpbm"][-3] == "200000"  # 3 significant figures
    # both systems' leakage by default: the over-the-air accountant's block, then digital's
    c_total = [i for i, h in enumerate(head) if "ε_c total" in h]
    assert [head[i].split()[0] for i in c_total] == ["tight", "digital"]
    assert by_agg["ota–"][c_total[0]] == "5.00" and by_agg["ota–"][c_total[1]] == "–"
    assert by_agg["digitalddg"][c_total[0]] == "–" and by_agg["digitalddg"][c_total[1]] == "8.00"
    csv = CliRunner().invoke(cli, ["table", path, "--format", "csv"]).stdout.splitlines()
    assert csv[0].endswith("channel_uses_per_round,energy_per_round,outages_per_round")


def test_plot_digital_writes_the_figure(tmp_path):
    path = _store(tmp_path / "r.sqlite")
    out = tmp_path / "fig.png"
    res = CliRunner().invoke(cli, ["plot-digital", path, "--out", str(out), "--no-curves"])
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 10_000
    bad = CliRunner().invoke(cli, ["plot-digital", path, "--out", str(tmp_path / "fig.bmp"), "--no-curves"])
    assert bad.exit_code == 2 and bad.output.startswith("error:")


def test_the_digital_figures_epsilon_axes_state_the_totals_delta():
    from types import SimpleNamespace

    from otafl.report.digital_figure import _central_total, _epsilon_label

    run = SimpleNamespace(params={"privacy": {"accountants": ["exact"]}},
                          summary={"exact_epsilon_central_total": 26.3, "exact_delta_central_total": 1e-5})
    assert _central_total(run) == (26.3, 1e-5)
    assert _epsilon_label([1e-5, 1e-5]) == "central ε over the run at δ = 1e-05 (composed; user level)"
    assert _epsilon_label([1e-5, 2e-5]) == "central ε over the run at δ = 1e-05–2e-05 (composed; user level)"
    assert _epsilon_label([None]) == "central ε over the run (composed; user level)"
