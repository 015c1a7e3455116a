"""The sound ``steps`` accountant against the noise-cancelling counterexample and dp_accounting
(docs/privacy/steps.md#steps): only the noise that nothing carries on is credited to the target."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from otafl.privacy.accountants.steps import steps_round, steps_sumdom_round, steps_totals
from otafl.privacy.accountants.steps_run import account_steps
from otafl.privacy.facts import RoundFacts

F64 = torch.float64
COMMON = dict(participation_prob=1.0, noise_var=0.0, sensitivity=1.0, alignment_gain=1.0, n0=0.0, delta_l=1e-5)
# (users n, steps S, record rate q, step noise sigma, the true eps of the noise-cancelling pair)
COUNTEREXAMPLES = [(2, 2, 1.0, 1.0, 5.175), (10, 10, 1.0, 2.0, 5.135), (10, 10, 0.1, 0.904, 1.497),
                   (10, 50, 0.1, 1.0, 3.453)]


def noise_cancelling_epsilon(n: int, steps: int, q: float, sigma: float, delta: float) -> float:
    """True eps(delta) of the counterexample by numerical integration (independent of otafl).

    The co-users' steps each undo their previous step's noise, so only their last step's noise
    survives; the target's record (loss C y) adds C in each step it is sampled in: the release is
    C Bin(S, q) + N(0, (S + n - 1) sigma^2 C^2) against N(0, (S + n - 1) sigma^2 C^2) (C = 1).
    Both directions of the hockey-stick divergence on a fine grid (step < 1e-3 sd), bisection."""
    from scipy.optimize import brentq
    from scipy.stats import binom, norm

    sd = sigma * math.sqrt(steps + n - 1)
    k = np.arange(steps + 1)
    w = binom.pmf(k, steps, q)
    x = np.linspace(-12 * sd, steps + 12 * sd, 200001)
    dx = x[1] - x[0]
    absent = norm.pdf(x, 0.0, sd)
    present = (w[:, None] * norm.pdf(x[None, :], k[:, None], sd)).sum(0)

    def excess(eps):
        g = math.exp(eps)
        return max(np.clip(present - g * absent, 0, None).sum(), np.clip(absent - g * present, 0, None).sum()) * dx

    return brentq(lambda e: excess(e) - delta, 0.0, 60.0, xtol=1e-6)


@pytest.mark.parametrize("n,steps,q,sigma,truth", COUNTEREXAMPLES)
def test_steps_is_at_least_the_true_leakage_of_the_noise_cancelling_pair_and_sumdom_is_not(n, steps, q, sigma, truth):
    assert noise_cancelling_epsilon(n, steps, q, sigma, 1e-5) == pytest.approx(truth, abs=2e-3)
    kw = dict(COMMON, users=n, local_steps=steps, record_sampling=q, step_noise=sigma)
    sound = float(steps_round(**kw).epsilon_central)
    sumdom = float(steps_sumdom_round(**kw).epsilon_central)
    assert sound >= truth
    assert sumdom < truth / 1.15  # the source's sum-domination understates it (1.2x to 3.8x)
    assert float(steps_sumdom_round(**kw).classic_valid) == 0 and bool(steps_round(**kw).classic_valid)


@pytest.mark.parametrize("q", [1.0, 0.3])
def test_a_round_is_s_minus_1_own_steps_then_a_last_step_with_the_co_users_last_noise(q):
    """Reference: dp_accounting's PLD of (S - 1) PoissonSampled(q, Gaussian(sigma)) composed with one
    PoissonSampled(q, Gaussian(sigma sqrt(n)))."""
    import dp_accounting
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    n, S, sigma = 5, 4, 1.3
    acc = PLDAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), S - 1))
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma * math.sqrt(n))))
    got = float(steps_round(**COMMON, users=n, local_steps=S, record_sampling=q, step_noise=sigma).epsilon_central)
    assert got == pytest.approx(acc.get_epsilon(1e-5), rel=2e-3)
    # one step: the only step is the last, so both credits agree (FedSGD's reading is unchanged)
    one = dict(COMMON, users=n, local_steps=1, record_sampling=q, step_noise=sigma)
    assert float(steps_round(**one).epsilon_central) == float(steps_sumdom_round(**one).epsilon_central)


def test_no_co_user_credit_scaffold_is_the_users_own_steps_and_transmit_noise_only_lowers_it():
    kw = dict(COMMON, users=10, local_steps=5, record_sampling=0.5, step_noise=1.0)
    own = steps_round(**kw, co_user_noise=0.0)
    assert float(own.epsilon_central) == pytest.approx(float(own.epsilon_local), rel=1e-9)  # p = 1: same mechanism
    fedavg = float(steps_round(**kw).epsilon_central)
    half = float(steps_round(**kw, co_user_noise=0.5).epsilon_central)
    assert fedavg < half < float(own.epsilon_central)
    # artificial and channel noise credited in the last step: z_S^2 = sigma^2 + (m sigma_a^2 + N0 / c^2) x^2
    art = dict(kw, noise_var=0.01, n0=1.0, alignment_gain=2.0, co_user_noise=0.0)
    eps = [float(steps_round(**art, transmit_to_record=x).epsilon_central) for x in (0.0, 1.0, 10.0, 1e6)]
    assert eps[0] == pytest.approx(float(own.epsilon_central), rel=1e-9) and eps[0] > eps[1] > eps[2] > eps[3]
    four = float(steps_round(**dict(kw, local_steps=4), co_user_noise=0.0).epsilon_central)
    assert eps[3] == pytest.approx(four, rel=1e-3)  # a last step drowned in noise leaks (almost) nothing
    z = math.sqrt(1.0 + (10 * 0.01 + 1.0 / 4.0) * 9.0)  # x = 3: the last step's noise multiplier
    import dp_accounting
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    acc = PLDAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)), 4))
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(z)))
    assert float(steps_round(**art, transmit_to_record=3.0).epsilon_central) == pytest.approx(
        acc.get_epsilon(1e-5), rel=2e-3)


def test_run_totals_and_bound_totals_use_the_sound_credit():
    f = [RoundFacts(participation_prob=torch.ones(10, dtype=F64), noise_var=torch.zeros(10, dtype=F64),
                    alignment_gain=1.0, n0=0.0, sensitivity=2.0, dim=10, participants=10, local_steps=10,
                    record_sampling=1.0, step_noise=2.0, record_clip=1.0) for _ in range(3)]
    sound, sumdom = account_steps(f, delta_l=1e-5), account_steps(f, delta_l=1e-5, credit="sum")
    assert sound.name == "steps" and sumdom.name == "steps-sumdom"
    assert sound.classic_valid and not sumdom.classic_valid
    assert sound.epsilon_central_total > 2 * sumdom.epsilon_central_total
    bound = steps_totals(participation_prob=1.0, users=10, noise_var=0.0, sensitivity=1.0, delta_l=1e-5, rounds=3,
                         local_steps=10, record_sampling=1.0, step_noise=2.0)
    assert float(bound["epsilon_central_total"]) == pytest.approx(sound.epsilon_central_total, rel=1e-9)
