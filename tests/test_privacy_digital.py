"""The digital accountants against independent numerical references (docs/privacy/digital.md#digital)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import binom, skellam

from otafl.privacy.accountants.digital_run import account_digital_run, mechanism_rdp
from otafl.privacy.analysis.distributed import (
    DIGITAL_ORDERS,
    gaussian_conditional_epsilon,
    gaussian_round_pld,
    others_count_law,
    participant_window,
    rdp_to_epsilon,
)
from otafl.privacy.analysis.ddg import ddg_rdp, ddg_tau
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon
from otafl.privacy.analysis.pbm import pbm_log_h, pbm_rdp
from otafl.privacy.analysis.skellam import rounded_norm_bound, skellam_rdp
from otafl.privacy.facts import DigitalMechanism, RoundFacts

F64 = torch.float64


def renyi(log_p: np.ndarray, log_q: np.ndarray, alpha: int) -> float:
    """D_alpha(P || Q) = log sum P^alpha Q^(1 - alpha) / (alpha - 1), from log pmfs (the two
    laws share their support; points where either underflows carry no mass)."""
    keep = np.isfinite(log_p) & np.isfinite(log_q)
    return float(logsumexp(alpha * log_p[keep] + (1 - alpha) * log_q[keep]) / (alpha - 1))


@pytest.mark.parametrize("variance", [2.0, 10.0, 50.0])
@pytest.mark.parametrize("shift", [[1], [3], [1, 1, 1, 1], [2, 1], [5, -2, 1]])
def test_skellam_bound_is_above_the_exact_renyi_divergence_of_shifted_skellam_laws(variance, shift):
    """Exact D_alpha of Sk(V) + v vs Sk(V) by scipy.stats.skellam (sum over coordinates)."""
    x = np.arange(-200, 201)  # +-28 standard deviations at V = 50
    log_q = skellam.logpmf(x, variance / 2, variance / 2)
    orders = [2, 3, 4, 8, 16, 32]
    v = np.asarray(shift)
    bound = skellam_rdp(orders=orders, l2_sensitivity=float(np.linalg.norm(v)), l1_sensitivity=float(np.abs(v).sum()),
                        variance=variance)
    for i, a in enumerate(orders):
        exact = sum(renyi(skellam.logpmf(x - vj, variance / 2, variance / 2), log_q, a) for vj in v)
        assert exact <= float(bound[i]) * (1 + 1e-9), (a, exact, float(bound[i]))
    # the bound is a close one: its Gaussian part alone is already within 2x of the truth at alpha = 2
    exact2 = sum(renyi(skellam.logpmf(x - vj, variance / 2, variance / 2), log_q, 2) for vj in v)
    assert float(bound[0]) <= 2.5 * exact2 + 1.0


def _pb_log_pmf(coins) -> np.ndarray:
    out = np.array([1.0])
    for m, p in coins:
        out = np.convolve(out, binom.pmf(np.arange(m + 1), m, p))
    with np.errstate(divide="ignore"):
        return np.log(out)


@pytest.mark.parametrize("theta", [0.05, 0.25, 0.4])
@pytest.mark.parametrize("trials,participants", [(1, 1), (1, 4), (3, 2), (2, 8), (1, 30)])
def test_pbm_bound_is_above_the_exact_renyi_divergence_of_poisson_binomial_laws(theta, trials, participants):
    """Exact D_alpha of the summed counts by convolving Binomial pmfs: user k's p moves by up to
    2 theta, the others' p at the ends and the middle of [1/2 - theta, 1/2 + theta]."""
    orders = [2, 3, 4, 8, 16, 32]
    others_cases = [[0.5 - theta] * (participants - 1), [0.5 + theta] * (participants - 1),
                    [0.5] * (participants - 1), [0.5 + theta * (-1) ** i for i in range(participants - 1)]]
    worst = 0.0
    for (u, v) in [(0.5 + theta, 0.5 - theta), (0.5 + theta, 0.5), (0.5, 0.5 - theta / 3)]:
        delta = abs(u - v)
        # one coordinate carrying the whole shift: ||x - x'|| / c = delta / theta
        bound = pbm_rdp(orders=orders, participants=[participants], trials=trials, theta=theta,
                        sensitivity=delta / theta, box=1.0)[0]
        for others in others_cases:
            coins = [(trials, q) for q in others]
            log_p, log_q = _pb_log_pmf([(trials, u)] + coins), _pb_log_pmf([(trials, v)] + coins)
            for i, a in enumerate(orders):
                exact = renyi(log_p, log_q, a)
                assert exact <= float(bound[i]), (a, u, v, others, exact, float(bound[i]))
                worst = max(worst, exact / float(bound[i]))
    assert worst > 0.2  # the reference is not trivially far below


