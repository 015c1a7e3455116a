"""otafl.api.bound without click: the grid, the channel preset as a run sees it, the text table."""

from __future__ import annotations

import math

import pytest
import torch

from otafl.api import PAPER_DIM
from otafl.api.bound import bound_grid, channel_gain_floor
from otafl.errors import OtaflInputError
from otafl.privacy.accountants import paper_round, tight_round
from otafl.privacy.accountants.result import FLAGGED_REASONS
from otafl.report.text import bound_text, fmt_number, fmt_sig, render_table

GRID = dict(users=[200], p=[0.1, 0.5, 0.9], sigma2=[0.1], clip=[1.0], snr_db=[10.0], n0=0.0)

TWO_GROUPS = """\
users = 12
snr_db = [5.0, 20.0]
group_sizes = [5, 7]
fading = "ar-rician"
rician_k = 2.0
rho = 0.3
n0 = 0.5
large_scale_gain = [1.0, 0.4]
"""


def test_paper_dim_is_the_single_layer_mnist_model():
    assert PAPER_DIM == 784 * 10 + 10 == 7850


def test_rows_match_the_accountants_and_follow_the_grid_order():
    out = bound_grid(**GRID, accountants=["paper", "tight"])
    rows, meta = out["rows"], out["meta"]
    assert len(rows) == 6 and meta["points"] == 3 and meta["accountants"] == ["paper", "tight"]
    assert meta["dim"] == PAPER_DIM and meta["n0"] == 0.0 and meta["channel"] is None
    p = torch.tensor(GRID["p"], dtype=torch.float64)
    kw = dict(participation_prob=p, users=200, noise_var=0.1, sensitivity=2.0, alignment_gain=1.0, n0=0.0,
              delta_l=1e-5)
    for name, fn in (("paper", paper_round), ("tight", tight_round)):
        mine = [r for r in rows if r["accountant"] == name]
        assert [r["p"] for r in mine] == GRID["p"]
        ref = fn(**kw)
        assert [r["epsilon_central"] for r in mine] == pytest.approx(ref.epsilon_central.tolist(), rel=1e-12)
        assert [r["epsilon_local"] for r in mine] == pytest.approx(ref.epsilon_local.tolist(), rel=1e-12)
        assert [r["mean_participants"] for r in mine] == pytest.approx([200 * v for v in GRID["p"]])
        flagged = FLAGGED_REASONS.get(name, "")  # paper is flagged at these points, and says why
        assert all(r["defined"] and r["reason"] == flagged for r in mine)


def test_h1_alignment_gain_is_the_power_budget_formula_and_n0_defaults_to_one():
    out = bound_grid(users=[50], p=[0.5], sigma2=[0.1, 1.0], clip=[0.5], snr_db=[0.0, 20.0], dim=100,
                     accountants=["paper"])
    assert out["meta"]["n0"] == 1.0 and len(out["rows"]) == 4
    for r in out["rows"]:
        c = math.sqrt(10 ** (r["snr_db"] / 10) * 100 * 1.0 / (0.25 + 100 * r["sigma2"]))
        assert r["alignment_gain"] == pytest.approx(c, rel=1e-12)
        assert r["channel_noise_var"] == pytest.approx(1.0 / c**2, rel=1e-12)


def test_rounds_add_totals_and_undefined_points_are_inf_with_a_reason():
    out = bound_grid(users=[200], p=[0.02, 0.5], sigma2=[0.1], clip=[1.0], snr_db=[10.0], rounds=20,
                     accountants=["tight"])
    bad, good = out["rows"]
    assert bad["epsilon_central"] == math.inf and bad["defined"] is False and "delta'" in bad["reason"]
    assert good["rounds"] == 20 and good["composition"] in ("basic", "advanced", "rdp", "pld")
    assert good["epsilon_central"] <= good["epsilon_central_total"] <= 20 * good["epsilon_central"]


@pytest.mark.parametrize("names", [[], ()])
def test_no_accountant_is_an_input_error(names):
    with pytest.raises(OtaflInputError, match="^no accountant given$"):
        bound_grid(**GRID, accountants=names)


def test_unknown_accountant_and_channel_with_users_are_input_errors():
    with pytest.raises(OtaflInputError, match="magic"):
        bound_grid(**GRID, accountants=["magic"])
    with pytest.raises(OtaflInputError, match="channel preset"):
        bound_grid(**GRID, accountants=["paper"], channel="paper-three-groups")


