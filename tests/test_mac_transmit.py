"""Transmitter and MAC: clipping, power budget, alignment, and the aligned sum at the server."""

import math

import pytest
import torch

from otafl.channel import make_fading, superpose
from otafl.errors import OtaflInputError
from otafl.sampling import draw_participants
from otafl.transmit import (
    ALIGNMENT_POLICIES,
    alignment_bound,
    alignment_gain,
    assign_groups,
    clip_factors,
    effective_noise_var,
    max_power,
    power_scale,
    resolve_noise_var,
    resolve_per_user,
    transmit_power,
    transmit_signals,
)

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- power budget from the SNR
def test_max_power_is_snr_times_dim_times_n0():
    P = max_power(torch.tensor([0.0, 10.0, 30.0]), 100, 0.5)
    assert P.dtype == F64
    assert torch.allclose(P, torch.tensor([50.0, 500.0, 50000.0], dtype=F64), rtol=1e-14)


def test_max_power_uses_unit_reference_noise_when_channel_is_noiseless():
    assert torch.allclose(max_power(torch.tensor([10.0]), 7, 0.0), torch.tensor([70.0], dtype=F64))


@pytest.mark.parametrize("kwargs,needle", [(dict(dim=0, n0=1.0), "0"), (dict(dim=5, n0=-1.0), "-1.0")])
def test_max_power_rejects_bad_dim_and_noise(kwargs, needle):
    with pytest.raises(OtaflInputError, match=needle):
        max_power(torch.tensor([1.0]), **kwargs)


def clip_gradients(grads, clip):
    """Each row clipped to norm <= L through :func:`clip_factors`, and the norms before."""
    norms = torch.linalg.vector_norm(grads, dim=-1)
    return grads * clip_factors(norms, clip)[..., None], norms


# ---------------------------------------------------------------- clipping
def test_clipping_bounds_norms_keeps_small_gradients_and_directions():
    g = torch.randn(50, 30, generator=gen(0), dtype=F64) * torch.logspace(-2, 1, 50, dtype=F64)[:, None]
    L = 1.0
    clipped, norms = clip_gradients(g, L)
    assert torch.allclose(norms, g.norm(dim=1), rtol=1e-14)
    new = clipped.norm(dim=1)
    assert bool((new <= L * (1 + 1e-14)).all())
    small = norms <= L
    assert small.any() and (~small).any()
    assert torch.equal(clipped[small], g[small])
    assert torch.allclose(new[~small], torch.ones(int((~small).sum()), dtype=F64), rtol=1e-14)
    cos = (clipped * g).sum(1) / (new * norms)
    assert torch.allclose(cos, torch.ones(50, dtype=F64), rtol=1e-12)


def test_clip_factors_are_one_for_zero_norm_and_l_over_norm_above():
    f = clip_factors(torch.tensor([0.0, 0.5, 1.0, 4.0], dtype=F64), 1.0)
    assert torch.equal(f, torch.tensor([1.0, 1.0, 1.0, 0.25], dtype=F64))
    with pytest.raises(OtaflInputError, match="0.0"):
        clip_factors(torch.ones(2), 0.0)


# ---------------------------------------------------------------- alignment gain
def _setup(K=12, d=10, seed=1):
    g = gen(seed)
    h = make_fading("ar-rician", rician_k=5.0, rho=0.0).sample(1, torch.ones(K), g)[0]
    P = max_power(torch.linspace(2.0, 30.0, K, dtype=F64), d, 1.0)
    var = torch.linspace(0.0, 0.2, K, dtype=F64)
    return h, P, var


def test_min_policy_takes_min_over_all_users_of_the_alignment_bound():
    h, P, var = _setup()
    c, eligible = alignment_gain(h, P, 1.0, var, 10)
    bound = h * torch.sqrt(P / (1.0 + 10 * var))
    assert c.dtype == F64 and c.shape == ()
    assert bool(eligible.all())
    assert float(c) == float(bound.min())
    assert torch.equal(alignment_bound(h, P, 1.0, var, 10), bound)


def test_truncate_policy_silences_weak_users_and_takes_min_over_the_rest():
    h, P, var = _setup()
    th = float(h.median())
    c, eligible = alignment_gain(h, P, 1.0, var, 10, policy="truncate", threshold=th)
    assert torch.equal(eligible, h >= th)
    bound = alignment_bound(h, P, 1.0, var, 10)
    assert float(c) == float(bound[eligible].min())


