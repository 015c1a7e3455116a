"""The ``steps`` accountants: local DP-SGD steps, the sound last-step credit and the source's
sum-domination (``steps-sumdom``) (docs/privacy/steps.md#steps)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from otafl.cli.main import cli
from otafl.errors import OtaflInputError
from otafl.privacy.accountants.steps import steps_round, steps_sumdom_round, steps_totals
from otafl.privacy.accountants.steps_run import account_steps
from otafl.privacy.analysis.steps import (
    COMPOSITIONS,
    StepRound,
    compose_epsilon,
    round_rdp,
    subsampled_gaussian_epsilon,
)
from otafl.privacy.facts import RoundFacts

F64 = torch.float64

# Heikkilä et al., appendix A.7, Table 1: q = 0.1, each local model (5, 1e-5)-DP with per-party sigma;
# (steps, per-party sigma, {parties: (sigma total, eps of the averaged model)}).
SEED_TABLE = [
    (1, 0.69, {1: (0.69, 5.0), 2: (0.98, 2.78), 5: (1.54, 1.22), 10: (2.18, 0.64)}),
    (10, 0.90, {1: (0.90, 5.0), 2: (1.28, 2.61), 5: (2.02, 1.19), 10: (2.85, 0.72)}),
    (50, 1.18, {1: (1.18, 5.0), 2: (1.67, 2.85), 5: (2.64, 1.55), 10: (3.73, 1.03)}),
]


def facts(users, p, sigma, steps, q, rounds=1):
    return [RoundFacts(participation_prob=torch.full((users,), float(p), dtype=F64),
                       noise_var=torch.zeros(users, dtype=F64), alignment_gain=1.0, n0=0.0, sensitivity=2.0, dim=10,
                       participants=users, local_steps=steps, record_sampling=q, step_noise=sigma, record_clip=1.0)
            for _ in range(rounds)]


def test_the_seed_table_is_rdp_with_the_classic_conversion_to_two_decimals():
    """Every averaged-model eps of the table from the per-party sigma as printed times sqrt(N) parties,
    RDP of the Poisson-subsampled Gaussian with eps = rdp + log(1/delta)/(alpha - 1); the one-party rows are
    (5, 1e-5) to the table's one decimal; the sigma-total column is sigma sqrt(N) up to the rounding of sigma."""
    for steps, sigma, rows in SEED_TABLE:
        for parties, (sigma_total, eps) in rows.items():
            b = steps_sumdom_round(participation_prob=1.0, users=parties, noise_var=0.0, sensitivity=1.0,
                                   alignment_gain=1.0, n0=0.0, delta_l=1e-5, local_steps=steps, record_sampling=0.1,
                                   step_noise=sigma, composition="rdp-classic")
            digits = 1 if parties == 1 else 2
            assert round(float(b.epsilon_central), digits) == eps, (steps, parties, float(b.epsilon_central))
            assert float(b.quantile) == parties and float(b.delta_central) == 1e-5  # p = 1: the count is certain
            assert abs(sigma * math.sqrt(parties) - sigma_total) <= 0.01 + 1e-12
    # the tighter accountings give less, the first row for instance
    one = dict(participation_prob=1.0, users=2, noise_var=0.0, sensitivity=1.0, alignment_gain=1.0, n0=0.0,
               delta_l=1e-5, record_sampling=0.1, step_noise=0.69)
    eps = {c: float(steps_round(**one, composition=c).epsilon_central) for c in COMPOSITIONS}
    assert eps["pld"] < eps["rdp"] < eps["rdp-classic"]
    assert round(eps["pld"], 2) == 1.78 and round(eps["rdp"], 2) == 2.24


