"""Gaussian mechanism and amplification by sampling, against independent references."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from otafl.privacy.analysis.gaussian import (
    amplify_by_sampling,
    analytic_gaussian_epsilon,
    classic_gaussian_epsilon,
    gaussian_hockey_stick,
)


def hockey_stick_by_quadrature(eps: float, sensitivity: float, std: float) -> float:
    """delta(eps) = int max(0, p(x) - e^eps q(x)) dx for p = N(Delta, s^2), q = N(0, s^2).

    Integrated numerically (scipy.integrate.quad) over the whole line, split at the
    crossing point only to help the quadrature; no closed form is used.
    """
    p = stats.norm(loc=sensitivity, scale=std)
    q = stats.norm(loc=0.0, scale=std)

    def integrand(x):
        return max(0.0, p.pdf(x) - math.exp(eps) * q.pdf(x))

    cross = std * std * eps / sensitivity + sensitivity / 2
    lo, hi = -60 * std - sensitivity, 60 * std + sensitivity + cross
    left, _ = integrate.quad(integrand, lo, cross, epsabs=0, epsrel=1e-11, limit=400)
    right, _ = integrate.quad(integrand, cross, hi, epsabs=0, epsrel=1e-11, limit=400,
                              points=[cross + k * std for k in range(1, 40)])
    return left + right


@pytest.mark.parametrize("sensitivity,std,delta", [
    (1.0, 1.0, 1e-5), (2.0, 0.316, 1e-5), (0.2, 1.0, 1e-3), (1.0, 4.0, 1e-8), (3.0, 1.0, 0.05),
])
def test_analytic_epsilon_meets_delta_exactly_by_numerical_integration(sensitivity, std, delta):
    eps = float(analytic_gaussian_epsilon(sensitivity=sensitivity, noise_std=std, delta=delta))
    assert eps > 0
    # At eps the divergence equals delta (the root), and a slightly smaller eps breaks it.
    assert hockey_stick_by_quadrature(eps, sensitivity, std) == pytest.approx(delta, rel=1e-6)
    assert hockey_stick_by_quadrature(eps * (1 - 1e-4), sensitivity, std) > delta


def test_analytic_epsilon_is_zero_when_delta_already_met_at_zero():
    # delta(0) = 2 Phi(r/2) - 1 = total variation; with r = 0.01 it is ~0.004 < 0.01.
    eps = analytic_gaussian_epsilon(sensitivity=0.01, noise_std=1.0, delta=0.01)
    assert float(eps) == 0.0
    assert hockey_stick_by_quadrature(0.0, 0.01, 1.0) <= 0.01


def test_hockey_stick_closed_form_matches_quadrature():
    for eps in (0.0, 0.5, 2.0, 6.0):
        closed = float(gaussian_hockey_stick(epsilon=eps, sensitivity=2.0, noise_std=1.3))
        assert closed == pytest.approx(hockey_stick_by_quadrature(eps, 2.0, 1.3), rel=1e-7)


def test_classic_formula_at_known_points():
    # delta = 1.25 e^{-1/2} makes sqrt(2 ln(1.25/delta)) = 1, so eps = Delta / s.
    assert float(classic_gaussian_epsilon(sensitivity=3.0, noise_std=2.0, delta=1.25 * math.exp(-0.5))) \
        == pytest.approx(1.5, rel=1e-15)
    # Dwork & Roth: s = Delta sqrt(2 ln(1.25/delta)) / eps gives back eps; delta = 1e-5 needs s = 4.8448 Delta.
    s = math.sqrt(2 * math.log(1.25e5))
    assert s == pytest.approx(4.84481, abs=1e-5)
    assert float(classic_gaussian_epsilon(sensitivity=1.0, noise_std=s, delta=1e-5)) == pytest.approx(1.0, rel=1e-15)
    assert float(classic_gaussian_epsilon(sensitivity=1.0, noise_std=0.0, delta=1e-5)) == math.inf


@settings(max_examples=60, deadline=None)
@given(ratio=st.floats(1e-3, 30.0), log_delta=st.floats(-30.0, -1.0))
def test_analytic_never_exceeds_classic_where_classic_is_valid(ratio, log_delta):
    delta = math.exp(log_delta)
    classic = float(classic_gaussian_epsilon(sensitivity=ratio, noise_std=1.0, delta=delta))
    analytic = float(analytic_gaussian_epsilon(sensitivity=ratio, noise_std=1.0, delta=delta))
    if classic <= 1.0:
        assert analytic <= classic * (1 + 1e-12)


def test_classic_understates_leakage_outside_its_range():
    # Delta/s = 2/sqrt(0.1): the paper's LDP step with L = 1, sigma^2 = 0.1, N0 = 0.
    classic = float(classic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(0.1), delta=1e-5))
    analytic = float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(0.1), delta=1e-5))
    assert classic > 1 and analytic > classic


def test_analytic_edge_cases_and_broadcasting():
    eps = analytic_gaussian_epsilon(sensitivity=torch.tensor([[1.0], [0.0]]),
                                    noise_std=torch.tensor([0.0, 1.0, math.inf]), delta=1e-5)
    assert eps.shape == (2, 3) and eps.dtype == torch.float64
    assert eps[0, 0] == math.inf and eps[0, 2] == 0 and (eps[1] == 0).all()
    assert 0 < eps[0, 1] < math.inf


def test_analytic_is_finite_for_tiny_delta_and_large_epsilon():
    eps = analytic_gaussian_epsilon(sensitivity=50.0, noise_std=1.0, delta=1e-300)
    assert math.isfinite(float(eps)) and float(eps) > 1250
    assert float(gaussian_hockey_stick(epsilon=eps, sensitivity=50.0, noise_std=1.0)) <= 1e-300 * (1 + 1e-6)


def test_amplification_formula():
    eps, delta = amplify_by_sampling(epsilon=torch.tensor([0.0, 1e-9, 1.0, 5.0], dtype=torch.float64), delta=1e-5, sampling_rate=0.3)
    expect = [math.log1p(0.3 * math.expm1(e)) for e in (0.0, 1e-9, 1.0, 5.0)]
    assert torch.allclose(eps, torch.tensor(expect, dtype=torch.float64), rtol=1e-14, atol=0)
    assert torch.allclose(delta, torch.full((4,), 3e-6, dtype=torch.float64))
    # q = 1 changes nothing; q = 0 leaks nothing, even from an unbounded mechanism.
    assert float(amplify_by_sampling(epsilon=2.5, delta=0.1, sampling_rate=1.0)[0]) == pytest.approx(2.5, rel=1e-15)
    eps0, delta0 = amplify_by_sampling(epsilon=math.inf, delta=1.0, sampling_rate=0.0)
    assert float(eps0) == 0.0 and float(delta0) == 0.0
    # Large eps: no overflow, eps' = eps + log q to first order.
    big = float(amplify_by_sampling(epsilon=1000.0, delta=0.0, sampling_rate=0.1)[0])
    assert big == pytest.approx(1000 + math.log(0.1), rel=1e-12)


def test_amplified_gaussian_is_sound_by_numerical_integration():
    # Add/remove: Q = N(0, s^2), P = (1 - q) N(0, s^2) + q N(Delta, s^2). The amplified
    # (eps', q delta) must bound H_{e^eps'}(P || Q) (and the reverse direction).
    q, sensitivity, std, delta = 0.2, 1.0, 1.5, 1e-4
    eps = float(analytic_gaussian_epsilon(sensitivity=sensitivity, noise_std=std, delta=delta))
    eps_amp, delta_amp = (float(v) for v in amplify_by_sampling(epsilon=eps, delta=delta, sampling_rate=q))
    p0, p1 = stats.norm(0, std), stats.norm(sensitivity, std)

    def mix(x):
        return (1 - q) * p0.pdf(x) + q * p1.pdf(x)

    forward, _ = integrate.quad(lambda x: max(0.0, mix(x) - math.exp(eps_amp) * p0.pdf(x)), -40, 40,
                                epsabs=0, epsrel=1e-10, limit=400)
    backward, _ = integrate.quad(lambda x: max(0.0, p0.pdf(x) - math.exp(eps_amp) * mix(x)), -40, 40,
                                 epsabs=0, epsrel=1e-10, limit=400)
    # The add/remove bound is tight in the forward direction: equality up to quadrature error.
    assert forward <= delta_amp * (1 + 1e-9) and backward <= delta_amp * (1 + 1e-9)
    assert forward == pytest.approx(delta_amp, rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_the_inputs_device():
    s = torch.tensor([0.5, 1.0, 2.0], device="cuda")
    eps = analytic_gaussian_epsilon(sensitivity=1.0, noise_std=s, delta=1e-5)
    assert eps.device.type == "cuda"
    assert torch.allclose(eps.cpu(), analytic_gaussian_epsilon(sensitivity=1.0, noise_std=s.cpu(), delta=1e-5))