def test_truncate_policy_with_nobody_above_threshold_gives_zero_gain():
    h, P, var = _setup()
    c, eligible = alignment_gain(h, P, 1.0, var, 10, policy="truncate", threshold=float(h.max()) + 1)
    assert float(c) == 0.0 and not bool(eligible.any())
    assert bool((power_scale(h, c) == 0).all())


def test_alignment_policy_errors_name_the_value():
    h, P, var = _setup()
    with pytest.raises(OtaflInputError, match="'best'"):
        alignment_gain(h, P, 1.0, var, 10, policy="best")
    for policy in ALIGNMENT_POLICIES:  # every policy aligns no eligible user beyond its power budget
        c, eligible = alignment_gain(h, P, 1.0, var, 10, policy=policy, threshold=float(h.median()))
        assert bool((float(c) <= alignment_bound(h, P, 1.0, var, 10)[eligible] * (1 + 1e-12)).all())
    with pytest.raises(OtaflInputError, match="threshold"):
        alignment_gain(h, P, 1.0, var, 10, policy="truncate")
    with pytest.raises(OtaflInputError, match="-1.0"):
        alignment_gain(h, P, 1.0, var, 10, policy="truncate", threshold=-1.0)


def test_power_scale_is_c_over_h_and_zero_for_a_dead_channel():
    a = power_scale(torch.tensor([0.5, 2.0, 0.0], dtype=F64), torch.tensor(1.0, dtype=F64))
    assert torch.equal(a, torch.tensor([2.0, 0.5, 0.0], dtype=F64))


# ---------------------------------------------------------------- power constraint
@pytest.mark.parametrize("policy,threshold,n0", [("min", None, 1.0), ("truncate", 0.6, 1.0),
                                                 ("min", None, 0.0), ("truncate", 1.2, 0.1)])
def test_every_transmission_respects_the_power_budget(policy, threshold, n0):
    # 300 rounds x 60 users, random AR-Rician channels (G = 5, rho = 0.1, large-scale gains
    # 0.3..3), three SNR groups, per-group artificial noise, gradient norms from 0.01 L to
    # 100 L. Allowed slack: relative 1e-12 (float64 rounding of clip and c_t / h only).
    K, d, T, L = 60, 20, 300, 1.0
    g = gen(11)
    groups = assign_groups(K, [20, 20, 20], 3)
    P = max_power(torch.tensor([2.0, 10.0, 30.0], dtype=F64)[groups], d, n0)
    var = resolve_noise_var([0.1, 0.01, 0.0], groups, K)
    gain = torch.linspace(0.3, 3.0, K, dtype=F64)
    H = make_fading("ar-rician", rician_k=5.0, rho=0.1).sample(T, gain, g)
    worst, tightest = 0.0, 0.0
    for t in range(T):
        raw = torch.randn(K, d, generator=g, dtype=F64)
        raw = raw / raw.norm(dim=1, keepdim=True) * torch.exp(torch.empty(K, dtype=F64).uniform_(
            math.log(0.01), math.log(100.0), generator=g))[:, None]
        clipped, _ = clip_gradients(raw, L)
        c, eligible = alignment_gain(H[t], P, L, var, d, policy=policy, threshold=threshold)
        alpha = power_scale(H[t], c)
        active = draw_participants(torch.full((K,), 0.5, dtype=F64), g) & eligible
        energy = transmit_power(clipped.norm(dim=1), alpha, var, d)
        ratio = energy[active] / P[active]
        if ratio.numel():
            worst = max(worst, float(ratio.max()))
        # with ||g|| replaced by L the weakest eligible user uses its full budget
        if bool(eligible.any()):
            full = transmit_power(torch.full((K,), L, dtype=F64), alpha, var, d)[eligible] / P[eligible]
            tightest = max(tightest, float(full.max()))
            assert float(full.max()) == pytest.approx(1.0, rel=1e-12)
    assert worst <= 1.0 + 1e-12
    assert 0.5 < worst  # the check is not vacuous: some users come close to their budget
    assert tightest == pytest.approx(1.0, rel=1e-12)