def test_channel_gain_floor_is_the_run_channel_plan(tmp_path):
    from otafl.config import spec_from_mapping
    from otafl.setup import build_channel

    preset = tmp_path / "two.toml"
    preset.write_text(TWO_GROUPS)
    floor, info = channel_gain_floor(str(preset), rounds=6, dim=300, seed=7)
    spec = spec_from_mapping({"channel": {"preset": str(preset)}, "train": {"rounds": 6, "seed": 7}})
    plan = build_channel(spec, dim=300)
    assert floor.shape == (6,) and torch.equal(floor, plan.gain_floor)
    assert info["users"] == 12 and info["group_sizes"] == [5, 7] and info["large_scale_gain"] == [1.0, 0.4]
    assert info["path"] == str(preset) and info["n0"] == 0.5
    # n0 overrides the preset's N0 (and so the budgets P = SNR d N0: B scales with sqrt(N0))
    floor2, info2 = channel_gain_floor(str(preset), rounds=6, dim=300, seed=7, n0=2.0)
    assert info2["n0"] == 2.0 and floor2 == pytest.approx(floor * 2.0, rel=1e-12)


def test_bound_channel_sees_the_gains_of_a_run_of_the_same_spec_and_seed(tmp_path):
    from otafl.config import spec_from_mapping
    from otafl.fl.loop import run_experiment

    preset = tmp_path / "two.toml"
    preset.write_text(TWO_GROUPS)
    sigma2, clip, rounds, seed = 0.2, 1.5, 5, 3
    spec = spec_from_mapping({"channel": {"preset": str(preset)}, "data": {"name": "synthetic"},
                              "train": {"rounds": rounds, "seed": seed},
                              "transmit": {"sigma2": sigma2, "clip": clip}})
    run = run_experiment(spec, train=False, device="cpu")
    c_run = [r["alignment_gain"] for r in run.rounds]
    dim = run.summary["dim"]
    assert len(c_run) == rounds and dim != PAPER_DIM

    out = bound_grid(channel=str(preset), users=[], snr_db=[], p=[0.5], sigma2=[sigma2], clip=[clip],
                     rounds=rounds, seed=seed, dim=dim, accountants=["paper", "tight"])
    assert {r["users"] for r in out["rows"]} == {12} and out["meta"]["n0"] == 0.5
    for row in out["rows"]:
        assert row["alignment_gain"] == pytest.approx(sum(c_run) / rounds, rel=1e-12, abs=0)
        assert row["channel_noise_var"] == pytest.approx(sum(0.5 / c**2 for c in c_run) / rounds, rel=1e-12)
    floor, _ = channel_gain_floor(str(preset), rounds=rounds, dim=dim, seed=seed)
    per_round = (floor / math.sqrt(clip**2 + dim * sigma2)).tolist()
    assert per_round == pytest.approx(c_run, rel=1e-12, abs=0)


TOTALS = ("epsilon_central_total", "delta_central_total", "epsilon_local_total", "delta_local_total")


@pytest.mark.parametrize("seed,p", [(3, 0.5), (11, 0.8)])
def test_bound_rounds_states_the_totals_of_a_run_of_the_same_preset_t_and_seed(tmp_path, seed, p):
    """`bound --rounds T --channel PRESET` composes as account_run does: the run's totals, same compositions."""
    from otafl.config import spec_from_mapping
    from otafl.fl.loop import run_experiment

    preset = tmp_path / "two.toml"
    preset.write_text(TWO_GROUPS)
    sigma2, clip, rounds, names = 0.2, 1.5, 6, ["paper", "tight", "exact"]
    spec = spec_from_mapping({"channel": {"preset": str(preset)}, "data": {"name": "synthetic"},
                              "train": {"rounds": rounds, "seed": seed}, "sampling": {"p": p},
                              "transmit": {"sigma2": sigma2, "clip": clip}, "privacy": {"accountants": names}})
    run = run_experiment(spec, train=False, device="cpu").summary
    out = bound_grid(channel=str(preset), users=[], snr_db=[], p=[p], sigma2=[sigma2], clip=[clip],
                     rounds=rounds, seed=seed, dim=run["dim"], accountants=names)
    assert out["meta"]["composition"] == "pld"
    for row in out["rows"]:
        a = row["accountant"]
        assert row["composition"] == run[f"{a}_composition"]
        assert row["composition_local"] == run[f"{a}_composition_local"]
        for key in TOTALS:
            assert row[key] == pytest.approx(run[f"{a}_{key}"], rel=1e-9, abs=0), (a, key)
    assert {r["composition"] for r in out["rows"]} >= {"pld"}