def test_one_party_is_the_single_party_dp_sgd_accountant_of_dp_accounting():
    import dp_accounting
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.1)), 10 * 3)
    pld, rdp = PLDAccountant(), RdpAccountant()
    pld.compose(event)
    rdp.compose(event)
    ours = {c: account_steps(facts(1, 1.0, 1.1, 10, 0.2, rounds=3), delta_l=1e-5, composition=c)
            for c in ("pld", "rdp")}
    assert ours["pld"].epsilon_central_total == pytest.approx(pld.get_epsilon(1e-5), rel=1e-3)
    assert ours["rdp"].epsilon_central_total == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-9)
    # alone, the central guarantee is the local one
    for c in ("pld", "rdp"):
        assert ours[c].epsilon_local_total == pytest.approx(ours[c].epsilon_central_total, rel=1e-9)
        assert ours[c].delta_central_total == 1e-5 and ours[c].composition_central == c


# The two readings are equal in exact arithmetic; computed, their noises differ in the last bits
# (0.8 sqrt(n) here, sqrt(n 0.8^2) there) and dp_accounting's PLD or the RDP order search can carry
# that to ~1e-11 relative (seen: 4.1347139447491195 vs 4.134713944818818 with a fresh install of
# numpy 2.4.6, scipy 1.17.1, dp-accounting 0.6.0): equal within 1e-9, far below any bound's slack.
SAME_READING = 1e-9


@pytest.mark.parametrize("composition", COMPOSITIONS)
def test_sum_domination_reads_n_parties_of_sigma_as_one_party_of_sigma_sqrt_n(composition):
    kw = dict(participation_prob=1.0, noise_var=0.0, sensitivity=1.0, alignment_gain=1.0, n0=0.0, delta_l=1e-6,
              local_steps=3, record_sampling=0.3, composition=composition)
    for n in (2, 7):
        many = steps_sumdom_round(users=n, step_noise=0.8, **kw)
        one = steps_round(users=1, step_noise=0.8 * math.sqrt(n), **kw)
        assert float(many.epsilon_central) == pytest.approx(float(one.epsilon_central), rel=SAME_READING)
        # the local guarantee is that of the user's own noise
        assert float(many.epsilon_local) == pytest.approx(float(steps_round(users=1, step_noise=0.8, **kw)
                                                               .epsilon_local), rel=SAME_READING)
    # totals over rounds too
    a = steps_totals(participation_prob=1.0, users=4, noise_var=0.0, sensitivity=1.0, delta_l=1e-6, rounds=5,
                     local_steps=3, record_sampling=0.3, step_noise=0.8, composition=composition, credit="sum")
    b = steps_totals(participation_prob=1.0, users=1, noise_var=0.0, sensitivity=1.0, delta_l=1e-6, rounds=5,
                     local_steps=3, record_sampling=0.3, step_noise=1.6, composition=composition)
    assert float(a["epsilon_central_total"]) == pytest.approx(float(b["epsilon_central_total"]), rel=SAME_READING)


def test_the_unknown_count_is_a_lower_quantile_whose_failure_is_charged():
    from scipy.stats import binom

    kw = dict(noise_var=0.0, sensitivity=1.0, alignment_gain=1.0, n0=0.0, delta_l=1e-5, step_noise=1.0)
    b = steps_round(participation_prob=0.5, users=200, delta_prime=1e-7, **kw)
    m = float(b.quantile)
    assert binom.cdf(m - 2, 199, 0.5) <= 1e-7 < binom.cdf(m - 1, 199, 0.5)  # P(others < m - 1) <= beta
    assert float(b.delta_central) == pytest.approx(1e-5 + 1e-7) and float(b.delta_prime) == 1e-7
    auto = steps_round(participation_prob=0.5, users=200, **kw)
    assert float(auto.delta_prime) == pytest.approx(1e-7)  # auto: beta = delta_l / 100
    # per-user p: the worst user is the most likely one, the count is that of the others
    p = torch.tensor([0.9] + [0.5] * 199, dtype=F64)
    per_user = steps_round(participation_prob=p, delta_prime=1e-7, **kw)
    assert float(per_user.quantile) == m
    # fewer expected participants, a smaller quantile, more leakage
    low = steps_round(participation_prob=0.1, users=200, delta_prime=1e-7, **kw)
    assert float(low.quantile) < m and float(low.epsilon_central) > float(b.epsilon_central)


