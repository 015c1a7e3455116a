"""`otafl calibrate` through click's CliRunner (a tiny synthetic spec, bounds-only runs)."""

import json
import math

import pytest
from click.testing import CliRunner

from otafl.api.calibrate import CalibrationResult
from otafl.cli.main import cli
from otafl.config import load_spec
from otafl.fl.loop import run_experiment

TINY = ["--set", "data.name='synthetic'", "--set", "data.users=20", "--set", "train.rounds=5",
        "--set", "privacy.accountants=['paper','tight']", "--set", "privacy.delta_total=1e-2"]  # K = 20 needs room
SIGMA2 = ["calibrate", *TINY, "--solve", "transmit.sigma2", "--target-epsilon", "30", "--accountant", "tight"]
KEYS = {"knob", "value", "intervals", "epsilon_total", "epsilon_round", "delta", "delta_round", "unit", "accountant",
        "scope",
        "target_epsilon", "evaluations"}


def invoke(args):
    return CliRunner().invoke(cli, args)


@pytest.fixture(scope="module")
def as_json():
    res = invoke([*SIGMA2, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_json_has_the_documented_keys_and_a_value_that_meets_the_target(as_json):
    out = as_json
    assert set(out) == KEYS
    assert out["knob"] == "transmit.sigma2" and out["accountant"] == "tight" and out["scope"] == "central"
    assert out["target_epsilon"] == 30.0 and out["epsilon_total"] <= 30.0 and out["evaluations"] > 12
    assert out["intervals"] == [[out["value"], 1000.0]]
    spec = load_spec(None, [a for a in TINY if a != "--set"] + [f"transmit.sigma2={out['value']}"])
    s = run_experiment(spec, train=False).summary
    assert s["tight_epsilon_central_total"] == out["epsilon_total"] <= 30.0
    assert s["tight_delta_central_total"] == out["delta"]


def test_json_writes_non_finite_numbers_as_strings():
    r = CalibrationResult(knob="sampling.p", value=1.0, intervals=[(0.5, 1.0)], epsilon_total=math.inf,
                          epsilon_round=math.nan, delta=1e-5, delta_round=1e-5, accountant="tight",
                          scope="central", target_epsilon=1.0, target_delta=None, value_range=(0.01, 1.0),
                          evaluations=3, prefer="max", spec=None, summary={})
    out = json.loads(json.dumps(r.to_json()))
    assert out["epsilon_total"] == "inf" and out["epsilon_round"] == "nan" and set(out) == KEYS


def test_text_prints_the_intervals_the_choice_and_a_table(as_json):
    res = invoke(SIGMA2)
    assert res.exit_code == 0, res.output
    assert f"chosen transmit.sigma2 = {as_json['value']:.6g}" in res.output
    assert "meets the target on [" in res.output and "least noise" in res.output
    lines = res.output.splitlines()
    assert any(ln.split()[:1] == ["epsilon"] and float(ln.split()[-1]) <= 30.0 for ln in lines)
    assert any(ln.split()[:1] == ["delta"] for ln in lines)


def test_write_reads_back_and_refuses_to_overwrite(tmp_path, as_json):
    path = tmp_path / "calibrated.toml"
    res = invoke([*SIGMA2, "--format", "json", "--write", str(path)])
    assert res.exit_code == 0, res.output
    text = path.read_text()
    assert text.startswith("# Calibrated by `otafl calibrate`") and "tight central" in text and "<= 30" in text
    spec = load_spec(path)
    assert spec.transmit.sigma2 == json.loads(res.output)["value"] == as_json["value"]
    assert spec.data.users == 20 and spec.train.rounds == 5 and "tight" in spec.privacy.accountants
    assert [p.name for p in tmp_path.iterdir()] == ["calibrated.toml"]  # no temporary file left

    path.write_text("# mine\n")
    res = invoke([*SIGMA2, "--write", str(path)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "--overwrite" in res.output and path.read_text() == "# mine\n"
    res = invoke([*SIGMA2, "--write", str(path), "--overwrite", "--set", "train.rounds=4"])
    assert res.exit_code == 0, res.output
    assert load_spec(path).train.rounds == 4


def test_rounds_json_value_is_an_integer():
    res = invoke(["calibrate", *TINY, "--solve", "train.rounds", "--target-epsilon", "100",
                  "--accountant", "tight", "--range", "1,60", "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert isinstance(out["value"], int) and out["value"] == out["intervals"][-1][1] >= 5


@pytest.mark.parametrize("extra, needle", [
    (["--solve", "sampling.p", "--target-epsilon", "10", "--range", "0,1"], "sampling.p range low end = 0.0 is outside the allowed range (0, 1]"),
    (["--solve", "sampling.p", "--target-epsilon", "10", "--range", "0.5,2"], "(0, 1]"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "0"], "target_epsilon = 0.0 is outside the allowed range (0, inf)"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "-3"], "target_epsilon = -3.0"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "10", "--range", "1"], "--range"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "10", "--range", "5,1"], "LO < HI"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "10", "--range", "a,b"], "--range = 'a'"),
    (["--solve", "transmit.sigma", "--target-epsilon", "10"], "transmit.sigma"),
    (["--solve", "train.rounds", "--target-epsilon", "10", "--range", "0,9"], "[1, inf)"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "10", "--target-delta", "2"], "--delta-total = 2.0"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "10", "--set", "sampling.p=3"], "sampling.p = 3"),
    (["--solve", "transmit.sigma2", "--target-epsilon", "0.5", "--accountant", "tight", "--range", "0.001,1",
      "--grid-points", "4"], "no transmit.sigma2 in [0.001, 1] meets tight central epsilon_total <= 0.5: the best found is"),
])
def test_bad_input_and_no_solution_exit_2_with_one_line(extra, needle):
    res = invoke(["calibrate", *TINY, *extra])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output
    assert needle in lines[0], lines[0]
