"""PLD composition of paper's and tight's Gaussian views: against dp_accounting and closed forms."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binom, norm

from otafl.privacy import RoundFacts, account_run
from otafl.privacy.analysis.pld_gaussian import gaussian_rounds_epsilon

F64 = torch.float64


@pytest.mark.parametrize("q,z,T,delta", [(0.5, 1.0, 100, 1e-3), (0.1, 0.8, 300, 1e-5), (1.0, 2.0, 50, 1e-5),
                                         (0.9, 0.6, 20, 1e-4)])
def test_sampled_rounds_match_dp_accountings_replace_one_poisson_sampled_gaussian(q, z, T, delta):
    # Our pair (1 - q) N(0, z^2) + q N(+-1/2, z^2) is dp_accounting's REPLACE_ONE Poisson-sampled
    # Gaussian with sensitivity 1 and noise multiplier 2z; both are pessimistic discretisations,
    # dp_accounting's 300x finer.
    import dp_accounting
    from dp_accounting import dp_event
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    ours = gaussian_rounds_epsilon(rate=torch.full((T,), q), noise_multiplier=torch.full((T,), z),
                                   delta_target=delta, resolution=0.0)
    acc = PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
                        value_discretization_interval=1e-4)
    gauss = dp_event.GaussianDpEvent(2 * z)
    acc.compose(dp_event.PoissonSampledDpEvent(q, gauss) if q < 1 else gauss, T)
    ref = acc.get_epsilon(delta)
    assert ref * (1 - 1e-3) <= ours <= ref * 1.01


def test_revealed_rounds_are_above_their_closed_form_composition_and_within_one_percent():
    # (1 - p) bot + p N(+-1/2, z^2), T times: k ~ Binomial(T, p) Gaussian rounds took place,
    # and k Gaussian rounds are one Gaussian with sensitivity sqrt(k), so
    # delta(eps) = sum_k P(k) H_G(eps; sqrt(k), z) exactly.
    p, z, T, delta = 0.3, 1.5, 40, 1e-5

    def gauss(eps, sens):
        return norm.cdf(sens / (2 * z) - eps * z / sens) - math.exp(eps) * norm.cdf(-sens / (2 * z) - eps * z / sens)

    def total(eps):
        return sum(binom.pmf(k, T, p) * gauss(eps, math.sqrt(k)) for k in range(1, T + 1))

    ref = brentq(lambda e: total(e) - delta, 0.0, 50.0, xtol=1e-12)
    ours = gaussian_rounds_epsilon(rate=torch.full((T,), p), noise_multiplier=torch.full((T,), z),
                                   delta_target=delta, revealed=True, resolution=0.0)
    assert ref <= ours <= 1.01 * ref
    # The grid only rounds the rate up and the noise down: never below, by at most ~1 %.
    rounded = gaussian_rounds_epsilon(rate=torch.full((T,), p), noise_multiplier=torch.full((T,), z),
                                      delta_target=delta, revealed=True)
    assert ours * (1 - 1e-9) <= rounded <= 1.02 * ours


def test_edge_cases_no_leak_no_noise_and_targets_outside_the_range():
    assert gaussian_rounds_epsilon(rate=torch.zeros(3), noise_multiplier=torch.ones(3), delta_target=1e-5) == 0.0
    assert gaussian_rounds_epsilon(rate=torch.full((3,), 0.5), noise_multiplier=torch.zeros(3),
                                   delta_target=1e-5) == math.inf
    assert gaussian_rounds_epsilon(rate=torch.full((3,), 0.5), noise_multiplier=torch.ones(3),
                                   delta_target=1.0) == math.inf
    # Almost no noise: the grid would pass e^500; the PLD is not built (+inf, other compositions win).
    assert gaussian_rounds_epsilon(rate=torch.full((3,), 0.5), noise_multiplier=torch.full((3,), 1e-4),
                                   delta_target=1e-5) == math.inf


def test_tight_totals_take_pld_where_it_beats_rdp_and_state_it():
    facts = [RoundFacts(participation_prob=torch.full((200,), 0.5, dtype=F64), noise_var=torch.full((200,), 0.1, dtype=F64),
                        alignment_gain=c, n0=1.0, sensitivity=2.0, dim=7850, participants=100)
             for c in (0.8, 1.0, 1.3, 0.9) * 10]
    result = account_run(facts, accountants=["tight", "paper"], delta_l=1e-5)
    tight, paper = result["tight"], result["paper"]
    assert tight.composition_central == "pld" and tight.composition_local == "pld"
    assert paper.composition_central == "pld" and paper.composition_local != "pld"  # paper's LDP amplification is not composed by PLD
    # The PLD at the same total delta is below the per-round epsilons' RDP composition (that the
    # summary would otherwise report) and never below the worst round.
    assert tight.epsilon_central <= tight.epsilon_central_total < 40 * tight.epsilon_central
    assert tight.delta_central_total == pytest.approx(40 * tight.delta_central + 1e-5, rel=1e-9)  # the default target


@pytest.mark.parametrize("top_loss", [700.0, 720.0, 730.0, 735.0])
def test_epsilon_lookup_stays_finite_where_dp_accountings_scan_overflows(top_loss):
    """A pmf with mass 2e-3 at a loss of 700-735 and the rest at 0: at delta 1e-3 the answer is
    top_loss - ln 2. dp_accounting's scan returns +inf from 720 on (its sum of p exp(-loss)
    underflows to a subnormal and the ratio overflows); epsilon_for_delta finds the value,
    from above (within 1e-9)."""
    import numpy as np
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution

    from otafl.privacy.analysis.pld import epsilon_for_delta

    n = int(top_loss / 0.5)
    probs = np.zeros(n + 1)
    probs[0], probs[n] = 1 - 2e-3, 2e-3
    pld = privacy_loss_distribution.PrivacyLossDistribution(pld_pmf.DensePLDPmf(0.5, 0, probs, 0.0, True))
    expected = top_loss - math.log(2.0)
    eps = epsilon_for_delta(pld, 1e-3)
    assert expected <= eps <= expected + 1e-9 * expected
    if top_loss >= 720.0:  # the case this guards: dp_accounting alone says +inf
        with np.errstate(all="ignore"):
            assert math.isinf(pld.get_epsilon_for_delta(1e-3))