def test_rdp_composition_keeps_the_older_totals_which_pld_never_exceeds():
    kw = dict(users=[200], p=[0.3, 0.9], sigma2=[0.1], clip=[1.0], snr_db=[10.0], n0=0.0, rounds=30,
              delta_target=None)  # each accountant's own total delta, the older default
    pld = bound_grid(**kw, accountants=["paper", "tight", "exact"])
    rdp = bound_grid(**kw, accountants=["paper", "tight", "exact"], composition="rdp")
    assert rdp["meta"]["composition"] == "rdp" and pld["meta"]["composition"] == "pld"
    for a, b in zip(pld["rows"], rdp["rows"], strict=True):
        assert b["composition"] in ("basic", "advanced", "rdp") and b["composition_local"] in ("basic", "advanced",
                                                                                                "rdp")
        for key in ("epsilon_central_total", "epsilon_local_total"):
            # paper, tight: pld is one more candidate at the same target; exact: its PLD at the
            # target (T + 1) delta_l against basic at T delta_l or advanced at the target
            assert a[key] <= b[key] * (1 + 1e-12), (a["accountant"], key)
    exact = [r for r in pld["rows"] if r["accountant"] == "exact"]
    assert [r["composition"] for r in exact] == ["pld", "pld"]
    assert [r["delta_central_total"] for r in exact] == pytest.approx([31e-5, 31e-5], rel=1e-12)
    # exact's own deltas, as account_run states them: (T + 1) delta_l central, T p delta_l + delta_l local
    assert [r["delta_local_total"] for r in exact] == pytest.approx([30 * 0.3e-5 + 1e-5, 30 * 0.9e-5 + 1e-5],
                                                                    rel=1e-12)


def test_rdp_classic_is_for_the_steps_accountant_only():
    with pytest.raises(OtaflInputError, match="rdp-classic"):
        bound_grid(**GRID, accountants=["paper", "steps"], rounds=3, composition="rdp-classic")
    with pytest.raises(OtaflInputError, match="composition"):
        bound_grid(**GRID, accountants=["paper"], rounds=3, composition="advanced")
    out = bound_grid(**GRID, accountants=["steps"], rounds=3, composition="rdp-classic")
    assert {r["composition"] for r in out["rows"]} == {"rdp-classic"}


def test_fmt_number_and_render_table():
    assert [fmt_number(v) for v in (1171.3, 0.000123456, math.inf, -math.inf, math.nan, 3, None, True, "x")] == \
        ["1170", "0.000123", "inf", "-inf", "nan", "3", "-", "yes", "x"]
    text = render_table(["a", "bb"], [[1.0, "x!"], [10, None]])
    assert text == "   a  bb\n1.00  x!\n  10   -\n"


def test_every_float_cell_has_three_significant_figures_and_no_exponent_between_1e_4_and_1e6():
    assert [fmt_sig(v) for v in (0.8, 13.0, 1171.3, 999.6, 9.996, 2.5e7, 1e-5, 0.000123456, 0.0, -0.05)] == \
        ["0.800", "13.0", "1170", "1000", "10.0", "2.50e+07", "1.00e-05", "0.000123", "0", "-0.0500"]


def test_bound_text_puts_the_accountants_side_by_side_with_the_legend():
    out = bound_grid(**GRID, accountants=["paper", "tight"], rounds=3)
    lines = bound_text(out).splitlines()
    assert lines[0].split() == ["users", "p", "sigma2", "clip", "snr_db", "mu", "paper:eps_local",
                                "paper:eps_central", "paper:delta_central", "paper:eps_central_total",
                                "paper:delta_total", "tight:eps_local", "tight:eps_central", "tight:delta_central",
                                "tight:eps_central_total", "tight:delta_total"]
    assert lines[2].split()[7] == fmt_number(out["rows"][1]["epsilon_central"]) + "!"
    assert lines[2].split()[9] == fmt_number(out["rows"][1]["epsilon_central_total"]) + "!"  # the total too
    assert any(line.startswith("! paper's classic Gaussian step") for line in lines)


def _calls():
    calls = []
    return calls, lambda done, total: calls.append((done, total))


