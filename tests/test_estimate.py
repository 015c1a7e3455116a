"""Server estimators: unbiasedness checked by Monte Carlo, not assumed.

Fixed gradients G [K, d]; each Monte-Carlo round draws the coins and the Gaussian noise of
the aligned sum a = sum_{K_t} g_k + N(0, (sum_{K_t} sigma_k^2 + N0/c^2) I_d), the law that
test_mac_transmit.py checks for the real transmit/superpose pipeline (and one test below
runs that pipeline end to end). A mean "matches" a target when every coordinate is within
5 standard errors (sample s.d. / sqrt(rounds)); it "misses" when some coordinate is more
than 10 standard errors off. Seeds are fixed.
"""

import math

import pytest
import torch

from otafl.channel import make_fading, superpose
from otafl.errors import OtaflInputError
from otafl.estimate import (
    ESTIMATORS,
    estimate_known,
    estimate_unknown,
)
from otafl.sampling import ChannelAwareSampling, draw_participants
from otafl.transmit import alignment_gain, clip_factors, max_power, power_scale, transmit_signals

F64 = torch.float64
K, D = 10, 4
VAR = torch.linspace(0.0, 0.05, K, dtype=F64)
N0_OVER_C2 = 0.02


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gradients(seed: int = 0) -> torch.Tensor:
    """Users 0..K-1 point further along +e_0 the larger k is, so p-weighting shows."""
    g = 0.3 * torch.randn(K, D, generator=gen(seed), dtype=F64)
    g[:, 0] += torch.linspace(-1.0, 1.0, K, dtype=F64)
    return g * clip_factors(torch.linalg.vector_norm(g, dim=-1), 1.5)[..., None]


def aligned_sums(p: torch.Tensor, G: torch.Tensor, rounds: int, seed: int):
    """[rounds, d] samples of y/c and the [rounds, K] participation masks."""
    g = gen(seed)
    active = draw_participants(p.expand(rounds, -1), g)
    a = active.to(F64)
    noise_sd = torch.sqrt(a @ VAR + N0_OVER_C2)[:, None]
    return a @ G + noise_sd * torch.randn(rounds, D, generator=g, dtype=F64), active


def matches(samples: torch.Tensor, target: torch.Tensor) -> bool:
    se = samples.std(0) / math.sqrt(samples.shape[0])
    return bool(((samples.mean(0) - target).abs() <= 5 * se).all())


def misses(samples: torch.Tensor, target: torch.Tensor) -> bool:
    se = samples.std(0) / math.sqrt(samples.shape[0])
    return bool(((samples.mean(0) - target).abs() > 10 * se).any())


def known_estimates(aligned, active):
    out = [estimate_known(aligned[i], int(active[i].sum())) for i in range(aligned.shape[0])]
    return torch.stack([e for e in out if e is not None]), sum(e is None for e in out)


def test_known_estimator_is_unbiased_given_someone_participates_under_uniform_sampling():
    # p = 0.15, K = 10: P(|K_t| = 0) = 0.85^10 = 0.20, so conditioning matters. 12000 rounds.
    G = gradients()
    target = G.mean(0)
    aligned, active = aligned_sums(torch.full((K,), 0.15, dtype=F64), G, 12000, seed=1)
    est, skipped = known_estimates(aligned, active)
    assert skipped == int((active.sum(1) == 0).sum()) > 0
    assert matches(est, target)
    # negative control: counting the skipped rounds as a zero update is biased (by 0.85^10)
    zero_filled = torch.cat([est, torch.zeros(skipped, D, dtype=F64)])
    assert misses(zero_filled, target)


def test_known_estimator_is_biased_under_non_uniform_sampling():
    G = gradients()
    p = torch.linspace(0.05, 0.95, K, dtype=F64)
    aligned, active = aligned_sums(p, G, 5000, seed=2)
    est, _ = known_estimates(aligned, active)
    assert misses(est, G.mean(0))


def test_unknown_estimator_is_unbiased_for_the_mean_under_uniform_sampling():
    G = gradients()
    p = torch.full((K,), 0.3, dtype=F64)
    aligned, _ = aligned_sums(p, G, 30000, seed=3)
    est = estimate_unknown(aligned, float(p.sum()))  # broadcasts over the leading axis
    assert matches(est, G.mean(0))


def test_unknown_estimator_is_unbiased_for_the_p_weighted_mean_under_non_uniform_sampling():
    G = gradients()
    p = torch.linspace(0.05, 0.95, K, dtype=F64)
    mu = float(p.sum())
    aligned, _ = aligned_sums(p, G, 30000, seed=4)
    est = estimate_unknown(aligned, mu)
    assert matches(est, (p[:, None] * G).sum(0) / mu)
    assert misses(est, G.mean(0))  # ... and not for the plain mean: users are weighted by p_k


def test_unknown_estimator_through_the_real_channel_with_channel_aware_sampling():
    # End to end: AR-Rician channel, channel-aware p = min(1, h / 1.2), power control with
    # the `min` policy, artificial noise, MAC noise N0 = 1; 1500 rounds, seed 5.
    # E[g_hat_t | h_t] = sum_k p_{k,t} g_k / mu_t, so the per-round error
    # g_hat_t - sum_k p_{k,t} g_k / mu_t has mean zero.
    T, d, L = 1500, D, 1.5
    g = gen(5)
    G = gradients()
    H = make_fading("ar-rician", rician_k=5.0, rho=0.1).sample(T, torch.ones(K), g)
    P_all = ChannelAwareSampling(h_th=1.2).probabilities(H)
    power = max_power(torch.full((K,), 20.0, dtype=F64), d, 1.0)
    errors = []
    for t in range(T):
        c, _ = alignment_gain(H[t], power, L, VAR, d)
        active = draw_participants(P_all[t], g)
        y = superpose(transmit_signals(G, power_scale(H[t], c), VAR, g), H[t], active, 1.0, g)
        mu = float(P_all[t].sum())
        errors.append(estimate_unknown(y / c, mu) - (P_all[t][:, None] * G).sum(0) / mu)
    assert matches(torch.stack(errors), torch.zeros(d, dtype=F64))


def test_known_estimator_divides_by_the_count_and_skips_empty_rounds():
    a = torch.tensor([3.0, -6.0], dtype=F64)
    assert torch.equal(estimate_known(a, 3), torch.tensor([1.0, -2.0], dtype=F64))
    assert estimate_known(a, 0) is None
    with pytest.raises(OtaflInputError, match="-1"):
        estimate_known(a, -1)


def test_unknown_estimator_divides_by_mu_skips_mu_zero_and_rejects_negative_mu():
    a = torch.tensor([3.0, -6.0], dtype=F64)
    assert torch.equal(estimate_unknown(a, 1.5), torch.tensor([2.0, -4.0], dtype=F64))
    assert estimate_unknown(a, 0.0) is None
    with pytest.raises(OtaflInputError, match="mu_t = -1.0"):
        estimate_unknown(a, -1.0)


def test_every_registered_estimator_takes_both_statistics_and_uses_its_own():
    a = torch.tensor([4.0], dtype=F64)
    uses = {"known": 2.0, "unknown": 0.5}  # |K_t| = 2, mu_t = 8
    assert set(uses) == set(ESTIMATORS)
    for name, fn in ESTIMATORS.items():
        assert float(fn(a, participants=2, mu=8.0)) == uses[name]
        assert fn(a, participants=0, mu=0.0) is None  # nobody joined / nobody could join