def test_pbm_bound_covers_two_coordinates_sharing_the_shift():
    theta, trials, n = 0.25, 2, 3
    others = [(trials, 0.5 - theta)] * (n - 1)
    u, v = [0.5 + theta, 0.5 + theta / 2], [0.5 - theta / 2, 0.5 - theta]
    delta = np.abs(np.subtract(u, v))
    bound = pbm_rdp(orders=[2, 4, 8], participants=[n], trials=trials, theta=theta,
                    sensitivity=float(np.linalg.norm(delta)) / theta, box=1.0)[0]
    for i, a in enumerate([2, 4, 8]):
        exact = sum(renyi(_pb_log_pmf([(trials, uj)] + others), _pb_log_pmf([(trials, vj)] + others), a)
                    for uj, vj in zip(u, v))
        assert exact <= float(bound[i])


def test_pbm_noise_moments_fall_with_the_number_of_fair_coins():
    """Step 3 of the PBM bound uses H_l(M) non-increasing in M (beyond the cap it reuses H_l(cap))."""
    for theta in (0.05, 0.25, 0.45):
        h = pbm_log_h(theta, 300, 64)[:, 2:]
        assert bool((h[1:] <= h[:-1] + 1e-12).all())


def _noise_moment_sums(M: int, v: np.ndarray, orders: np.ndarray, q_of_v=None) -> np.ndarray:
    """log sum_x |b(x-1) - b(x)|^l / Q(x)^(l-1) in plain float64 (pmfs by scipy.stats.binom,
    differences by subtraction), Q = Q_v = v b(x-1) + (1 - v) b(x) unless q_of_v gives it; [V, L]."""
    b = np.concatenate([binom.pmf(np.arange(M + 1), M, 0.5), [0.0]])
    b_prev = np.concatenate([[0.0], b[:-1]])
    d = np.abs(b_prev - b)
    q = v[:, None] * b_prev + (1 - v[:, None]) * b if q_of_v is None else q_of_v(b_prev, b)
    ratio = d / q  # <= 1 / min(v, 1 - v): no overflow at orders <= 64
    return np.log((d[:, None] * ratio[..., None] ** (orders - 1)).sum(axis=1))


@pytest.mark.parametrize("theta", [0.02, 0.1, 0.25, 0.45])
def test_pbm_noise_moment_is_the_exact_sup_over_the_p_interval(theta):
    """H_l(M) of step 3 is the sup over v in [1/2 - theta, 1/2 + theta] (brute force on a 401-point
    grid, float64, its ends included) and equals the sum at v = 1/2 - theta; log tolerance 1e-9."""
    orders = np.arange(2, 65, dtype=np.float64)
    log_h = pbm_log_h(theta, 40, 64).numpy()[:, 2:]
    v = np.linspace(0.5 - theta, 0.5 + theta, 401)
    for M in (0, 1, 2, 7, 20, 40):
        grid = _noise_moment_sums(M, v, orders)
        assert bool((log_h[M] >= grid.max(axis=0) - 1e-9).all()), M
        np.testing.assert_allclose(log_h[M], grid[0], rtol=0, atol=1e-9)
        np.testing.assert_allclose(grid[-1], grid[0], rtol=0, atol=1e-9)  # f(v) = f(1 - v)


@pytest.mark.parametrize("theta", [0.02, 0.25, 0.45])
def test_pbm_noise_moment_is_below_the_former_16_interval_bound(theta):
    """The former kernel bounded the sup on 16 v-intervals of [1/2 - theta, 1/2] by the per-x
    minimum of Q at each interval's ends (recomputed here in plain float64): the exact sup is
    never above it (log tolerance 1e-9) and below it somewhere by more than 1e-3."""
    orders = np.arange(2, 65, dtype=np.float64)
    log_h = pbm_log_h(theta, 150, 64).numpy()[:, 2:]
    ends = np.linspace(0.5 - theta, 0.5, 17)
    gap = 0.0
    for M in (0, 1, 5, 30, 80, 150):
        former = np.max([_noise_moment_sums(M, None, orders, lambda bp, b: np.minimum(
            va * bp + (1 - va) * b, vb * bp + (1 - vb) * b)[None]) for va, vb in zip(ends[:-1], ends[1:])], axis=0)[0]
        assert bool((log_h[M] <= former + 1e-9).all()), M
        gap = max(gap, float((former - log_h[M]).max()))
    assert gap > 1e-3


