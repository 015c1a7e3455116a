"""Fading processes: Monte-Carlo statistics against the AR(1) Rician model's theory.

Every statistical check states its seed and tolerance; tolerances are several standard
errors wide so a correct model passes, and far below the effect a wrong model would show.
"""

import math

import pytest
import torch
from scipy import stats

from otafl.channel import FADING_MODELS, ARRicianFading, RayleighFading, StaticFading, make_fading
from otafl.errors import OtaflInputError


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", sorted(FADING_MODELS))
def test_every_registered_model_returns_nonnegative_float64_of_shape_rounds_by_users(name):
    model = make_fading(name, rician_k=3.0, rho=0.5)
    h = model.sample(7, torch.ones(5), gen(0))
    assert h.shape == (7, 5) and h.dtype == torch.float64
    assert bool((h >= 0).all()) and bool(torch.isfinite(h).all())
    assert model.sample(0, torch.ones(5), gen(0)).shape == (0, 5)
    # one generator, one stream: same seed -> same channel, other seed -> other channel
    assert torch.equal(h, model.sample(7, torch.ones(5), gen(0)))
    if name != "static":
        assert not torch.equal(h, model.sample(7, torch.ones(5), gen(1)))


@pytest.mark.parametrize("G,rho", [(0.0, 0.0), (5.0, 0.1), (5.0, 0.9), (20.0, 0.5)])
def test_mean_power_is_one_with_unit_large_scale_gain(G, rho):
    # seed 1, 400 rounds x 1000 users; Var(h^2) = (1 + 2G)/(1 + G)^2 <= 1 and correlation over
    # rounds inflates the variance of the mean by at most (1 + rho^2)/(1 - rho^2) < 10, so the
    # standard error is below sqrt(10 / 4e5) = 0.005; tolerance 0.02 (4 s.e.).
    h = ARRicianFading(rician_k=G, rho=rho).sample(400, torch.ones(1000), gen(1))
    assert abs(float((h ** 2).mean()) - 1.0) < 0.02


def test_mean_power_equals_squared_large_scale_gain_per_user():
    # seed 2, 4000 i.i.d. rounds per user; relative tolerance 5% (>5 standard errors: the
    # relative s.e. of mean(h^2) is sqrt((1 + 2G)/(1 + G)^2 / 4000) = 0.009 for G = 5).
    g = torch.tensor([0.1, 0.5, 1.0, 2.0, 10.0], dtype=torch.float64)
    h = make_fading("ar-rician", rician_k=5.0, rho=0.0).sample(4000, g, gen(2))
    ratio = (h ** 2).mean(dim=0) / g ** 2
    assert torch.allclose(ratio, torch.ones(5, dtype=torch.float64), atol=0.05)


@pytest.mark.parametrize("rho", [0.0, 0.1, 0.7, 0.95])
def test_scattered_part_has_unit_power_and_lag_one_correlation_rho(rho):
    # seed 3, T = 200 rounds x K = 2000 users (~4e5 lag-1 pairs, pairs of different users
    # independent): the s.e. of the correlation estimate is about 1/sqrt(K) per round-lag,
    # ~0.003 over all pairs; tolerance 0.02 (a wrong rho, e.g. rho^2 for 0.7, misses by 0.21).
    h, r = ARRicianFading(rician_k=5.0, rho=rho).sample(200, torch.ones(2000), gen(3),
                                                       return_scattered=True)
    assert r.dtype == torch.complex128 and r.shape == (200, 2000)
    corr = (r[1:] * r[:-1].conj()).mean() / (r.abs() ** 2).mean()
    assert abs(corr.real.item() - rho) < 0.02
    assert abs(corr.imag.item()) < 0.02
    # stationary: the first and the last round have the same power E|r|^2 = 1 (s.e. 0.022)
    assert abs(float((r[0].abs() ** 2).mean()) - 1.0) < 0.1
    assert abs(float((r[-1].abs() ** 2).mean()) - 1.0) < 0.1
    # h is exactly the envelope of that field
    G = 5.0
    los, nlos = math.sqrt(G / (G + 1)), math.sqrt(1 / (G + 1))
    assert torch.allclose(h, (los + nlos * r).abs(), rtol=0, atol=1e-15)