def test_empirical_signal_energy_averages_to_at_most_the_budget():
    # Gradients of norm exactly L (the worst case). Seed 12, N = 4000 independent draws of the
    # artificial noise per user; ||x||^2 has variance alpha^4 (4 sigma^2 ||g||^2 + 2 d sigma^4),
    # tolerance 5 standard errors of the mean above P_k (and around the predicted energy).
    K, d, L, N = 6, 16, 1.0, 4000
    h, P, var = _setup(K=K, d=d, seed=12)
    var = torch.tensor([0.0, 0.05, 0.1, 0.5, 1.0, 2.0], dtype=F64)
    c, _ = alignment_gain(h, P, L, var, d)
    alpha = power_scale(h, c)
    grads = torch.randn(K, d, generator=gen(13), dtype=F64)
    grads = grads / grads.norm(dim=1, keepdim=True) * L
    x = transmit_signals(grads.repeat(N, 1), alpha.repeat(N), var.repeat(N), gen(14))
    energy = (x ** 2).sum(1).reshape(N, K)
    mean = energy.mean(0)
    se = alpha ** 2 * torch.sqrt(4 * var * L ** 2 + 2 * d * var ** 2) / math.sqrt(N)
    assert bool((mean <= P + 5 * se + 1e-12 * P).all())
    assert bool(((mean - transmit_power(torch.full((K,), L, dtype=F64), alpha, var, d)).abs()
                 <= 5 * se + 1e-12 * P).all())


# ---------------------------------------------------------------- alignment at the receiver
@pytest.mark.parametrize("n0", [0.0, 0.7])
def test_aligned_sum_is_gradients_plus_noises_plus_scaled_channel_noise(n0):
    K, d, L = 8, 16, 1.0
    h, P, _ = _setup(K=K, d=d, seed=21)
    var = torch.linspace(0.01, 0.3, K, dtype=F64)
    grads, _ = clip_gradients(torch.randn(K, d, generator=gen(22), dtype=F64) * 2.0, L)
    active = torch.tensor([1, 0, 1, 1, 0, 1, 1, 0], dtype=torch.bool)
    c, _ = alignment_gain(h, P, L, var, d)
    alpha = power_scale(h, c)
    g = gen(23)
    y = superpose(transmit_signals(grads, alpha, var, g), h, active, n0, g)
    # recompute the same draws from an identically seeded generator, in the documented order
    g2 = gen(23)
    n = torch.sqrt(var)[:, None] * torch.randn(K, d, generator=g2, dtype=F64)
    m = math.sqrt(n0) * torch.randn(d, generator=g2, dtype=F64) if n0 > 0 else torch.zeros(d, dtype=F64)
    expected = grads[active].sum(0) + n[active].sum(0) + m / c
    assert torch.allclose(y / c, expected, rtol=0, atol=1e-10)
    # and the returned noise is that same n
    _, n_ret = transmit_signals(grads, alpha, var, gen(23), return_noise=True)
    assert torch.equal(n_ret, n)


def test_noiseless_channel_draws_nothing_and_inactive_rows_are_ignored():
    g = gen(31)
    state = g.get_state()
    x = torch.tensor([[1.0, 2.0], [float("nan"), float("inf")], [3.0, -1.0]], dtype=F64)
    y = superpose(x, torch.tensor([2.0, 5.0, 0.5], dtype=F64), torch.tensor([True, False, True]), 0.0, g)
    assert torch.equal(y, torch.tensor([3.5, 3.5], dtype=F64))
    assert torch.equal(g.get_state(), state)
    superpose(x[[0]], torch.ones(1, dtype=F64), torch.ones(1, dtype=torch.bool), 1.0, g)
    assert not torch.equal(g.get_state(), state)
    with pytest.raises(OtaflInputError, match="-0.1"):
        superpose(x, torch.ones(3, dtype=F64), torch.ones(3, dtype=torch.bool), -0.1, g)