def test_the_gaussian_accountant_is_the_analytic_gaussian_mechanism_with_the_summed_variance():
    K, sigma2, delta = 50, 0.3, 1e-5
    facts = [RoundFacts(participation_prob=torch.ones(K, dtype=F64), noise_var=torch.full((K,), sigma2, dtype=F64),
                        alignment_gain=math.inf, n0=0.0, sensitivity=2.0, dim=10, participants=K,
                        digital=DigitalMechanism("gaussian", noise_var=sigma2, coordinates=10))]
    res = account_digital_run(facts, delta_l=delta, delta_total=delta)
    summed = float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(K * sigma2), delta=delta))
    own = float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(sigma2), delta=delta))
    assert res.epsilon_central == pytest.approx(summed, rel=1e-9)
    assert res.epsilon_local_max == pytest.approx(own, rel=1e-9)
    # one round composed by the (pessimistic) PLD: at or just above the analytic value
    assert summed <= res.epsilon_central_total <= summed * 1.005
    assert res.composition_central == "pld"


def test_conditioning_on_the_count_law_lies_between_its_extremes():
    p_max, pmf = others_count_law(torch.full((40,), 0.5, dtype=F64))
    n, w, _ = participant_window(pmf)
    s = torch.sqrt(n.to(F64) * 0.2)
    eps = gaussian_conditional_epsilon(weights=w, noise_std=s, sensitivity=2.0, delta=1e-5)
    lo = float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(40 * 0.2), delta=1e-5))
    hi = float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(0.2), delta=1e-5))
    assert p_max == 0.5 and lo < eps < hi
    # non-uniform p: the worst user's others drop one maximal p
    p_max, pmf = others_count_law(torch.tensor([0.9, 0.1, 0.1], dtype=F64))
    assert p_max == 0.9 and torch.allclose(pmf, torch.tensor([0.81, 0.18, 0.01], dtype=F64))
    # the mixture PLD of one round with p = 1 and one count is the Gaussian mechanism
    pld = gaussian_round_pld(participation_prob=1.0, weights=[1.0], noise_std=[3.0], sensitivity=2.0)
    assert pld.get_epsilon_for_delta(1e-5) == pytest.approx(
        float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=3.0, delta=1e-5)), rel=1e-3)


def test_renyi_conversion_matches_opacus():
    from opacus.accountants.analysis.rdp import get_privacy_spent

    orders = list(range(2, 40))
    rdp = torch.tensor([a * 0.05 for a in orders], dtype=F64)
    eps, order = rdp_to_epsilon(rdp, orders, 1e-5)
    ref, ref_order = get_privacy_spent(orders=orders, rdp=rdp.numpy(), delta=1e-5)
    assert eps == pytest.approx(float(ref), rel=1e-12) and order == ref_order


@pytest.mark.parametrize("name", ["skellam", "ddg", "pbm"])
def test_digital_run_totals_grow_with_rounds_and_fall_with_noise(name):
    K = 40

    def run(T, **mech):
        facts = [RoundFacts(participation_prob=torch.full((K,), 0.5, dtype=F64), noise_var=torch.zeros(K, dtype=F64),
                            alignment_gain=math.inf, n0=0.0, sensitivity=2.0, dim=64, participants=20,
                            digital=DigitalMechanism(name, coordinates=64, **mech)) for _ in range(T)]
        return account_digital_run(facts, delta_l=1e-5)

    if name in ("skellam", "ddg"):
        weak, strong = dict(noise_var=0.5, scale=100.0), dict(noise_var=2.0, scale=100.0)
    else:
        weak, strong = dict(box=0.5, theta=0.2, trials=4), dict(box=0.5, theta=0.1, trials=4)
    one, ten = run(1, **weak), run(10, **weak)
    assert 0 < one.epsilon_central_total < ten.epsilon_central_total < 10 * one.epsilon_central_total
    assert run(10, **strong).epsilon_central_total < ten.epsilon_central_total
    assert one.epsilon_local_max > one.epsilon_central  # one share protects less than the sum
    assert one.composition_central == "rdp" and one.defined


def test_the_rounding_norm_bounds_hold():
    gen = torch.Generator().manual_seed(0)  # seed 0; 2000 rounded vectors
    D, c = 256, 20.0
    x = torch.randn(D, dtype=F64, generator=gen)
    x = x / x.norm() * c
    low = torch.floor(x)
    draws = low + (torch.rand(2000, D, generator=gen, dtype=F64) < (x - low)).to(F64)
    norms = draws.norm(dim=1)
    assert float(norms.max()) <= rounded_norm_bound(norm=c, dim=D)  # deterministic
    assert float(norms.max()) <= rounded_norm_bound(norm=c, dim=D, beta=1e-3)  # fails w.p. <= 1e-3 each
    assert rounded_norm_bound(norm=c, dim=D, beta=1e-3) < rounded_norm_bound(norm=c, dim=D)


