"""Concentration of |K_t|: exact quantiles against scipy and brute force; Hoeffding."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from otafl.privacy.analysis.concentration import (
    auto_delta_prime,
    binomial_lower_quantile,
    hoeffding_beta,
    hoeffding_lower_quantile,
    poisson_binomial_lower_quantile,
)


def scipy_quantile(users: int, p: float, delta_prime: float) -> int:
    """Largest m with P(N < m) <= delta' for N ~ Binomial(K, p): #{j : cdf(j) <= delta'}."""
    return int(np.sum(stats.binom.cdf(np.arange(users + 1), users, p) <= delta_prime))


def brute_force_quantile(p: list[float], delta_prime: float) -> int:
    """Same quantile for unequal p by enumerating all 2^K participation patterns."""
    pmf = np.zeros(len(p) + 1)
    for coins in itertools.product((0, 1), repeat=len(p)):
        pmf[sum(coins)] += math.prod(pk if c else 1 - pk for pk, c in zip(p, coins))
    return int(np.sum(np.cumsum(pmf) <= delta_prime))


def test_binomial_quantile_matches_scipy_on_random_inputs():
    rng = np.random.default_rng(0)  # seed 0, 600 random (K, p, delta') triples; exact equality
    K = rng.integers(1, 5000, 600)
    p = rng.uniform(0, 1, 600)
    dp = np.exp(rng.uniform(math.log(1e-12), math.log(0.99), 600))
    ours = binomial_lower_quantile(users=torch.tensor(K), p=torch.tensor(p), delta_prime=torch.tensor(dp))
    ref = [scipy_quantile(k, pk, d) for k, pk, d in zip(K, p, dp)]
    assert ours.tolist() == ref


def test_binomial_quantile_for_a_million_users_matches_scipy():
    users = 10**6
    p = torch.tensor([0.001, 0.3, 0.5, 0.97], dtype=torch.float64)
    ours = binomial_lower_quantile(users=users, p=p, delta_prime=1e-5)
    ref = [int(stats.binom.ppf(1e-5, users, pk)) for pk in p.tolist()]
    # ppf = smallest j with cdf(j) >= delta'; our m counts j with cdf(j) <= delta' (no ties here).
    assert ours.tolist() == ref


def test_binomial_quantile_edge_probabilities():
    m = binomial_lower_quantile(users=10, p=torch.tensor([0.0, 1.0]), delta_prime=0.1)
    assert m.tolist() == [0.0, 10.0]


def test_binomial_quantile_with_a_large_delta_prime_sums_a_bounded_window():
    """delta' >= 1/2 once summed every count up to K (8 GB at K = 1e9, issue 32); now a
    Hoeffding window above K p, exact against scipy, and m = K for delta' >= 1."""
    rng = np.random.default_rng(1)  # seed 1, 200 triples with delta' in [0.5, 1); exact equality
    K = rng.integers(1, 5000, 200)
    p = rng.uniform(0, 1, 200)
    dp = rng.uniform(0.5, 1.0, 200)
    ours = binomial_lower_quantile(users=torch.tensor(K), p=torch.tensor(p), delta_prime=torch.tensor(dp))
    assert ours.tolist() == [scipy_quantile(k, pk, d) for k, pk, d in zip(K, p, dp)]
    big = binomial_lower_quantile(users=10**9, p=torch.tensor([1e-9, 1e-9, 0.5]),
                                  delta_prime=torch.tensor([1.0, 0.9, 0.9]))
    assert big[0] == 10**9
    assert big[1] == np.sum(stats.binom.cdf(np.arange(50), 10**9, 1e-9) <= 0.9)  # mean 1: all below 50
    assert big[2] == int(stats.binom.ppf(0.9, 10**9, 0.5))


def test_binomial_quantile_broadcasts_and_keeps_shape():
    m = binomial_lower_quantile(users=torch.tensor([[50], [200]]), p=torch.tensor([0.2, 0.5, 0.8]),
                                delta_prime=1e-5)
    assert m.shape == (2, 3) and m.dtype == torch.float64
    assert m[1, 2] == scipy_quantile(200, 0.8, 1e-5)


def test_poisson_binomial_quantile_matches_brute_force_for_unequal_p():
    rng = np.random.default_rng(1)  # seed 1, 40 random instances with K <= 10
    for _ in range(40):
        k = int(rng.integers(1, 11))
        p = rng.uniform(0, 1, k).tolist()
        dp = float(np.exp(rng.uniform(math.log(1e-4), math.log(0.6))))
        ours = poisson_binomial_lower_quantile(p=torch.tensor(p, dtype=torch.float64), delta_prime=dp)
        assert int(ours) == brute_force_quantile(p, dp)


def test_poisson_binomial_batched_rows_mix_uniform_and_unequal():
    p = torch.tensor([[0.3] * 6, [0.1, 0.9, 0.5, 0.5, 0.2, 0.7]], dtype=torch.float64)
    m = poisson_binomial_lower_quantile(p=p, delta_prime=torch.tensor([0.05, 0.05]))
    assert m.tolist() == [scipy_quantile(6, 0.3, 0.05), brute_force_quantile(p[1].tolist(), 0.05)]


def test_hoeffding_pieces_closed_form():
    assert float(hoeffding_beta(delta_prime=1e-5, users=200)) == math.sqrt(math.log(2e5) / 400)
    mu = torch.tensor([20.0, 100.0], dtype=torch.float64)
    dp = auto_delta_prime(mean_participants=mu, users=200)
    assert torch.allclose(dp, 2 * torch.exp(-2 * mu**2 / 200) + 1e-5, rtol=1e-15, atol=0)
    # The auto delta' always makes the Hoeffding quantile positive.
    assert (hoeffding_lower_quantile(mean_participants=mu, users=200, delta_prime=dp) > 0).all()


@settings(max_examples=80, deadline=None)
@given(users=st.integers(1, 3000), p=st.floats(0.001, 0.999), log_dp=st.floats(-25.0, -0.1))
def test_hoeffding_quantile_is_valid_and_below_the_exact_quantile(users, p, log_dp):
    dp = math.exp(log_dp)
    m_h = float(hoeffding_lower_quantile(mean_participants=users * p, users=users, delta_prime=dp))
    m_exact = float(binomial_lower_quantile(users=users, p=p, delta_prime=dp))
    if m_h > 0:
        # Hoeffding's event {N < m_h} really has probability <= delta' ...
        assert stats.binom.cdf(math.ceil(m_h) - 1, users, p) <= dp
        # ... so the exact quantile (the largest such m) is at least as large.
        assert m_exact >= m_h
    # The exact quantile is the largest: one more would break delta'.
    assert stats.binom.cdf(m_exact - 1, users, p) <= dp * (1 + 1e-9)
    if m_exact < users:
        assert stats.binom.cdf(m_exact, users, p) > dp * (1 - 1e-9)