@pytest.mark.parametrize("G", [1.0, 5.0, 10.0])
def test_moment_estimate_of_k_factor_recovers_rician_k(G):
    # Moment estimator from h alone: gamma = Var(h^2)/E[h^2]^2 = (1 + 2G)/(1 + G)^2, so
    # G_hat = s / (1 - s), s = sqrt(1 - gamma). Seed 4, 4e5 i.i.d. samples (rho = 0);
    # relative tolerance 10% (the estimator's relative s.e. here is below 2.5%).
    h = ARRicianFading(rician_k=G, rho=0.0).sample(400, torch.ones(1000), gen(4))
    p = h.reshape(-1) ** 2
    gamma = float(p.var() / p.mean() ** 2)
    s = math.sqrt(max(0.0, 1.0 - gamma))
    G_hat = s / (1.0 - s)
    assert abs(G_hat - G) / G < 0.10


def test_static_channel_is_constant_over_time():
    h = make_fading("static", rician_k=5.0, rho=0.1).sample(50, torch.ones(30), gen(5))
    assert torch.equal(h, h[:1].expand_as(h))
    h1 = ARRicianFading(rician_k=2.0, rho=1.0).sample(50, torch.ones(30), gen(5))
    assert torch.equal(h1, h1[:1].expand_as(h1))
    # ... yet it varies across users
    assert float(h[0].std()) > 0.1


def test_rayleigh_power_is_exponential_by_kolmogorov_smirnov():
    # G = 0: h^2 = |r|^2 ~ Exp(1). Seed 6, 2e4 i.i.d. samples, KS test at alpha = 0.01.
    h = make_fading("rayleigh", rician_k=5.0, rho=0.0).sample(20, torch.ones(1000), gen(6))
    power = (h ** 2).reshape(-1).numpy()
    assert stats.kstest(power, "expon").pvalue > 0.01
    # negative control: the same test rejects a Rician G = 5 channel decisively
    h5 = make_fading("ar-rician", rician_k=5.0, rho=0.0).sample(20, torch.ones(1000), gen(6))
    assert stats.kstest((h5 ** 2).reshape(-1).numpy(), "expon").pvalue < 1e-6


def test_rician_envelope_matches_scipy_rice_law_by_kolmogorov_smirnov():
    # h ~ Rice(nu = sqrt(G/(G+1)), s = sqrt(1/(2(G+1)))): scipy's rice(b = nu/s, scale = s).
    # Seed 7, 2e4 i.i.d. samples, KS at alpha = 0.01.
    G = 5.0
    h = ARRicianFading(rician_k=G, rho=0.0).sample(20, torch.ones(1000), gen(7)).reshape(-1)
    s = math.sqrt(1.0 / (2.0 * (G + 1.0)))
    nu = math.sqrt(G / (G + 1.0))
    assert stats.kstest(h.numpy(), "rice", args=(nu / s, 0.0, s)).pvalue > 0.01


def test_special_cases_pin_their_parameter():
    assert make_fading("rayleigh", rician_k=5.0, rho=0.3) == RayleighFading(rho=0.3)
    assert make_fading("rayleigh", rician_k=5.0, rho=0.3).rician_k == 0.0
    assert make_fading("static", rician_k=5.0, rho=0.1).rho == 1.0
    assert isinstance(make_fading("static", rician_k=5.0, rho=0.1), StaticFading)
    assert make_fading("ar-rician", rician_k=5.0, rho=0.1) == ARRicianFading(5.0, 0.1)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(rician_k=-1.0, rho=0.1), "-1.0"),
    (dict(rician_k=float("inf"), rho=0.1), "inf"),
    (dict(rician_k=5.0, rho=1.5), "1.5"),
    (dict(rician_k=5.0, rho=-0.2), "-0.2"),
])
def test_out_of_range_parameters_raise_naming_the_value(kwargs, needle):
    with pytest.raises(OtaflInputError, match="outside the allowed range") as err:
        make_fading("ar-rician", **kwargs)
    assert needle in str(err.value)
    with pytest.raises(OtaflInputError):
        ARRicianFading(**kwargs)


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(OtaflInputError) as err:
        make_fading("nakagami", rician_k=1.0, rho=0.0)
    msg = str(err.value)
    assert "nakagami" in msg and all(name in msg for name in FADING_MODELS)


def test_negative_large_scale_gain_is_rejected():
    with pytest.raises(OtaflInputError, match="-0.5"):
        ARRicianFading().sample(3, torch.tensor([1.0, -0.5]), gen(0))