def test_mechanism_rdp_skellam_approaches_the_gaussian_with_fine_quantisation():
    n = torch.tensor([10])
    gauss = mechanism_rdp(DigitalMechanism("gaussian", noise_var=1.0), n, sensitivity=2.0)
    fine = mechanism_rdp(DigitalMechanism("skellam", noise_var=1.0, scale=1e4, coordinates=64), n, sensitivity=2.0)
    assert torch.allclose(fine, gauss, rtol=0.02)
    assert bool((fine >= gauss).all())


def _log_dg(x: np.ndarray, sigma2: float) -> np.ndarray:
    """log pmf of N_Z(0, sigma2) at integers x (normaliser over |y| <= 60 sigma + 60: the rest
    weighs below e^-1800 relative, far below float64 resolution)."""
    half = int(60 * math.sqrt(sigma2) + 60)
    y = np.arange(-half, half + 1, dtype=np.float64)
    return -x.astype(np.float64) ** 2 / (2 * sigma2) - logsumexp(-y * y / (2 * sigma2))


def _log_conv(la: np.ndarray, lb: np.ndarray) -> np.ndarray:
    out = np.full(len(la) + len(lb) - 1, -np.inf)
    for i, v in enumerate(la):
        out[i:i + len(lb)] = np.logaddexp(out[i:i + len(lb)], v + lb)
    return out


def _ddg_exact_renyi_upper(shift: int, sigma2: float, n: int, alpha: int, M: int) -> float:
    """An upper bound, tight to float64, on D_alpha(Z_n + shift || Z_n), Z_n the sum of n
    i.i.d. N_Z(0, sigma2): the exact sum over share tuples with every share in [-M, M] (log-
    domain convolution of the truncated pmfs, share 1 shifted under P), plus the tuples with
    a share outside, bounded by subadditivity of p^a q^(1-a) (jointly convex, homogeneous):
    share 1 contributes g(y - shift)^a g(y)^(1-a) = e^(a(a-1) shift^2 / (2 sigma2)) g(y - a shift),
    so the rest is at most e^(a(a-1) shift^2/(2 sigma2)) (T(M - a|shift|) + (n - 1) T(M)),
    T(m) = 2 e^(-m^2 / (2 sigma2)) / (1 - e^(-m / sigma2)) >= sum_{|y| > m} e^(-y^2/(2 sigma2))
    (the normaliser is >= 1, and a non-integer shift of the Gaussian weights does not
    increase their sum)."""
    x = np.arange(-M, M + 1)
    lg = _log_dg(x, sigma2)
    lq, lp = lg, _log_dg(x - shift, sigma2)
    for _ in range(n - 1):
        lq, lp = _log_conv(lq, lg), _log_conv(lp, lg)
    keep = np.isfinite(lp) & np.isfinite(lq)
    inner = logsumexp(alpha * lp[keep] + (1 - alpha) * lq[keep])

    def log_tail(m):
        return math.log(2) - m * m / (2 * sigma2) - math.log1p(-math.exp(-m / sigma2))

    rest = alpha * (alpha - 1) * shift ** 2 / (2 * sigma2) + np.logaddexp(
        log_tail(M - alpha * abs(shift)), math.log(max(n - 1, 1e-300)) + log_tail(M))
    return float(np.logaddexp(inner, rest)) / (alpha - 1)


@pytest.mark.parametrize("sigma2,n", [(s2, n) for s2 in (0.25, 1.0, 2.25, 9.0) for n in (1, 2, 3, 4)]
                         + [(0.25, 8), (1.0, 8)])
