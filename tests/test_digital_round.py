"""The digital aggregation strategy: unbiased estimators, overflow handling, the uplink's cost."""

from __future__ import annotations

import math

import pytest
import torch

from otafl.channel.orthogonal import uplink_cost
from otafl.config import load_spec
from otafl.fl.digital import build_digital, digital_aggregate
from otafl.fl.grads import StackedGradients
from otafl.fl.round import ota_aggregate
from otafl.transmit import ChannelSetup

K, D_MODEL = 4, 6


def _setup(mechanism, **over):
    sets = [f"digital.mechanism='{mechanism}'", f"data.users={K}", "transmit.clip=1.0",
            "digital.min_rate=0.0"] + [f"digital.{k}={v}" for k, v in over.items()]
    spec = load_spec(None, sets)
    return build_digital(spec, dim=D_MODEL, power=torch.full((K,), 10.0 * D_MODEL, dtype=torch.float64), n0=1.0)


def _grads():
    g = torch.tensor([[0.3, -0.2, 0.1, 0.0, 0.5, -0.4],
                      [0.9, 0.9, 0.9, 0.9, 0.9, 0.9],  # norm > 1: clipped
                      [-0.1, 0.0, 0.2, 0.3, -0.3, 0.1],
                      [0.0, 0.7, -0.7, 0.0, 0.0, 0.1]], dtype=torch.float32)
    return StackedGradients(g)


def _true_sum():
    g = _grads()
    factor = torch.clamp(1.0 / g.norms, max=1.0)
    return (g.grads * factor[:, None]).sum(0).double()


# Draws per case: 1000 resolve a bias of 5 / sqrt(1000) = 0.16 standard deviations of one draw
# (2500 resolved 0.1 at 2.5x the time; the teeth below reject a bias of one standard deviation).
REPS = 1000


@pytest.mark.parametrize("mechanism,over,reps", [
    ("gaussian", {"sigma2": 0.05}, REPS),
    ("skellam", {"sigma2": 0.05, "bits": 20}, REPS),
    ("skellam", {"sigma2": 0.0, "bits": 16, "scale": 3.0}, REPS),   # coarse grid: rounding dominates
    ("ddg", {"sigma2": 0.05, "bits": 20}, REPS),
    ("ddg", {"sigma2": 0.05, "bits": 16, "scale": 3.0}, REPS),   # coarse grid, sigma_u ~ 0.7 levels
    ("pbm", {"bits": 8, "theta": 0.2, "clip_prob": 0.2}, REPS),   # m = 63: torch.binomial
    ("pbm", {"bits": 3, "theta": 0.2, "clip_prob": 0.2}, REPS),   # m = 1: one centred coin, bool sums
    ("pbm", {"bits": 5, "theta": 0.2, "clip_prob": 0.2}, REPS),   # m = 7: coins added
])
@pytest.mark.parametrize("superposition", ["aggregate", "per-user"])
def test_each_digital_estimator_is_unbiased(mechanism, over, reps, superposition):
    """Monte Carlo, seed 0: every coordinate of the mean decoded sum is within 5 standard
    errors of the clipped gradients' sum (and a biased variant would be caught: see below)."""
    digital = _setup(mechanism, **over)
    gen = torch.Generator().manual_seed(0)
    grads, h, active = _grads(), torch.ones(K, dtype=torch.float64), torch.ones(K, dtype=torch.bool)
    draws = torch.stack([digital_aggregate(grads, h, active, None, gen, superposition=superposition,
                                           digital=digital).aligned_sum.double() for _ in range(reps)])
    truth = _true_sum()
    se = draws.std(0) / math.sqrt(reps)
    assert bool(((draws.mean(0) - truth).abs() <= 5 * se + 1e-9).all()), (draws.mean(0), truth, se)
    # the test can fail: a sum off by one standard deviation of a single draw is rejected
    assert bool(((draws.mean(0) + draws.std(0) - truth).abs() > 5 * se).any())


def test_overflow_skips_the_round_and_is_counted():
    digital = _setup("skellam", sigma2=0.0, bits=4, scale=200.0)  # 4 users x ~100 levels >> 8
    gen = torch.Generator().manual_seed(0)
    agg = digital_aggregate(_grads(), torch.ones(K, dtype=torch.float64), torch.ones(K, dtype=torch.bool),
                            None, gen, digital=digital)
    assert agg.skip and agg.extras["overflow"] > 0 and float(agg.aligned_sum.abs().sum()) == 0.0
    # enough bits: no overflow, the decoded sum is the quantised sum (no noise) within 1/scale per user
    digital = _setup("skellam", sigma2=0.0, bits=24, scale=200.0, rotation="false")
    agg = digital_aggregate(_grads(), torch.ones(K, dtype=torch.float64), torch.ones(K, dtype=torch.bool),
                            None, gen, digital=digital)
    assert not agg.skip and agg.extras["overflow"] == 0
    assert torch.allclose(agg.aligned_sum.double(), _true_sum(), atol=K / 200.0)