def test_aligned_noise_variance_matches_effective_noise_var():
    # One round with d = 20000 coordinates; the sample variance of the noise in y / c has
    # relative s.e. sqrt(2 / d) = 1%; seed 41, tolerance 5%.
    K, d, L, n0 = 10, 20000, 1.0, 2.0
    h, P, _ = _setup(K=K, d=d, seed=40)
    P = P / 1e4  # weak users, so the channel noise N0 / c^2 is a visible share
    var = torch.linspace(0.0, 0.05, K, dtype=F64)
    grads, _ = clip_gradients(torch.randn(K, d, generator=gen(42), dtype=F64), L)
    active = torch.tensor([True, False] * 5)
    c, _ = alignment_gain(h, P, L, var, d)
    g = gen(41)
    y = superpose(transmit_signals(grads, power_scale(h, c), var, g), h, active, n0, g)
    noise = y / c - grads[active].sum(0)
    predicted = float(effective_noise_var(var, active, n0, c))
    assert n0 / float(c) ** 2 > 0.2 * predicted
    assert float(noise.var()) == pytest.approx(predicted, rel=0.05)


def test_effective_noise_var_formula_and_edge_cases():
    var = torch.tensor([0.1, 0.2, 0.3], dtype=F64)
    active = torch.tensor([True, False, True])
    assert float(effective_noise_var(var, active, 1.0, 0.5)) == pytest.approx(0.4 + 4.0, rel=1e-14)
    assert float(effective_noise_var(var, active, 0.0, 0.0)) == pytest.approx(0.4, rel=1e-14)
    assert math.isinf(float(effective_noise_var(var, active, 1.0, 0.0)))


def test_transmit_signals_rejects_negative_noise_variance():
    with pytest.raises(OtaflInputError, match="-0.2"):
        transmit_signals(torch.zeros(2, 3), torch.ones(2), torch.tensor([0.1, -0.2]), gen(0))


# ---------------------------------------------------------------- groups and noise specs
def test_assign_groups_uses_exact_sizes_then_proportional_then_even():
    assert torch.bincount(assign_groups(200, [68, 66, 66], 3)).tolist() == [68, 66, 66]
    assert torch.bincount(assign_groups(10, [1, 2, 3], 3)).tolist() == [2, 3, 5]
    assert torch.bincount(assign_groups(200, None, 3)).tolist() == [67, 67, 66]
    assert torch.bincount(assign_groups(100, [68, 66, 66], 3)).tolist() == [34, 33, 33]
    grp = assign_groups(7, None, 2)
    assert grp.dtype == torch.int64 and grp.tolist() == [0, 0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("args,needle", [((0, None, 1), "0"), ((5, None, 0), "0"),
                                         ((5, [1, 2], 3), "2 entries"), ((5, [1, -2], 2), "-2")])
def test_assign_groups_rejects_bad_specs(args, needle):
    with pytest.raises(OtaflInputError, match=needle):
        assign_groups(*args)


def test_resolve_noise_var_accepts_scalar_per_group_and_per_user():
    groups = assign_groups(6, [1, 2, 3], 3)
    assert resolve_noise_var(0.1, groups, 6).tolist() == [0.1] * 6
    assert resolve_noise_var([0.5], groups, 6).tolist() == [0.5] * 6
    assert resolve_noise_var([0.1, 0.2, 0.3], groups, 6).tolist() == [0.1, 0.2, 0.2, 0.3, 0.3, 0.3]
    per_user = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    out = resolve_noise_var(per_user, groups, 6)
    assert out.dtype == F64 and out.tolist() == per_user


def test_resolve_noise_var_rejects_negative_values_and_wrong_lengths():
    groups = assign_groups(6, [1, 2, 3], 3)
    with pytest.raises(OtaflInputError, match="-0.1"):
        resolve_noise_var(-0.1, groups, 6)
    with pytest.raises(OtaflInputError, match="-0.3"):
        resolve_noise_var([0.1, 0.2, -0.3], groups, 6)
    with pytest.raises(OtaflInputError) as err:
        resolve_noise_var([0.1, 0.2], groups, 6)
    assert all(s in str(err.value) for s in ("2 values", "1", "3", "6"))
    # the same expansion serves other per-user keys, named in their errors
    assert resolve_per_user([1.0, 2.0, 3.0], groups, 6, name="channel.large_scale_gain")[-1] == 3.0
    with pytest.raises(OtaflInputError, match="channel.large_scale_gain has 2 values"):
        resolve_per_user([1.0, 2.0], groups, 6, name="channel.large_scale_gain")