def test_progress_goes_from_zero_to_the_total_once_per_chunk(monkeypatch):
    import otafl.api.bound as bound_module

    monkeypatch.setattr(bound_module, "CHUNK_ELEMENTS", 2)
    calls, progress = _calls()
    bound_grid(**GRID, accountants=["paper", "tight"], progress=progress)
    total = 3 * 2  # points x accountants
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    done = [d for d, t in calls]
    assert done == sorted(done) and len(calls) >= 4 and {t for _, t in calls} == {total}


def test_chunked_evaluation_gives_the_rows_of_one_chunk(monkeypatch, tmp_path):
    import otafl.api.bound as bound_module

    preset = tmp_path / "two.toml"
    preset.write_text(TWO_GROUPS)
    cases = [dict(users=[20, 200], p=[0.02, 0.5], sigma2=[0.1, 1.0], clip=[1.0], snr_db=[0.0, 20.0],
                  accountants=["paper", "tight"], rounds=4),
             dict(users=[30], p=[0.5], sigma2=[0.5], clip=[1.0], snr_db=[10.0], dim=20, accountants=["exact"]),
             dict(channel=str(preset), users=[], snr_db=[], p=[0.3, 0.7], sigma2=[0.2], clip=[1.0], rounds=6,
                  seed=2, accountants=["paper", "tight"])]
    whole = [bound_grid(**kw) for kw in cases]
    monkeypatch.setattr(bound_module, "CHUNK_ELEMENTS", 5)
    monkeypatch.setattr(bound_module, "SLOW_PIECE", {"exact": 1, "paper": 2})
    for kw, ref in zip(cases, whole):
        out = bound_grid(**kw)
        assert out["meta"] == ref["meta"]
        for a, b in zip(out["rows"], ref["rows"], strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert a[key] == (pytest.approx(b[key], rel=1e-12) if isinstance(b[key], float) and
                                  math.isfinite(b[key]) else b[key]), key


def test_channel_without_rounds_draws_the_default_rounds_and_reports_the_worst(monkeypatch, tmp_path):
    import otafl.api.bound as bound_module

    preset = tmp_path / "two.toml"
    preset.write_text(TWO_GROUPS)
    monkeypatch.setattr(bound_module, "DEFAULT_CHANNEL_ROUNDS", 40)
    kw = dict(channel=str(preset), users=[], snr_db=[], p=[0.3, 0.9], sigma2=[0.05, 0.2], clip=[1.0], seed=5,
              dim=300, accountants=["paper", "tight"])
    worst = bound_grid(**kw)
    # the same 40 rounds, each one evaluated (delta_target None: the per-round auto delta', not a run's share)
    every = bound_grid(**kw, rounds=40, delta_target=None)
    info = worst["meta"]["channel"]
    assert info["fading_rounds"] == 40 and info["evaluated_rounds"] == 1 and worst["meta"]["rounds"] is None
    assert every["meta"]["channel"]["evaluated_rounds"] == 40 and every["meta"]["channel"]["worst_round"] is None
    floor, _ = channel_gain_floor(str(preset), rounds=40, dim=300, seed=5)
    assert info["worst_round"] == int(torch.argmax(floor))
    for a, b in zip(worst["rows"], every["rows"], strict=True):
        assert "epsilon_central_total" not in a
        # the round of the largest gain dominates: its bound is the maximum over the rounds
        for key in ("epsilon_local", "epsilon_central", "delta_local", "delta_central", "classic_valid",
                    "classic_valid_local", "reason", "alignment_gain", "channel_noise_var"):
            if isinstance(b[key], float):
                assert a[key] == pytest.approx(b[key], rel=1e-12), key
            else:  # flags and reason texts
                assert a[key] == b[key], key


def test_memory_guard_counts_the_rows_and_one_chunk(monkeypatch):
    from otafl.limits import MEMORY_ENV

    monkeypatch.setenv(MEMORY_ENV, str(10 / 1024))  # 10 MiB
    few = dict(users=[200], p=[0.5], sigma2=[0.1], clip=[1.0], snr_db=[10.0], accountants=["paper"])
    assert len(bound_grid(**{**few, "p": [0.01 * i for i in range(1, 101)]})["rows"]) == 100
    with pytest.raises(OtaflInputError, match="memory limit"):  # 20000 rows of ~1 KB
        bound_grid(**{**few, "p": [(i + 1) / 20000 for i in range(20000)]})
    with pytest.raises(OtaflInputError, match="memory limit"):  # one point, a rounds axis of 10^6
        bound_grid(**few, rounds=10**6)