def test_revealed_user_sampling_is_the_mixture_over_rounds():
    kw = dict(users=1, noise_var=0.0, sensitivity=1.0, alignment_gain=1.0, n0=0.0, delta_l=1e-5, step_noise=0.9)
    full = float(subsampled_gaussian_epsilon(rate=1.0, noise_multiplier=0.9, delta=1e-5 / 0.3))
    revealed = steps_round(participation_prob=0.3, **kw)
    assert float(revealed.epsilon_central) == pytest.approx(full, rel=1e-9)  # p H(eps) = delta
    # PLD composition of the revealed mixture over rounds: at most T times, at least once the round
    r = StepRound(0.3, 1.0, 0.9, 1)
    total = compose_epsilon([(r, 20)], delta=1e-5)
    assert float(revealed.epsilon_central) < total < 20 * float(revealed.epsilon_central)


def _mixture_rdp_two_steps(p, q, z, alpha, n=2001):
    """D_alpha of the revealed mixture by quadrature: with probability p two PoissonSampled(q,
    Gaussian(z)) steps (A with the record, B without), otherwise nothing (the same point mass
    under both), so exp((alpha - 1) D) = 1 - p + p exp((alpha - 1) D_alpha(A || B))."""
    x = np.linspace(-12 * z - alpha, 12 * z + alpha + 1, n)
    dx = x[1] - x[0]
    b1 = np.exp(-x ** 2 / (2 * z * z)) / (z * math.sqrt(2 * math.pi))
    a1 = (1 - q) * b1 + q * np.exp(-(x - 1) ** 2 / (2 * z * z)) / (z * math.sqrt(2 * math.pi))
    B, A = np.outer(b1, b1), np.outer(a1, a1)
    inner = np.log(np.sum(B * (A / B) ** alpha) * dx * dx)  # (alpha - 1) D_alpha(A || B)
    return float(np.logaddexp(math.log1p(-p), math.log(p) + inner) / (alpha - 1))


@pytest.mark.parametrize("p, q, z", [(0.3, 0.5, 1.0), (0.6, 0.2, 0.8), (0.1, 1.0, 1.5)])
def test_revealed_rdp_of_two_steps_matches_quadrature(p, q, z):
    orders = (2.0, 3.0, 5.0, 8.0)
    ours = round_rdp(StepRound(p, q, z, 2), orders)
    for alpha, value in zip(orders, ours):
        assert value == pytest.approx(_mixture_rdp_two_steps(p, q, z, alpha), rel=1e-6, abs=1e-10)


def test_account_steps_delta_target_and_undefined_rounds():
    f = facts(50, 0.5, 1.0, 2, 0.5, rounds=4)
    res = account_steps(f, delta_l=1e-5)
    charged = res.delta_central_total - 1e-5
    assert charged == pytest.approx(4 * 1e-7)
    target = account_steps(f, delta_l=1e-5, delta_target=2e-5)
    assert target.delta_central_total == pytest.approx(2e-5)
    assert target.epsilon_central_total < res.epsilon_central_total  # more delta, less epsilon
    short = account_steps(f, delta_l=1e-5, delta_target=1e-7)  # the tails alone reach it: +inf, delta kept
    assert short.epsilon_central_total == math.inf and short.delta_central_total == 1e-7
    assert "count tails" in short.total_reason
    silent = account_steps(facts(50, 0.5, 0.0, 2, 0.5), delta_l=1e-5)
    assert silent.epsilon_central_total == math.inf and not silent.defined and "no step noise" in silent.reason
    nobody = account_steps(facts(50, 0.0, 1.0, 2, 0.5), delta_l=1e-5)
    assert nobody.epsilon_central_total == 0.0 and nobody.epsilon_local_total == 0.0