def test_channel_uses_energy_and_outage_of_a_hand_computed_two_user_example():
    # d = 4, P = [40, 4] (SNR 10 and 1 per use with N0 = 1), h = [1, 0.5], B = 8 x 3 = 24 bits
    h = torch.tensor([1.0, 0.5], dtype=torch.float64)
    power = torch.tensor([40.0, 4.0], dtype=torch.float64)
    both = torch.ones(2, dtype=torch.bool)
    kw = dict(h=h, power=power, dim=4, n0=1.0, users=2, transmitting=both, bits_per_user=24.0)
    tdma = uplink_cost(access="tdma", min_rate=0.0, **kw)
    r = [math.log2(1 + 10.0), math.log2(1 + 0.25)]  # 3.459, 0.3219 bits per use
    uses = [math.ceil(24 / r[0]), math.ceil(24 / r[1])]  # 7 and 75
    assert tdma.rate.tolist() == pytest.approx(r)
    assert tdma.channel_uses == uses[0] + uses[1] == 82
    assert tdma.energy == pytest.approx(uses[0] * 10.0 + uses[1] * 1.0)  # P_k / d per use: 70 + 75
    assert tdma.bits == 48.0 and tdma.outages == 0
    ofdma = uplink_cost(access="ofdma", min_rate=0.0, **kw)
    r2 = [math.log2(1 + 20.0), math.log2(1 + 0.5)]  # K = 2 subchannels: twice the SNR per use
    u2 = [math.ceil(24 / r2[0]), math.ceil(24 / r2[1])]  # 6 and 42 subchannel uses
    assert ofdma.channel_uses == 2 * max(u2) == 84
    assert ofdma.energy == pytest.approx(2 * u2[0] * 10.0 + 2 * u2[1] * 1.0)
    # outage: user 2's rate 0.32 < 0.5 bits per use: it stays silent and costs nothing
    out = uplink_cost(access="tdma", min_rate=0.5, **kw)
    assert out.outage.tolist() == [False, True] and out.outages == 1
    assert out.channel_uses == uses[0] and out.energy == pytest.approx(uses[0] * 10.0) and out.bits == 24.0


def test_over_the_air_reports_d_channel_uses_and_the_participants_transmit_energy():
    g = torch.tensor([[3.0, 4.0], [0.0, 0.5]], dtype=torch.float64)  # norms 5 (clipped to 1) and 0.5
    setup = ChannelSetup(power=torch.tensor([100.0, 100.0], dtype=torch.float64),
                         noise_var=torch.tensor([0.1, 0.2], dtype=torch.float64), n0=1.0, clip=1.0, dim=2)
    h = torch.tensor([1.0, 2.0], dtype=torch.float64)
    agg = ota_aggregate(StackedGradients(g), h, torch.ones(2, dtype=torch.bool), setup, torch.Generator())
    c = min(1.0 * math.sqrt(100 / (1 + 2 * 0.1)), 2.0 * math.sqrt(100 / (1 + 2 * 0.2)))
    alpha = [c / 1.0, c / 2.0]
    energy = alpha[0] ** 2 * (1.0 + 2 * 0.1) + alpha[1] ** 2 * (0.25 + 2 * 0.2)
    assert agg.extras["channel_uses"] == 2.0 and agg.extras["outages"] == 0
    assert agg.extras["energy"] == pytest.approx(energy)


@pytest.mark.parametrize("ghost", [True, False])
def test_block_materialisation_equals_the_rows_of_the_full_one(ghost):
    from torch import nn

    from otafl.fl.grads import ghost_gradients

    gen = torch.Generator().manual_seed(0)  # seed 0
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    x = torch.randn(6, 7, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (6, 7), generator=gen)
    w = torch.full((6, 7), 1 / 7, dtype=torch.float64)
    grads = ghost_gradients(model, x, y, w, weight_decay=0.1, ghost=ghost)
    rows = torch.tensor([4, 0, 2])
    full = grads.materialise()
    assert torch.allclose(grads.materialise_rows(rows), full[rows])
    coef = torch.tensor([0.5, 2.0, -1.0], dtype=torch.float64)
    assert torch.allclose(grads.materialise_rows(rows, coef), full[rows] * coef[:, None])
    out = torch.full((3, full.shape[1] + 5), 7.0, dtype=torch.float64)  # padded block
    grads.materialise_rows(slice(1, 4), coef, out=out)
    assert torch.allclose(out[:, :full.shape[1]], full[1:4] * coef[:, None])
    assert torch.all(out[:, full.shape[1]:] == 7.0)  # the padding is not touched
    columns = torch.linspace(-2.0, 3.0, full.shape[1], dtype=torch.float64)  # e.g. signs x scale
    grads.materialise_rows(slice(1, 4), coef, out=out, columns=columns)
    assert torch.allclose(out[:, :full.shape[1]], full[1:4] * coef[:, None] * columns[None, :])



