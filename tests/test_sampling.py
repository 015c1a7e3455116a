"""Sampling schemes (p[t, k]) and the users' coins."""

import math

import pytest
import torch

from otafl.channel import make_fading
from otafl.errors import OtaflInputError
from otafl.sampling import (
    SAMPLING_SCHEMES,
    SCHEDULES,
    ChannelAwareSampling,
    SamplingScheme,
    TimeVaryingSampling,
    UniformSampling,
    draw_participants,
    make_sampling,
)

F64 = torch.float64

EXAMPLES = {
    "uniform": dict(p=0.3),
    "time-varying": dict(schedule="linear", p_start=0.2, p_end=0.9),
    "channel-aware": dict(h_th=2.0),
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def channel(T=40, K=25, seed=0):
    return make_fading("ar-rician", rician_k=5.0, rho=0.1).sample(T, torch.ones(K), gen(seed))


@pytest.mark.parametrize("name", sorted(SAMPLING_SCHEMES))
def test_every_registered_scheme_maps_h_to_float64_probabilities_of_the_same_shape(name):
    assert set(EXAMPLES) == set(SAMPLING_SCHEMES)
    scheme = make_sampling(name, **EXAMPLES[name])
    assert isinstance(scheme, SamplingScheme)
    h = channel()
    p = scheme.probabilities(h)
    assert p.shape == h.shape and p.dtype == F64
    assert bool(((p >= 0) & (p <= 1)).all())
    # per-round calls with (start, horizon) agree with one call on the whole tensor
    rows = [scheme.probabilities(h[t:t + 1], start=t, horizon=h.shape[0]) for t in range(h.shape[0])]
    assert torch.equal(torch.cat(rows), p)


def test_uniform_probability_is_p_everywhere():
    p = UniformSampling(0.37).probabilities(channel())
    assert bool((p == 0.37).all())


def test_channel_aware_probability_is_min_of_one_and_h_over_threshold():
    h = channel(T=50, K=40, seed=3)
    p = ChannelAwareSampling(h_th=1.2).probabilities(h)
    assert torch.equal(p, torch.minimum(torch.ones_like(h), h / 1.2))
    assert bool((p == 1).any()) and bool((p < 1).any())


@pytest.mark.parametrize("schedule", ["linear", "exponential", "cosine"])
@pytest.mark.parametrize("p_start,p_end", [(0.1, 0.9), (1.0, 0.05)])
def test_interpolating_schedules_hit_their_endpoints_and_stay_between_them(schedule, p_start, p_end):
    T = 37
    s = TimeVaryingSampling(schedule, p_start, p_end)
    p = s.probabilities(torch.ones(T, 4, dtype=F64))
    assert float(p[0, 0]) == p_start and float(p[-1, 0]) == p_end
    assert bool((p == p[:, :1]).all())  # one schedule for all users
    col = p[:, 0]
    lo, hi = min(p_start, p_end), max(p_start, p_end)
    assert bool(((col >= lo) & (col <= hi)).all())
    steps = col.diff() * (1 if p_end > p_start else -1)
    assert bool((steps >= 0).all())  # monotone from start to end


def test_schedule_midpoints_follow_their_formulas():
    T = 5  # s = 0, 1/4, 1/2, 3/4, 1
    lin = TimeVaryingSampling("linear", 0.2, 0.6).schedule_values(T)
    assert float(lin[2]) == pytest.approx(0.4, rel=1e-14)
    geo = TimeVaryingSampling("exponential", 0.1, 0.9).schedule_values(T)
    assert float(geo[2]) == pytest.approx(math.sqrt(0.1 * 0.9), rel=1e-14)
    cos = TimeVaryingSampling("cosine", 0.2, 0.6).schedule_values(T)
    assert float(cos[1]) == pytest.approx(0.6 + (0.2 - 0.6) * (1 + math.cos(math.pi / 4)) / 2, rel=1e-14)
    assert TimeVaryingSampling("constant", 0.3).schedule_values(3).tolist() == [0.3] * 3
    assert TimeVaryingSampling("linear", 0.2, 0.6).schedule_values(1).tolist() == [0.2]


def test_list_schedule_holds_last_value_or_cycles():
    hold = TimeVaryingSampling("list", values=(0.1, 0.5, 0.7))
    assert hold.schedule_values(5).tolist() == [0.1, 0.5, 0.7, 0.7, 0.7]
    cyc = make_sampling("time-varying", schedule="list", values=[0.1, 0.5, 0.7], overflow="cycle")
    assert cyc.schedule_values(5).tolist() == [0.1, 0.5, 0.7, 0.1, 0.5]


def test_coins_land_heads_with_frequency_p():
    # 20000 rounds per user, seed 5; each frequency within 5 binomial standard errors
    # sqrt(p (1 - p) / N) of p (p = 0 and p = 1 exactly).
    p = torch.tensor([0.0, 0.02, 0.3, 0.5, 0.9, 1.0], dtype=F64)
    N = 20000
    active = draw_participants(p.expand(N, -1), gen(5))
    assert active.dtype == torch.bool and active.shape == (N, 6)
    freq = active.to(F64).mean(0)
    se = torch.sqrt(p * (1 - p) / N)
    assert bool(((freq - p).abs() <= 5 * se).all())
    assert float(freq[0]) == 0.0 and float(freq[-1]) == 1.0
    # users are independent: the sample correlation of two coins is within 5 / sqrt(N)
    a, b = active[:, 2].to(F64), active[:, 3].to(F64)
    corr = float(((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std()))
    assert abs(corr) < 5 / math.sqrt(N)


def test_draw_participants_rejects_probabilities_outside_unit_interval():
    with pytest.raises(OtaflInputError, match="1.2"):
        draw_participants(torch.tensor([0.5, 1.2]), gen(0))


@pytest.mark.parametrize("name,params,needle", [
    ("uniform", dict(p=1.5), "sampling.p = 1.5 is outside the allowed range (0, 1]"),
    ("uniform", dict(p=0.0), "sampling.p = 0.0 is outside the allowed range (0, 1]"),
    ("uniform", dict(p=-0.1), "-0.1"),
    ("channel-aware", dict(h_th=0.0), "sampling.h_th = 0.0"),
    ("channel-aware", dict(h_th=-2.0), "-2.0"),
    ("time-varying", dict(schedule="linear", p_start=0.0, p_end=0.5), "sampling.p_start = 0.0"),
    ("time-varying", dict(schedule="linear", p_start=0.2, p_end=1.01), "sampling.p_end = 1.01"),
    ("time-varying", dict(schedule="list", values=[0.3, 2.0]), "sampling.values = 2.0"),
    ("time-varying", dict(schedule="sawtooth", p_start=0.2, p_end=0.5), "'sawtooth'"),
    ("time-varying", dict(schedule="linear", p_start=0.2), "p_end"),
    ("time-varying", dict(schedule="list"), "values"),
    ("uniform", dict(), "needs p"),
    ("uniform", dict(p=0.5, h_th=1.0), "h_th"),
])
def test_bad_sampling_parameters_raise_naming_the_value(name, params, needle):
    with pytest.raises(OtaflInputError) as err:
        make_sampling(name, **params)
    assert needle in str(err.value)


def test_unknown_scheme_name_lists_the_known_ones():
    with pytest.raises(OtaflInputError) as err:
        make_sampling("round-robin", p=0.5)
    assert "round-robin" in str(err.value)
    assert all(name in str(err.value) for name in SAMPLING_SCHEMES)



@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_registered_schedule_gives_probabilities_in_range_for_every_round(schedule):
    scheme = make_sampling("time-varying", schedule=schedule, p_start=0.9, p_end=0.2, values=(0.3, 0.7))
    p = scheme.probabilities(torch.ones(7, 4, dtype=torch.float64))
    assert p.shape == (7, 4) and bool(((p > 0) & (p <= 1)).all())