@pytest.mark.parametrize("bad, match", [
    (dict(local_steps=0), "local_steps = 0"), (dict(record_sampling=0.0), "record_sampling = 0.0"),
    (dict(record_sampling=1.5), "record_sampling = 1.5"), (dict(step_noise=-1.0), "step_noise = -1.0"),
    (dict(composition="moments"), "composition = 'moments'"),
    (dict(step_noise=None, local_steps=3), "need step_noise"),
])
def test_bad_steps_input_raises(bad, match):
    kw = dict(participation_prob=0.5, users=10, noise_var=0.1, sensitivity=1.0, alignment_gain=1.0, n0=0.0,
              delta_l=1e-5, step_noise=1.0, local_steps=2, record_sampling=0.5)
    with pytest.raises(OtaflInputError, match=match):
        steps_round(**{**kw, **bad})


def bound_json(*args):
    res = CliRunner().invoke(cli, ["bound", "--accountant", "steps", "--p", "1", "--local-steps", "1",
                                   "--record-sampling", "0.1", "--step-noise", "0.69", "--sigma2", "0", "--n0", "0",
                                   "--delta-l", "1e-5", "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["rows"][0]


def test_bound_command_reproduces_the_seed_row_and_prints_the_tighter_values():
    assert round(bound_json("--users", "2", "--composition", "rdp-classic")["epsilon_central"], 2) == 2.78
    assert round(bound_json("--users", "1", "--composition", "rdp-classic")["epsilon_central"], 2) == 5.0
    rdp = bound_json("--users", "2", "--composition", "rdp")["epsilon_central"]
    pld = bound_json("--users", "2")["epsilon_central"]
    assert pld < rdp < 2.78
    row = bound_json("--users", "2", "--rounds", "3", "--composition", "rdp-classic")
    assert row["composition"] == "rdp-classic" and row["epsilon_central_total"] > row["epsilon_central"]


@pytest.mark.parametrize("args, message", [
    (["--local-steps", "0"], "local_steps = 0 is outside the allowed range [1, 100000] (integers)"),
    (["--record-sampling", "0"], "record_sampling = 0.0 is outside the allowed range (0, 1]"),
    (["--record-sampling", "1.2"], "record_sampling = 1.2 is outside the allowed range (0, 1]"),
    (["--step-noise", "-0.1"], "step_noise = -0.1 is outside the allowed range 0 or [0.001, 1e+30]"),
])
def test_bound_bad_steps_options_are_one_line_and_exit_2(args, message):
    res = CliRunner().invoke(cli, ["bound", "--accountant", "steps", "--step-noise", "1", *args])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [f"error: {message}"]


def test_a_steps_total_that_falls_back_to_rdp_is_labelled_rdp():
    """A FedAvg run whose PLD would be too large composes with RDP and used to say "(pld)" and
    steps_composition 'pld' beside its own note saying it fell back to RDP."""
    from otafl.privacy.analysis.pld import set_memory_budget, take_notes

    run = facts(1, 1.0, 1.1, 10, 0.2, rounds=3)
    take_notes()
    assert account_steps(run, delta_l=1e-5).composition_central == "pld" and take_notes() == []
    try:
        set_memory_budget(2**20)  # 1 MiB: no PLD fits
        fell = account_steps(run, delta_l=1e-5)
        notes = take_notes()
    finally:
        set_memory_budget(None)
    assert any("composed with rdp instead" in n for n in notes)
    assert fell.composition_central == fell.composition_local == "rdp"
    rdp = account_steps(run, delta_l=1e-5, composition="rdp")
    assert fell.epsilon_central_total == pytest.approx(rdp.epsilon_central_total, rel=1e-9)
    assert fell.summary_fields()["steps_composition"] == "rdp"
