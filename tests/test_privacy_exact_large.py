"""``exact`` far from privacy: epsilons above ln(max double) = 709.78 and noiseless users.

References are independent of the package's torch code: the analytic Gaussian mechanism
(Balle & Wang 2018) in log space with scipy, and a log-domain numerical integral of the
one-dimensional mixture pair.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import log_ndtr, logsumexp

from otafl.api.bound import bound_grid
from otafl.privacy.accountants import tight_round
from otafl.privacy.accountants.exact import exact_round


def log_gauss_delta(eps, mu):
    """log delta(eps) of N(mu, 1) vs N(0, 1) (Balle & Wang 2018, Thm 8), in log space."""
    a, b = log_ndtr(mu / 2 - eps / mu), eps + log_ndtr(-mu / 2 - eps / mu)
    return a + math.log(-math.expm1(min(b - a, -1e-300)))


def gauss_epsilon(delta, mu):
    return brentq(lambda e: log_gauss_delta(e, mu) - math.log(delta), 0.0, mu * mu / 2 + 20 * mu + 20,
                  xtol=1e-12, rtol=1e-14)


@pytest.mark.parametrize("channel_var", [2e-3, 2.5e-5])
def test_exact_epsilon_above_709_is_computed_not_capped_at_the_largest_exponent(channel_var):
    # One user, p = 1, no artificial noise: a Gaussian mechanism with std sqrt(N0) / c and
    # sensitivity 2; epsilons about 2e3 and 1.6e5, both beyond exp's range.
    r = exact_round(participation_prob=1.0, users=1, noise_var=0.0, alignment_gain=1.0, n0=channel_var,
                    sensitivity=2.0, delta_l=1e-5, dim=100)
    ref = gauss_epsilon(1e-5, 2.0 / math.sqrt(channel_var))
    assert ref > 709.8
    for eps in (float(r.epsilon_central), float(r.epsilon_local)):
        assert ref * (1 - 1e-9) <= eps <= ref * (1 + 1e-6)


def test_exact_hidden_participation_beyond_709_matches_a_log_domain_integral():
    # Local DP, p = 1/2, no artificial noise: the pair (1/2) N(0, w) + (1/2) N(+-a, w). Equal
    # variances hide participation, so the leakage is about a quarter of the Gaussian's.
    p, a, w = 0.5, 1.0, 1.0 / 1500
    r = exact_round(participation_prob=p, users=1, noise_var=0.0, alignment_gain=1.0, n0=w,
                    sensitivity=2 * a, delta_l=1e-5, dim=100)
    u = np.linspace(-2.0, 40.0, 2_000_001)
    du = u[1] - u[0]
    lphi = lambda m: -(u - m) ** 2 / (2 * w) - 0.5 * math.log(2 * math.pi * w)  # noqa: E731
    log_p = np.logaddexp(math.log(1 - p) + lphi(0.0), math.log(p) + lphi(a))
    log_q = np.logaddexp(math.log(1 - p) + lphi(0.0), math.log(p) + lphi(-a))

    def log_delta(eps):
        gap = eps + log_q - log_p
        keep = gap < 0
        return logsumexp(log_p[keep] + np.log(-np.expm1(gap[keep]))) + math.log(du)

    ref = brentq(lambda e: log_delta(e) - math.log(p * 1e-5), 1.0, 5e3, xtol=1e-9)
    gauss = gauss_epsilon(p * 1e-5, 2 * a / math.sqrt(w))
    assert 709.8 < ref < 0.5 * gauss
    assert ref * (1 - 1e-4) <= float(r.epsilon_local) <= ref * 1.01


def test_exact_at_no_artificial_noise_is_at_least_the_gaussian_of_the_channel_when_participation_is_certain():
    # sigma2 = 0, p = 1, many users: the channel noise alone is the mechanism (equal to tight).
    kw = dict(participation_prob=1.0, users=200, noise_var=0.0, alignment_gain=1.0, n0=1e-4, sensitivity=2.0,
              delta_l=1e-5)
    e = exact_round(dim=7850, **kw)
    tt = tight_round(delta_prime=1e-6, **kw)
    ref = gauss_epsilon(1e-5, 2.0 / math.sqrt(1e-4))
    assert float(e.epsilon_central) >= 0.9 * float(tt.epsilon_central)
    assert ref * (1 - 1e-9) <= float(e.epsilon_central) <= ref * (1 + 1e-6)


def test_one_user_without_artificial_noise_totals_cover_the_composed_gaussian_and_exact_is_not_looser():
    # One user always present, sigma2 = 0: each round is N(g, N0 / c^2) with sensitivity 2L,
    # and T rounds compose to a Gaussian with mu = sqrt(T) 2L c / sqrt(N0) (closed form).
    r = bound_grid(users=[1], p=[1.0], sigma2=[0.0], clip=[1.0], snr_db=[-45.0], accountants=["exact", "tight"],
                   delta_l=1e-5, delta_prime=1e-6, n0=1.0, rounds=100, delta_target=1e-3)
    ex, ti = r["rows"]
    mu = math.sqrt(100) * 2.0 / math.sqrt(ex["channel_noise_var"])
    ref = gauss_epsilon(1e-3, mu)
    assert ex["delta_central_total"] == ti["delta_central_total"] == pytest.approx(1e-3)
    assert ref * (1 - 1e-9) <= ex["epsilon_central_total"] <= ref * 1.005
    assert ref * (1 - 1e-9) <= ti["epsilon_central_total"]
    assert ex["epsilon_central_total"] <= ti["epsilon_central_total"]