@pytest.mark.parametrize("shift", [[1], [3], [1, 1], [2, -1]])
def test_ddg_bound_is_above_the_exact_renyi_divergence_of_summed_discrete_gaussians(sigma2, n, shift):
    """d = 1 and 2, n = 1-4 and 8 shares of sigma 0.5-3, integer shifts: the accountant's
    eps_n(alpha) >= the exact D_alpha of the convolved pmfs (coordinates add), orders 2-16,
    up to float64 rounding (1e-9 relative; at sigma = 3 the two agree to 1e-13, the sum being a
    near-perfect Gaussian). Truncation at M = a |shift| + sqrt(a (a - 1)) |shift| + 40 sigma + 40
    (a = 16, the largest order) is accounted (see the helper; a smaller M only loosens it)."""
    orders = [2, 3, 4, 6, 8, 12, 16]
    v = np.asarray(shift)
    a_max, v_max = max(orders), int(np.abs(v).max())
    M = int(math.ceil(a_max * v_max + math.sqrt(a_max * (a_max - 1)) * v_max + 40 * math.sqrt(sigma2) + 40))
    bound = ddg_rdp(orders=orders, l2_sensitivity=float(np.linalg.norm(v)), l1_sensitivity=float(np.abs(v).sum()),
                    sigma2=sigma2, participants=[n], dim=len(v))[0]
    for i, a in enumerate(orders):
        exact = sum(_ddg_exact_renyi_upper(int(vj), sigma2, n, a, M) for vj in v)
        assert exact <= float(bound[i]) * (1 + 1e-9), (a, exact, float(bound[i]))
    if n == 1:  # one discrete Gaussian: the continuous Gaussian's alpha Delta^2 / (2 sigma^2), exactly
        assert float(bound[0]) == pytest.approx(float((v ** 2).sum()) / sigma2, rel=1e-12)


def test_the_ddg_sum_term_is_needed_and_covers_the_excess_over_the_gaussian():
    """At sigma = 1/2 the sum of two discrete Gaussians leaks more than a Gaussian of variance
    2 sigma^2 would (the tau term is not slack), and the bound covers it."""
    exact = _ddg_exact_renyi_upper(1, 0.25, 2, 16, 250)
    gauss = 16 * 1 / (2 * 2 * 0.25)
    assert exact > gauss + 0.2
    tau = float(ddg_tau([2], 0.25)[0])
    assert tau == pytest.approx(10 * math.exp(-2 * math.pi ** 2 * 0.25 / 2))
    assert exact <= gauss + tau


def test_ddg_per_round_epsilon_is_close_to_skellams_at_the_same_variance():
    """Large n sigma^2 (integer units): both approach the Gaussian of the same rounded
    sensitivity, so the DDG epsilon is within 10 % of Skellam's and not above it (their gap over
    the continuous Gaussian is the rounding's sqrt(D) / s inflation of Delta, shared by both)."""
    n = torch.tensor([10, 100])
    for noise_var, scale, D in [(0.1, 300.0, 1024), (1.0, 1000.0, 8192), (0.05, 100.0, 64)]:
        eps = {}
        for name in ("ddg", "skellam"):
            mech = DigitalMechanism(name, noise_var=noise_var, scale=scale, coordinates=D)
            rdp = mechanism_rdp(mech, n, sensitivity=2.0)
            eps[name] = [rdp_to_epsilon(rdp[i], list(range(2, 33)) + [40, 48, 56, 64], 1e-5)[0] for i in range(2)]
        for i in range(2):
            assert 0.9 * eps["skellam"][i] <= eps["ddg"][i] <= eps["skellam"][i] * (1 + 1e-6), eps
    # local DP (n = 1) of a single discrete Gaussian share: the rounded-vector Gaussian formula
    mech = DigitalMechanism("ddg", noise_var=0.1, scale=300.0, coordinates=1024)
    d2 = 2.0 * rounded_norm_bound(norm=300.0, dim=1024)
    one = mechanism_rdp(mech, torch.tensor([1]), sensitivity=2.0)[0]
    assert torch.allclose(one, torch.tensor([a * d2 ** 2 / (2 * 0.1 * 300.0 ** 2) for a in DIGITAL_ORDERS],
                                            dtype=F64), rtol=1e-12)


def test_bound_digital_credits_no_receiver_noise_whatever_n0():
    # Secure aggregation over orthogonal access decodes the sum exactly: with p = 1 the round is
    # the Gaussian mechanism of the K shares' noise alone (Balle & Wang, solved here with scipy).
    from scipy.optimize import brentq
    from scipy.stats import norm

    from otafl.api.bound import bound_grid

    K, s2 = 20, 0.1
    rows = [bound_grid(users=[K], p=[1.0], sigma2=[s2], clip=[1.0], snr_db=[0.0], accountants=["digital"],
                       n0=n0, delta_prime=1e-6)["rows"][0] for n0 in (0.0, 1.0, 100.0)]
    std = math.sqrt(K * s2)

    def delta(e):
        return norm.cdf(1 / std - e * std / 2) - math.exp(e) * norm.cdf(-1 / std - e * std / 2)

    ref = brentq(lambda e: delta(e) - 1e-5, 0.0, 100.0, xtol=1e-13)
    for r in rows:
        assert r["channel_noise_var"] == 0.0
        assert r["epsilon_central"] == pytest.approx(ref, rel=1e-8)
        assert r["epsilon_local"] == rows[0]["epsilon_local"]
