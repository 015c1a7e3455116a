"""What an epsilon protects is named wherever it is shown, and every 0 and +inf says why
(docs/privacy/index.md#neighbours, otafl/privacy/units.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from otafl.cli.main import cli
from otafl.config import load_spec
from otafl.privacy.accountants.result import TOTAL_OUT_OF_RANGE, ZERO_REASON
from otafl.privacy.units import UNITS, unit_of, units_note

SMALL = ["data.name=synthetic", "data.users=20", "data.batch_size=8", "train.rounds=3", "train.eval_every=3"]


def bound(*args) -> dict:
    out = CliRunner().invoke(cli, ["bound", "--dim", "10", "--users", "20", "--p", "0.5", *args, "--format", "json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_the_units_of_the_accountants_and_a_mixed_note():
    assert unit_of("exact") == unit_of("tight") == unit_of("paper") == unit_of("digital") == "user"
    assert unit_of("steps") == "record" and unit_of("steps", local_steps=False) == "user"  # FedSGD reading
    note = units_note({"exact": "user", "steps": "record"})
    assert "MIXED UNITS" in note and UNITS["user"] in note and UNITS["record"] in note
    assert "MIXED" not in units_note({"exact": "user", "tight": "user"})


def test_a_fedavg_run_states_user_level_for_exact_and_record_level_for_steps():
    from otafl.fl.loop import run_experiment
    from otafl.report.text import run_text

    spec = load_spec("experiments/local-steps.toml", SMALL + [
        "privacy.accountants=['exact', 'steps']", "transmit.sigma2=0.01", "train.local_steps=2"])
    result = run_experiment(spec, train=False)
    s = result.summary
    assert s["exact_unit"] == "user" and s["steps_unit"] == "record"
    text = run_text({**s, "final_test_accuracy": math.nan}, ["exact", "steps"], "out")
    exact_line = next(line for line in text.splitlines() if line.strip().startswith("exact:"))
    steps_line = next(line for line in text.splitlines() if line.strip().startswith("steps:"))
    assert "user level" in exact_line and "record level" in steps_line


def test_bound_rows_name_their_unit_and_the_legend_says_when_units_mix():
    rows = bound("--accountant", "exact,steps", "--step-noise", "1", "--local-steps", "2", "--sigma2", "0.1")["rows"]
    assert {r["accountant"]: r["unit"] for r in rows} == {"exact": "user", "steps": "record"}
    out = CliRunner().invoke(cli, ["bound", "--dim", "10", "--users", "20", "--p", "0.5", "--accountant",
                                   "exact,steps", "--step-noise", "1", "--sigma2", "0.1"])
    assert "privacy unit: MIXED UNITS" in out.output
    same = CliRunner().invoke(cli, ["bound", "--dim", "10", "--users", "20", "--p", "0.5", "--accountant", "exact"])
    assert "privacy unit: exact: user level" in same.output and "MIXED" not in same.output


@pytest.mark.parametrize("args", [["--sigma2", "1e30"], ["--clip", "1e-30"], ["--p", "1e-9"]])
def test_a_zero_epsilon_says_why(args):
    rows = bound("--accountant", "exact,tight", *args)["rows"]
    zeros = [r for r in rows if r["epsilon_central"] == 0.0]
    assert zeros  # the noise dwarfs the sensitivity, or the user hardly takes part
    assert all(ZERO_REASON in r["reason"] and r["defined"] for r in zeros)


def test_every_infinite_epsilon_and_total_says_why():
    tiny = bound("--accountant", "exact", "--sigma2", "1e-10", "--n0", "0")["rows"][0]
    assert tiny["epsilon_central"] == "inf" and "numerical range" in tiny["reason"]
    rows = bound("--accountant", "exact,tight,paper", "--rounds", "3", "--delta-total", "1e-300")["rows"]
    for r in rows:
        assert r["epsilon_central_total"] == "inf" and r["total_reason"], r["accountant"]
    exact = next(r for r in rows if r["accountant"] == "exact")
    assert exact["total_reason"] == TOTAL_OUT_OF_RANGE.format(delta=1e-300)


def test_an_underflowing_snr_is_refused_in_one_line():
    """snr_db 2000 made the channel noise underflow: exact printed log((1 + p) / (1 - p)) = 1.10."""
    for cmd in (["bound", "--snr-db", "2000", "--sigma2", "0", "--n0", "1", "--accountant", "exact"],
                ["bound", "--snr-db", "-101"]):
        out = CliRunner().invoke(cli, cmd)
        assert out.exit_code == 2 and out.output.strip().splitlines() == [
            f"error: snr_db = {float(cmd[2])!r} is outside the allowed range [-100, 100]"]
    with pytest.raises(Exception, match=r"channel.snr_db = 1540.0 is outside the allowed range \[-100, 100\]"):
        load_spec("experiments/quickstart.toml", ["channel.snr_db=[1540.0, 10.0, 30.0]"])


def test_the_audit_names_the_unit_and_why_an_epsilon_is_infinite():
    out = CliRunner().invoke(cli, ["audit", "--users", "20", "--p", "0.5", "--sigma2", "0", "--n0", "0", "--dim",
                                   "10", "--samples", "2000", "--format", "json"])
    rows = json.loads(out.output)["rows"]
    assert all(r["unit"] == "user" and r["epsilon"] == "inf" and "no central noise" in r["reason"] for r in rows)


def test_update_clipping_sends_the_update_clipped_to_l_and_credits_nothing_linear():
    """transmit.update_scaling = clip (user-level DP-FedAvg): the update itself goes to the
    aggregator, which clips it to L; the steps accountant then credits neither the co-users' last
    noise nor the transmit noise, nor charges the bound's failure; bound: (L / B) u, linear."""
    from otafl.fl.least_squares import least_squares_model, least_squares_sums
    from otafl.fl.local import LocalSteps

    def steps(scaling):
        gen = torch.Generator().manual_seed(0)
        x = torch.zeros(40, 3, dtype=torch.float64)
        x[:, 0] = 1.0
        y = torch.full((40,), 1e6, dtype=torch.float64)  # every record's gradient is clipped along e_0
        return LocalSteps(algorithm="fedavg", model=least_squares_model(3), x_train=x, y_train=y,
                          index=torch.arange(40).view(4, 10), counts=torch.full((4,), 10), local_steps=3,
                          local_lr=0.5, server_lr=1.0, record_sampling=1.0, record_clip=1.0, step_noise=0.5,
                          transmit_clip=1.0, warm_start=False, mask_generator=gen, noise_generator=gen,
                          gradient_sums=least_squares_sums, update_scaling=scaling)

    everyone = torch.ones(4, dtype=torch.bool)
    clip, scaled = steps("clip"), steps("bound")
    sent_clip, _, clipped = clip.gradients(everyone)
    sent_bound, _, _ = scaled.gradients(everyone)
    assert clipped == 1.0 and bool((sent_clip.norms > 1.0).all())  # the aggregator clips every one to L
    torch.testing.assert_close(sent_bound.grads, sent_clip.grads * (1.0 / scaled.bound))  # same draws, scaled
    facts = clip.step_facts(credit_transmit_noise=True, credit_co_users=True)
    assert facts["co_user_noise"] == facts["transmit_to_record"] == facts["update_clip_failure"] == 0.0
    linear = scaled.step_facts(credit_transmit_noise=True, credit_co_users=True)
    assert linear["co_user_noise"] == 1.0 and linear["transmit_to_record"] > 0 and linear["update_clip_failure"] > 0
    with pytest.raises(Exception, match="transmit.update_scaling = 'clip' is for fedavg and scaffold"):
        load_spec("experiments/quickstart.toml", ["transmit.update_scaling='clip'"])
    with pytest.raises(Exception, match="transmit.update_scaling = 'norm' is not one of: bound, clip"):
        load_spec("experiments/local-steps.toml", ["transmit.update_scaling='norm'"])
