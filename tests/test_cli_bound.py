"""``otafl bound`` through click's CliRunner."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from otafl.cli.main import cli
from otafl.privacy.accountants import paper_round, tight_round
from otafl.results import unjson

ROW_KEYS = {"users", "p", "sigma2", "clip", "accountant", "epsilon_local", "delta_local", "epsilon_central",
            "delta_central", "mean_participants", "defined", "reason"}
TOTAL_KEYS = {"epsilon_central_total", "delta_central_total", "composition"}
TABLE_II = ["--users", "200", "--p", "0.1,0.3,0.5,0.7,0.9", "--sigma2", "0.1", "--clip", "1", "--delta-l", "1e-5",
            "--n0", "0", "--device", "cpu"]


def run(*args):
    return CliRunner().invoke(cli, ["bound", *args])


def strict_json(text):
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=reject)


def test_json_rows_carry_the_issue_keys_and_match_the_library():
    res = run(*TABLE_II, "--accountant", "paper,tight", "--format", "json")
    assert res.exit_code == 0, res.output
    out = strict_json(res.output)
    assert len(out["rows"]) == 10 and out["meta"]["points"] == 5
    assert out["meta"]["accountants"] == ["paper", "tight"]
    p = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9], dtype=torch.float64)
    kw = dict(participation_prob=p, users=200, noise_var=0.1, sensitivity=2.0, alignment_gain=1.0, n0=0.0,
              delta_l=1e-5)
    for name, fn in (("paper", paper_round), ("tight", tight_round)):
        rows = [r for r in out["rows"] if r["accountant"] == name]
        assert [r["p"] for r in rows] == p.tolist()
        assert all(ROW_KEYS <= set(r) for r in rows)
        expected = fn(**kw)
        assert [r["epsilon_central"] for r in rows] == pytest.approx(expected.epsilon_central.tolist(), rel=1e-12)
        assert [r["epsilon_local"] for r in rows] == pytest.approx(expected.epsilon_local.tolist(), rel=1e-12)
        assert [r["mean_participants"] for r in rows] == pytest.approx([200 * v for v in p.tolist()])


def test_table_shows_the_accountants_side_by_side_and_flags_the_classic_step():
    res = run(*TABLE_II, "--accountant", "paper", "--accountant", "tight")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "paper:eps_central" in lines[0] and "tight:eps_central" in lines[0]
    assert len([line for line in lines[1:] if line.strip().startswith("200")]) == 5
    assert "!" in lines[1] and "validity range" in res.output


def test_comma_list_and_repeated_accountant_options_agree():
    a = run(*TABLE_II, "--accountant", "paper,tight", "--format", "csv")
    b = run(*TABLE_II, "--accountant", "paper", "--accountant", "tight", "--format", "csv")
    assert a.exit_code == b.exit_code == 0 and a.output == b.output
    header = a.output.splitlines()[0].split(",")
    assert header[:6] == ["users", "p", "sigma2", "clip", "snr_db", "accountant"]


def test_grid_is_the_product_of_the_lists_and_alignment_gain_follows_the_power_budget():
    res = run("--users", "50,100", "--p", "0.5", "--sigma2", "0.1,1", "--clip", "1,0.1", "--snr-db", "0,20",
              "--n0", "2", "--dim", "100", "--format", "json", "--device", "cpu", "--accountant", "paper")
    assert res.exit_code == 0, res.output
    rows = strict_json(res.output)["rows"]
    assert len(rows) == 16
    for r in rows:
        power = 10 ** (r["snr_db"] / 10) * 100 * 2.0
        c = math.sqrt(power / (r["clip"] ** 2 + 100 * r["sigma2"]))
        assert r["alignment_gain"] == pytest.approx(c, rel=1e-12)
        assert r["channel_noise_var"] == pytest.approx(2.0 / c**2, rel=1e-12)


def test_rounds_add_totals_between_the_worst_round_and_basic_composition():
    res = run(*TABLE_II[:2], "--p", "0.5,0.9", "--accountant", "paper,tight", "--rounds", "50", "--format", "json")
    assert res.exit_code == 0, res.output
    for r in strict_json(res.output)["rows"]:
        assert TOTAL_KEYS <= set(r) and r["rounds"] == 50
        assert r["composition"] in ("basic", "advanced", "rdp", "pld")
        assert r["epsilon_central"] <= r["epsilon_central_total"] <= 50 * r["epsilon_central"]


def test_composition_names_come_from_the_registry_and_pld_is_the_default():
    from otafl.cli.bound import bound as command
    from otafl.privacy.analysis.steps import COMPOSITIONS

    option = next(o for o in command.params if o.name == "composition")
    assert tuple(option.type.choices) == COMPOSITIONS and option.default == "pld"
    args = [*TABLE_II[:2], "--p", "0.5", "--sigma2", "0.1", "--n0", "0", "--rounds", "20", "--format", "json",
            "--accountant", "tight,exact", "--delta-total", "1e-3"]  # basic/advanced need sum_t delta_t below it
    pld, rdp = (strict_json(run(*args, *extra).output) for extra in ([], ["--composition", "rdp"]))
    assert pld["meta"]["composition"] == "pld" and rdp["meta"]["composition"] == "rdp"
    assert [r["composition"] for r in pld["rows"]] == ["pld", "pld"]
    assert all(r["composition"] in ("basic", "advanced", "rdp") for r in rdp["rows"])
    for a, b in zip(pld["rows"], rdp["rows"], strict=True):
        assert a["epsilon_central_total"] < b["epsilon_central_total"]


def test_rdp_classic_outside_steps_exits_2_with_one_line():
    res = run("--accountant", "paper", "--rounds", "3", "--composition", "rdp-classic", "--device", "cpu")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "steps accountant only" in res.stderr


def test_undefined_points_are_the_string_inf_in_json_with_a_reason():
    res = run("--users", "200", "--p", "0.02,0.5", "--rounds", "3", "--format", "json", "--device", "cpu",
              "--accountant", "paper")
    assert res.exit_code == 0, res.output
    out = strict_json(res.output)
    rows = out["rows"]
    assert rows[0]["epsilon_central"] == "inf" and rows[0]["epsilon_central_total"] == "inf"
    assert rows[0]["defined"] is False and "delta'" in rows[0]["reason"]
    assert rows[1]["defined"] is True and isinstance(rows[1]["epsilon_central"], float)
    assert rows[1]["reason"].startswith("flagged, not a guaranteed bound: paper's classic")  # a flag says why too
    assert out["meta"]["non_finite"].startswith('JSON writes non-finite numbers as the strings "inf"')
    # the run store's reader turns them back into floats
    assert unjson(rows[0])["epsilon_central"] == math.inf
    csv_line = run("--users", "200", "--p", "0.02", "--format", "csv", "--device", "cpu",
                   "--accountant", "paper").output.splitlines()[1]
    assert ",inf," in csv_line


@pytest.mark.parametrize("value", ["", ",", " , "])
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_no_accountant_exits_2_with_one_line(value, fmt):
    res = run("--accountant", value, "--format", fmt, "--device", "cpu")
    assert res.exit_code == 2, res.output
    assert res.stderr == "error: no accountant given\n" and res.stdout == ""


def test_channel_preset_draws_fading_reproducibly():
    args = ["--channel", "paper-three-groups", "--p", "0.5", "--sigma2", "0.1", "--rounds", "5", "--format", "json",
            "--device", "cpu", "--accountant", "tight"]
    a, b = run(*args, "--seed", "1"), run(*args, "--seed", "1")
    c = run(*args, "--seed", "2")
    assert a.exit_code == 0, a.output
    assert a.output == b.output and a.output != c.output
    out = strict_json(a.output)
    row = out["rows"][0]
    assert row["users"] == 200 and row["snr_db"] is None and out["meta"]["channel"]["fading"] == "ar-rician"
    # The min over 200 users of a fading channel is far below the h = 1 gain at 2 dB.
    flat = strict_json(run("--users", "200", "--p", "0.5", "--sigma2", "0.1", "--snr-db", "2", "--format", "json",
                           "--device", "cpu", "--accountant", "tight").output)["rows"][0]
    assert 0 < row["alignment_gain"] < flat["alignment_gain"]


def test_exact_is_the_default_accountant_and_quiet_prints_nothing_on_stderr():
    for extra in ([], ["--quiet"]):  # stderr is not a terminal here: no bar either way
        res = run("--p", "0.5", "--format", "json", "--device", "cpu", *extra)
        assert res.exit_code == 0, res.output
        assert res.stderr == ""
        out = strict_json(res.stdout)
        assert out["meta"]["accountants"] == ["exact"] and out["rows"][0]["accountant"] == "exact"


def test_channel_without_rounds_takes_the_worst_of_1000_rounds_stable_across_seeds():
    # One fading draw gave local epsilons 10x apart between seeds; the worst of 1000 rounds does not.
    rows = []
    for seed in range(4):
        res = run("--channel", "paper-three-groups", "--p", "0.5", "--sigma2", "0.1", "--seed", str(seed),
                  "--format", "json", "--device", "cpu", "--quiet")
        assert res.exit_code == 0, res.output
        out = strict_json(res.stdout)
        assert out["meta"]["rounds"] is None and out["meta"]["channel"]["fading_rounds"] == 1000
        assert "1000 rounds" in out["meta"]["alignment"] and "epsilon_central_total" not in out["rows"][0]
        rows.append(out["rows"][0])
    assert all(r["accountant"] == "exact" for r in rows)
    for key in ("epsilon_local", "epsilon_central"):
        values = [r[key] for r in rows]
        assert max(values) < 1.1 * min(values), (key, values)


def test_channel_with_rounds_draws_exactly_t_rounds():
    res = run("--channel", "paper-three-groups", "--p", "0.5", "--rounds", "7", "--accountant", "tight",
              "--format", "json", "--device", "cpu")
    assert res.exit_code == 0, res.output
    out = strict_json(res.stdout)
    assert out["meta"]["channel"]["fading_rounds"] == out["meta"]["channel"]["evaluated_rounds"] == 7
    assert out["rows"][0]["rounds"] == 7 and "epsilon_central_total" in out["rows"][0]


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


def test_channel_preset_by_path_gives_the_gains_of_otafl_run(tmp_path):
    from otafl.config import spec_from_mapping
    from otafl.fl.loop import run_experiment

    preset = tmp_path / "two-groups.toml"
    preset.write_text(TWO_GROUPS)
    spec = spec_from_mapping({"channel": {"preset": str(preset)}, "data": {"name": "synthetic"},
                              "train": {"rounds": 5, "seed": 2}, "transmit": {"sigma2": 0.3, "clip": 0.5}})
    result = run_experiment(spec, train=False, device="cpu")
    c_run = [r["alignment_gain"] for r in result.rounds]
    res = run("--channel", str(preset), "--rounds", "5", "--seed", "2", "--sigma2", "0.3", "--clip", "0.5",
              "--p", "0.5", "--dim", str(result.summary["dim"]), "--format", "json", "--device", "cpu",
              "--accountant", "paper,tight")
    assert res.exit_code == 0, res.output
    out = strict_json(res.output)
    assert out["meta"]["channel"]["path"] == str(preset) and out["meta"]["channel"]["users"] == 12
    assert out["meta"]["n0"] == 0.5 and out["meta"]["dim"] == result.summary["dim"]
    for row in out["rows"]:
        assert row["users"] == 12
        assert row["alignment_gain"] == pytest.approx(sum(c_run) / len(c_run), rel=1e-12, abs=0)


@pytest.mark.parametrize("args,needle", [
    (["--p", "0"], "p = 0.0"),
    (["--p", "1.5"], "p = 1.5"),
    (["--p", "x"], "not a float"),
    (["--delta-l", "1"], "delta_l"),
    (["--delta-l", "0"], "delta_l"),
    (["--delta-prime", "1.2"], "delta_prime"),
    (["--sigma2", "-0.1"], "sigma2"),
    (["--users", "0"], "users"),
    (["--accountant", "magic"], "magic"),
    (["--accountant", "paper,magic"], "magic"),
    (["--channel", "no-such-preset"], "no-such-preset"),
    (["--channel", "paper-three-groups", "--users", "10"], "channel preset"),
])
def test_bad_input_exits_2_with_one_line_and_no_traceback(args, needle):
    res = run(*args, "--device", "cpu")
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error:") and needle in res.stderr
    assert "Traceback" not in res.output


def test_bound_table_shows_the_delta_and_flags_a_delta_above_one_over_k():
    res = run("--accountant", "tight", "--p", "0.05", "--device", "cpu")
    assert res.exit_code == 0, res.output
    header, row = res.output.splitlines()[:2]
    assert "tight:delta_central" in header and row.rstrip().endswith("#")
    assert "# delta above 1/K" in res.output
    ok = run("--accountant", "tight", "--p", "0.5", "--device", "cpu", "--max-delta", "1e-6")
    assert ok.output.splitlines()[1].rstrip().endswith("#")  # 5e-6 > the user's limit


def test_bound_totals_sit_at_delta_total_and_bad_values_are_one_line_errors():
    out = strict_json(run("--p", "0.5", "--sigma2", "1", "--rounds", "10", "--accountant", "tight,exact,steps",
                          "--delta-total", "1e-3", "--format", "json", "--device", "cpu").output)  # sigma2 1: steps' PLD small
    assert all(r["delta_central_total"] == 1e-3 and r["delta_local_total"] == 1e-3 for r in out["rows"])
    bad = run("--delta-total", "2", "--device", "cpu")
    assert bad.exit_code == 2 and bad.output.strip() == "error: delta_total = 2.0 is outside the allowed range (0, 1)"


def test_a_plain_bound_without_rounds_runs_at_the_default_delta_total():
    """The default --delta-total is for totals: without --rounds it is not an error (only an explicit one is)."""
    res = CliRunner().invoke(cli, ["bound", "--users", "200", "--p", "0.5", "--accountant", "tight"])
    assert res.exit_code == 0 and "tight:eps_central" in res.output, res.output
