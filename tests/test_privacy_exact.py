"""The ``exact`` accountant: closed-form limits, independent integrals, safe-side bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import chi2, norm

from otafl.errors import OtaflInputError
from otafl.privacy.accountants import paper_round, tight_round
from otafl.privacy.accountants.exact import compose_exact, exact_round
from otafl.privacy.analysis.cells import CellGrid, conditional_delta
from otafl.privacy.analysis.count_law import binomial_count_law, local_count_law, poisson_binomial_count_law
from otafl.privacy.analysis.gaussian import gaussian_hockey_stick
from otafl.privacy.analysis.mixture import mixture_hockey_stick
from otafl.privacy.analysis.ota_round import RoundSpec, round_delta, round_epsilon
from otafl.privacy.facts import RoundFacts

F64 = torch.float64


def t(v):
    return torch.as_tensor(v, dtype=F64)


def balle_wang_delta(eps, sens, std):
    """Balle & Wang (2018) Thm 8 with scipy: Phi(D/2s - eps s/D) - e^eps Phi(-D/2s - eps s/D)."""
    z = eps * std / sens
    return norm.cdf(sens / (2 * std) - z) - math.exp(eps) * norm.cdf(-sens / (2 * std) - z)


def balle_wang_epsilon(delta, sens, std):
    return brentq(lambda e: balle_wang_delta(e, sens, std) - delta, 0.0, 500.0, xtol=1e-14, rtol=1e-14)


def one_user_spec(p, own_var, channel_var, dim, sens=2.0):
    return RoundSpec(participation_prob=t([p]), own_noise_var=t([own_var]), others_noise_var=t([0.0]),
                     channel_noise_var=t([channel_var]), half_sensitivity=t([sens / 2]),
                     law=local_count_law(1), dim=dim)


@pytest.mark.parametrize("own_var,channel_var,delta", [(0.1, 0.0, 1e-5), (4.0, 0.5, 1e-8), (1.0, 1.0, 1e-3)])
def test_d1_p1_single_user_equals_the_analytic_gaussian_mechanism(own_var, channel_var, delta):
    spec = one_user_spec(1.0, own_var, channel_var, dim=1)
    eps = float(round_epsilon(delta, spec))
    ref = balle_wang_epsilon(delta, 2.0, math.sqrt(own_var + channel_var))
    assert eps == pytest.approx(ref, rel=1e-6)
    up, lo = round_delta(t([ref]), spec)
    assert float(up) == pytest.approx(delta, rel=1e-6) and float(lo) <= float(up)


def test_mixture_hockey_stick_brackets_a_direct_one_dimensional_integral():
    u = np.linspace(-60, 60, 1_200_001)
    for pi, w, W, eps in [(0.3, 1.0, 1.2, 0.5), (0.9, 0.1, 2.0, 1.0), (0.01, 0.5, 0.6, 0.1), (0.5, 2.0, 3.0, 3.0)]:
        P = (1 - pi) * norm.pdf(u, 0, math.sqrt(w)) + pi * norm.pdf(u, 1.0, math.sqrt(W))
        Q = (1 - pi) * norm.pdf(u, 0, math.sqrt(w)) + pi * norm.pdf(u, -1.0, math.sqrt(W))
        ref = np.trapezoid(np.maximum(P - math.exp(eps) * Q, 0), u)
        up, lo = mixture_hockey_stick(t(eps), log_odds=t(math.log(pi / (1 - pi))), absent_var=t(w),
                                      present_var=t(W), half_sensitivity=t(1.0))
        assert float(lo) <= float(up) <= float(lo) * (1 + 1e-9)
        assert float(up) == pytest.approx(ref, rel=2e-6)


def reference_2d(eps, p, w, W, a, n):
    """Trapezoid rule on an n x n grid in (u, s) of (f_P - e^eps f_Q)_+, d = 3 (s ~ v chi2_2)."""
    su = math.sqrt(W)
    u = np.linspace(-12 * su - a, 12 * su + a, n)
    s = np.linspace(0.0, 40 * W + 40, n)
    g0, g1 = chi2.pdf(s / w, 2) / w, chi2.pdf(s / W, 2) / W
    common = (1 - p) * norm.pdf(u, 0, math.sqrt(w))[:, None] * g0[None]
    P = common + p * norm.pdf(u, a, su)[:, None] * g1[None]
    Q = common + p * norm.pdf(u, -a, su)[:, None] * g1[None]
    return np.trapezoid(np.trapezoid(np.maximum(P - math.exp(eps) * Q, 0), s, axis=1), u)


def test_cell_bounds_are_safe_and_refining_the_cells_never_raises_the_upper_bound():
    # Independent reference: a 2-D trapezoid rule in (u, s), Richardson-extrapolated
    # (grids of 1501 and 3001 points per axis; its own error is ~1e-6 relative).
    eps, p, w, W, a = 1.0, 0.6, 0.2, 0.4, 1.0
    coarse_ref, fine_ref = reference_2d(eps, p, w, W, a, 1501), reference_2d(eps, p, w, W, a, 3001)
    ref = (4 * fine_ref - coarse_ref) / 3
    ups, los = [], []
    for cells in (4, 8, 16, 64):
        up, lo = conditional_delta(t(eps), participation_prob=t(p), absent_var=t(w), own_noise_var=t(W - w),
                                   half_sensitivity=t(a), dim=3, grid=CellGrid(cells, 2 * cells))
        ups.append(float(up))
        los.append(float(lo))
    assert all(hi >= lo for hi, lo in zip(ups, los))
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(ups, ups[1:]))  # nested grids
    assert ups[-1] >= ref * (1 - 1e-5) and los[-1] <= ref * (1 + 1e-5)
    assert ups[-1] <= ref * (1 + 1e-4)  # and it is tight


def test_more_dimensions_never_leak_less_and_the_dimension_free_bound_covers_them_all():
    kw = dict(participation_prob=t(0.4), absent_var=t(2.0), own_noise_var=t(0.5), half_sensitivity=t(1.0))
    values = [float(conditional_delta(t(1.0), dim=d, **kw)[0]) for d in (1, 2, 10, 100, 10_000)]
    free = float(conditional_delta(t(1.0), dim=None, **kw)[0])
    assert all(b >= a * (1 - 1e-9) for a, b in zip(values, values[1:]))
    assert free >= values[-1] * (1 - 1e-9)  # values are upper bounds: a 1e-13 slack above the truth
    # the Gaussian mechanism N(+a, W) vs N(-a, W), a = 1, W = 2.5
    gauss = gaussian_hockey_stick(epsilon=t(1.0), sensitivity=t(2.0), noise_std=t(2.5).sqrt())
    assert free == pytest.approx(0.4 * float(gauss), rel=1e-12)


def test_count_laws_keep_all_but_the_tail_mass_and_agree_with_each_other():
    law = binomial_count_law(t([0.3]), 199, tail_mass=1e-12)
    assert float(law.dropped) <= 1e-12
    assert float(law.weight.sum() + law.dropped) == pytest.approx(1.0, abs=1e-13)
    pb = poisson_binomial_count_law(torch.full((1, 199), 0.3, dtype=F64), tail_mass=1e-12)
    assert torch.equal(pb.n_first, law.n_first)
    assert torch.allclose(pb.weight, law.weight, rtol=1e-9, atol=1e-300)
    # Lumped blocks (very many users) keep the mass and start at the block's smallest n.
    big = binomial_count_law(t([0.5]), 10**6 - 1, tail_mass=1e-12, block_rel_width=1e-3)
    assert bool((big.n_last >= big.n_first).all()) and big.weight.shape[1] < 100
    assert float(big.weight.sum() + big.dropped) == pytest.approx(1.0, abs=1e-12)


def test_local_dp_without_channel_noise_gets_no_amplification_from_sampling():
    # N0 = 0, d > 1: the residual's norm reveals whether user k took part, so
    # delta = p * Gaussian delta and eps at p * delta_l is the Gaussian eps at delta_l.
    for p in (0.1, 0.7):
        b = exact_round(participation_prob=p, users=50, noise_var=0.5, alignment_gain=1.0, n0=0.0,
                        sensitivity=2.0, delta_l=1e-5, dim=7850)
        assert float(b.epsilon_local) == pytest.approx(balle_wang_epsilon(1e-5, 2.0, math.sqrt(0.5)), rel=1e-6)


def test_epsilon_falls_as_noise_grows_and_as_users_grow_at_fixed_p():
    kw = dict(alignment_gain=1.0, n0=0.0, sensitivity=2.0, delta_l=1e-5, dim=7850)
    by_noise = exact_round(participation_prob=0.5, users=100, noise_var=t([0.05, 0.1, 0.4]), **kw)
    by_users = exact_round(participation_prob=0.5, users=t([50, 100, 300]), noise_var=0.1, **kw)
    assert (torch.diff(by_noise.epsilon_central) < 0).all() and (torch.diff(by_noise.epsilon_local) < 0).all()
    assert (torch.diff(by_users.epsilon_central) < 0).all()


@settings(max_examples=10, deadline=None, derandomize=True)
@given(users=st.integers(20, 300), p=st.floats(0.2, 1.0), sigma2=st.sampled_from([0.05, 0.2, 1.0, 5.0, 50.0]),
       n0=st.sampled_from([0.0, 1.0]), dim=st.sampled_from([1, 30, 7850]))
@example(users=200, p=0.5, sigma2=0.1, n0=0.0, dim=7850)  # the paper's preset
@example(users=300, p=0.3, sigma2=5.0, n0=0.0, dim=7850)  # paper's classic step valid here
@example(users=42, p=0.5, sigma2=50.0, n0=0.0, dim=7850)  # here the others' count alone (eq. 1) loses
def test_exact_central_never_exceeds_tight_nor_a_valid_paper(users, p, sigma2, n0, dim):
    """A check, not a theorem: ``tight`` and ``exact`` bound the same round differently.

    With eq. (1) alone (revealing the others' count n) ``exact`` was above ``tight`` at
    small eps with much noise in high dimension (K = 42, sigma^2 = 50, d = 7850: 0.192
    vs 0.185): n makes the norm informative. Eq. (5) (revealing the total count) fixes it.
    """
    kw = dict(participation_prob=p, users=users, noise_var=sigma2, alignment_gain=1.0, n0=n0, sensitivity=2.0,
              delta_l=1e-5)
    ex, ti, pa = exact_round(dim=dim, **kw), tight_round(**kw), paper_round(**kw)
    assert float(ex.delta_central) <= float(ti.delta_central)  # at the same or a smaller delta
    # 1e-8: the eps solver stops within 1e-9 relative and returns its bracket's upper end
    # (at p = 1 both are the same Gaussian mechanism).
    assert float(ex.epsilon_central) <= float(ti.epsilon_central) * (1 + 1e-8)
    if bool(pa.classic_valid):
        assert float(ex.epsilon_central) <= float(pa.epsilon_central) * (1 + 1e-8)
    if (users, p, sigma2) == (300, 0.3, 5.0):
        assert bool(pa.classic_valid)  # the example above does exercise the paper branch


def test_heterogeneous_users_each_stay_below_the_round_bound():
    # Two noise groups and distinct p's: the round's eps (groups charged their largest p
    # and the smallest law of the others) bounds every single user's own exact eps. Every
    # user's others add unequal noise (0.2 and 1.0), so eq. (5) is out for all of them.
    K = 16
    p = torch.linspace(0.4, 0.8, K, dtype=F64)
    s2 = torch.full((K,), 0.2, dtype=F64)
    s2[:5] = 1.0
    kw = dict(alignment_gain=1.0, n0=1.0, sensitivity=2.0, delta_l=1e-5, dim=50)
    round_eps = float(exact_round(participation_prob=p[None], noise_var=s2[None], **kw).epsilon_central)
    assert math.isfinite(round_eps)
    for j in (0, 4, 5, 15):  # each group's first and last user
        others = torch.cat([p[:j], p[j + 1:]])[None]
        spec = RoundSpec(participation_prob=t([p[j]]), own_noise_var=t([s2[j]]), others_noise_var=t([0.2]),
                         channel_noise_var=t([1.0]), half_sensitivity=t([1.0]),
                         law=poisson_binomial_count_law(others, tail_mass=1e-12), dim=50,
                         total_ok=torch.tensor([False]))
        assert float(round_epsilon(1e-5, spec)) <= round_eps * (1 + 1e-9)


def test_composition_of_gaussian_rounds_matches_the_closed_form_from_above():
    # d = 1, p = 1, one user: T rounds of N(+-1, 4) compose to sensitivity 2 sqrt(T).
    f = RoundFacts(participation_prob=t([1.0]), noise_var=t([4.0]), alignment_gain=1.0, n0=0.0,
                   sensitivity=2.0, dim=1, participants=1)
    for T in (1, 25):
        got = compose_exact(f, delta_target=1e-5, rounds=T)["epsilon"]
        ref = balle_wang_epsilon(1e-5, 2.0 * math.sqrt(T), 2.0)
        assert ref * (1 - 1e-9) <= got <= ref * 1.005


def test_bad_input_raises_a_one_line_error():
    good = dict(participation_prob=0.5, users=10, noise_var=0.1, alignment_gain=1.0, n0=1.0, sensitivity=2.0,
                delta_l=1e-5, dim=10)
    for bad in (dict(participation_prob=-0.1), dict(delta_l=0.0), dict(dim=0), dict(users=0)):
        with pytest.raises(OtaflInputError):
            exact_round(**{**good, **bad})
    f = RoundFacts(participation_prob=t([1.0]), noise_var=t([4.0]), alignment_gain=1.0, n0=0.0, sensitivity=2.0,
                   dim=1, participants=1)
    with pytest.raises(OtaflInputError, match="kind"):
        compose_exact(f, delta_target=1e-5, kind="global")
    with pytest.raises(OtaflInputError, match="delta_target"):
        compose_exact(f, delta_target=1.5)