@pytest.mark.parametrize("superposition", ["aggregate", "per-user"])
def test_ddg_rounds_add_n_discrete_gaussian_shares(superposition):
    """Seed 0, no rotation, zero gradients on an integer grid: the decoded sum times s is the
    sum of K shares N_Z(0, sigma^2 s^2) per coordinate, integer-valued, with the summed exact
    variance (K x the discrete Gaussian's variance, below K sigma^2 s^2) within 5 standard errors."""
    from otafl.fl.discrete_gaussian import discrete_gaussian_pmf

    digital = _setup("ddg", sigma2=0.02, bits=24, scale=5.0, rotation="false")  # sigma_u^2 = 0.5 levels^2
    zero = StackedGradients(torch.zeros(K, D_MODEL, dtype=torch.float64))
    gen = torch.Generator().manual_seed(0)
    h, active = torch.ones(K, dtype=torch.float64), torch.ones(K, dtype=torch.bool)
    draws = torch.stack([digital_aggregate(zero, h, active, None, gen, superposition=superposition,
                                           digital=digital).aligned_sum.double() * 5.0 for _ in range(3000)])
    assert bool((draws == torch.round(draws)).all())
    support = torch.arange(-40, 41, dtype=torch.float64).numpy()
    pmf = discrete_gaussian_pmf(support, 0.5)
    var_share = float((pmf * support ** 2).sum())  # ~0.4985 < 0.5
    m2 = (draws ** 2).mean()
    fourth = 3 * (K * var_share) ** 2  # ~ the summed law's 4th moment (close to Gaussian)
    se = math.sqrt((fourth - (K * var_share) ** 2) / draws.numel())
    assert abs(float(m2) - K * var_share) <= 5 * se, (float(m2), K * var_share, se)


@pytest.mark.parametrize("mechanism,over", [("skellam", {"bits": 20}), ("ddg", {"bits": 20}),
                                            ("pbm", {"bits": 12}), ("pbm", {"bits": 16})])
@pytest.mark.parametrize("superposition", ["aggregate", "per-user"])
def test_blocks_taken_as_slices_equal_blocks_gathered_by_index(mechanism, over, superposition, monkeypatch):
    """Seed 0, 30 users of whom 3 do not transmit: with the 3 in outage (h = 0, their gradients
    computed but not sent: rows gathered by index) the round equals the one where they did not
    take part (their gradients never computed: every computed user sends, blocks are slices),
    bit for bit."""
    import otafl.fl.digital as dg

    n = 30
    spec = load_spec(None, [f"digital.mechanism='{mechanism}'", f"data.users={n}", "transmit.clip=1.0",
                            "digital.min_rate=0.1", "digital.sigma2=0.05"]
                     + [f"digital.{k}={v}" for k, v in over.items()])
    digital = build_digital(spec, dim=D_MODEL, power=torch.full((n,), 10.0 * D_MODEL, dtype=torch.float64), n0=1.0)
    g = torch.randn(n, D_MODEL, generator=torch.Generator().manual_seed(1))
    out = torch.zeros(n, dtype=torch.bool)
    out[[3, 11, 20]] = True
    monkeypatch.setattr(dg, "USER_CHUNK", 8)  # several blocks, a short last one
    gathered = digital_aggregate(StackedGradients(g), torch.where(out, 0.0, 1.0).double(),
                                 torch.ones(n, dtype=torch.bool), None, torch.Generator().manual_seed(0),
                                 superposition=superposition, digital=digital)
    sliced = digital_aggregate(StackedGradients(g[~out]), torch.ones(n, dtype=torch.float64), ~out, None,
                               torch.Generator().manual_seed(0), superposition=superposition, digital=digital)
    assert int(gathered.transmitting.sum()) == int(sliced.transmitting.sum()) == n - 3
    assert torch.equal(gathered.aligned_sum, sliced.aligned_sum)


def test_exact_sums_switch_to_float64_when_float32_could_round():
    """The accumulators of _encode_sum: float32 only while the bound on the total is below 2^23."""
    from otafl.fl.digital import _Sums

    assert _Sums(4, "cpu", torch.float32, bound=2.0 ** 22).values.dtype == torch.float32
    assert _Sums(4, "cpu", torch.float32, bound=2.0 ** 23).values.dtype == torch.float64
    assert _Sums(4, "cpu", torch.float16, bound=10.0).values.dtype == torch.float64
    sums = _Sums(2, "cpu", torch.float32, bound=2.0 ** 30)  # wide: exact beyond 2^24
    block = torch.tensor([[2.0 ** 24, 1.0], [1.0, 0.0]], dtype=torch.float32)
    sums.add_values(block)
    sums.add_coins(torch.tensor([[True, False], [True, True]]))
    assert sums.total().tolist() == [2.0 ** 24 + 1 + 2, 1.0 + 1]
