"""The faster accounting paths (issue 31) against the implementations they replaced.

Seeded random inputs; tolerances stated per test. Every faster path must keep the bounds
upper bounds: the compacted root finder stays inside the reference's bracket, the
rounded ``exact`` totals are never below the unrounded ones.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from otafl.privacy.accountants import exact_run as engine
from otafl.privacy.analysis import cells, pld
from otafl.privacy.analysis.mixture import mixture_hockey_stick
from otafl.privacy.analysis.mixture_reference import mixture_hockey_stick_reference
from otafl.privacy.facts import RoundFacts

REL = 1e-9  # rounding-level agreement of two evaluations of the same bound


def _mixture_inputs(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    r = lambda: torch.rand(n, generator=g, dtype=torch.float64)  # noqa: E731
    nrm = lambda: torch.randn(n, generator=g, dtype=torch.float64)  # noqa: E731
    eps = 5 * r()
    eps[:20] = 0.0
    lam = 8 * nrm()
    lam[20:40] = math.inf
    w = torch.exp(2 * nrm())
    W = w + torch.exp(2 * nrm())
    W[40:80] = w[40:80]
    return dict(eps=eps, log_odds=lam, absent_var=w, present_var=W, half_sensitivity=torch.exp(nrm()))


def test_compacted_mixture_stays_in_the_reference_bracket():
    """mixture_hockey_stick's upper bound lies in the reference's [lower, upper] (1e-9 relative
    below, 1e-6 relative or 1e-20 absolute above: where h is below ~1e-20 the root's bracket
    slack, a relative 1e-8 of such values, is what differs), and equals it there otherwise."""
    x = _mixture_inputs(4000, 0)
    eps = x.pop("eps")
    u0, l0 = mixture_hockey_stick_reference(eps, **x)
    u, lo = mixture_hockey_stick(eps, **x)
    assert bool((u <= u0 * (1 + 1e-6) + 1e-20).all())
    assert bool((u >= l0 * (1 - REL)).all())
    assert bool((lo <= u * (1 + REL) + 1e-300).all())
    tight = (u0 - l0) <= REL * u0
    assert bool(torch.allclose(u[tight], u0[tight], rtol=1e-6, atol=1e-20))


def test_equal_variance_closed_form_root_stays_in_the_reference_bracket():
    """Where w = W the certified closed-form root replaces the iteration: its upper bound lies
    in the reference's [lower, upper] (1e-9 relative below, 1e-6 relative or 1e-20 absolute
    above, as for the compacted iteration), and agrees with the iteration (quick=False) to
    1e-8 relative where the bound is above 1e-12 (seed 5, 20,000 random elements)."""
    g = torch.Generator().manual_seed(5)
    n = 20000
    r = lambda: torch.rand(n, generator=g, dtype=torch.float64)  # noqa: E731
    nrm = lambda: torch.randn(n, generator=g, dtype=torch.float64)  # noqa: E731
    eps, lam, W, a = 5 * r(), 8 * nrm(), torch.exp(2 * nrm()), torch.exp(nrm())
    eps[:20] = 0.0
    x = dict(log_odds=lam, absent_var=W, present_var=W, half_sensitivity=a)
    u0, l0 = mixture_hockey_stick_reference(eps, **x)
    u, lo = mixture_hockey_stick(eps, **x)
    slow, _ = mixture_hockey_stick(eps, quick=False, **x)
    assert bool((u <= u0 * (1 + 1e-6) + 1e-20).all()) and bool((u >= l0 * (1 - REL)).all())
    assert bool((lo <= u * (1 + REL) + 1e-300).all())
    big = slow > 1e-12
    assert bool(big.sum() > n // 4) and bool(torch.allclose(u[big], slow[big], rtol=1e-8, atol=0))


def test_equal_noise_total_terms_on_broadcast_shapes_match_the_element_by_element_path(monkeypatch):
    """Eq. (5)'s terms with equal noises computed on the broadcast shapes ([R, E, 1] eps, [R, 1, M]
    counts) equal conditional_delta's element by element (1e-12 relative), the counts at
    pi_m in {0, 1} and eps = 0 included (seed 7: 40 random rows, 50 eps, K = 60)."""
    from otafl.privacy.analysis import ota_round
    from otafl.privacy.facts import uniform_facts

    rng = np.random.default_rng(7)
    facts = [uniform_facts(60, float(rng.uniform(0.05, 0.95)), float(rng.uniform(0.01, 1.0)),
                           float(rng.uniform(0.2, 2.0)), float(rng.uniform(0.0, 5.0)), 2.0, 500) for _ in range(40)]
    keys = list(dict.fromkeys(k for ks in engine.run_row_keys(facts, "central") for k in ks))
    spec = engine._spec(keys, 1e-15)
    eps = torch.tensor(np.concatenate([[0.0], rng.uniform(0.0, 12.0, 48), [40.0]])).expand(len(keys), 50)
    calls = []
    fast_fn = ota_round.equal_noise_upper
    monkeypatch.setattr(ota_round, "equal_noise_upper", lambda *a: calls.append(1) or fast_fn(*a))
    fast, _ = ota_round.round_delta(eps, spec, conditioning="total", lower=False)
    assert calls  # the broadcast path was taken

    def element_by_element(e, share, w, a, dim):
        return cells.conditional_delta(e, participation_prob=share, absent_var=w, own_noise_var=torch.zeros_like(w),
                                       half_sensitivity=a, dim=dim, lower=False)[0]

    monkeypatch.setattr(ota_round, "equal_noise_upper", element_by_element)
    slow, _ = ota_round.round_delta(eps, spec, conditioning="total", lower=False)
    assert bool((slow > 0).any()) and bool((slow < 1e-6).any())
    assert torch.allclose(fast, slow, rtol=1e-12, atol=0.0)


def test_convex_envelope_matches_the_scan():
    """The vectorised envelope equals the monotone-chain scan (1e-15 absolute)."""
    rng = np.random.default_rng(1)
    for n in (2, 3, 5, 64, 513):
        for _ in range(20):
            x = np.cumsum(rng.random(n) + 1e-3)
            y = np.minimum.accumulate(rng.random(n)) if rng.random() < 0.5 else np.exp(-x) + 1e-3 * rng.random(n)
            assert np.allclose(pld.lower_convex_envelope(x, y), pld._lower_convex_envelope_scan(x, y),
                               rtol=0.0, atol=1e-15)


def test_a_profile_falling_to_zero_composes_without_negative_deltas():
    """A profile that falls by ~1e-12 per grid point reaches 0 through denormals, and
    interpolating towards the zero vertex rounded to -5e-324, which dp_accounting refused
    ("deltas are not between 0 and 1": the CI failure of the Table II(b) p = 0.5 run)."""
    gap, i = 0.04005, np.arange(45)
    pos = 0.93 * np.exp(-27.55 * i)
    assert pld.lower_convex_envelope(np.exp(gap * i), pos).min() >= 0.0
    eps = pld.compose_profiles([(pos, 3)], gap=gap, delta_target=1e-5)
    assert 0.0 < eps < 3 * gap * 45  # finite, and below the grid's reach over three rounds


def test_integer_order_rdp_matches_opacus():
    """The array form of the sampled Gaussian's RDP equals Opacus' loop (1e-9 relative, or
    1e-15 absolute for values near 0, where both are rounding noise)."""
    from otafl.privacy.analysis.rdp import RDP_ORDERS, _opacus_rdp, sgm_rdp_integer_orders

    rng = np.random.default_rng(2)
    for _ in range(40):
        q = float(rng.choice([rng.random(), 1e-4 * rng.random(), 1 - 1e-6, 1.0]))
        z = float(np.exp(rng.normal(0.0, 1.2)))
        ours = sgm_rdp_integer_orders(q, z, RDP_ORDERS)
        ref = np.asarray(_opacus_rdp().compute_rdp(q=q, noise_multiplier=z, steps=1, orders=list(RDP_ORDERS)))
        assert np.allclose(ours, ref, rtol=REL, atol=1e-15)


def test_dense_composition_matches_dp_accounting():
    """compose_dense_counted (vectorised truncation) states dp_accounting's epsilon (1e-9)."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    from otafl.privacy.analysis.gaussian import gaussian_hockey_stick

    gap, points = 0.01, 300
    e = gap * np.arange(points + 1)

    def pld_of(std):
        pos = gaussian_hockey_stick(epsilon=torch.tensor(e), sensitivity=torch.tensor(1.0),
                                    noise_std=torch.tensor(std)).numpy()
        neg = 1.0 - np.exp(-e) + np.exp(-e) * pos
        deltas = np.minimum.accumulate(np.concatenate([neg[::-1], pos[1:]]))
        return PrivacyLossDistribution(pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
            gap, -points, points, deltas))

    items = [(pld_of(s), c) for s, c in ((3.0, 5), (4.5, 1), (6.0, 17), (2.5, 2))]
    ours = pld.epsilon_for_delta(pld.compose_dense_counted(items), 1e-6)
    ref = pld.epsilon_for_delta(pld.compose_counted(items), 1e-6)
    assert ours == pytest.approx(ref, rel=REL)
    # 40 distinct rounds (a channel-aware run's kind): groups of GROUP composed by one batched
    # FFT each, then the groups' results, against dp_accounting's one-by-one composition.
    from otafl.privacy.analysis import pld_dense

    many = [(pld_of(s), 1) for s in np.linspace(4.0, 9.0, 40)]
    assert len(many) > 2 * pld_dense.GROUP
    ours = pld.epsilon_for_delta(pld.compose_dense_counted(many), 1e-6)
    ref = pld.epsilon_for_delta(pld.compose_counted(many), 1e-6)
    assert ours == pytest.approx(ref, rel=1e-7)


def _random_facts(seed: int, rounds: int = 4, users: int = 3, dim: int = 30) -> list[RoundFacts]:
    rng = np.random.default_rng(seed)
    p = torch.tensor(rng.uniform(0.2, 0.8, users), dtype=torch.float64)
    s2 = torch.tensor(rng.choice([0.1, 0.2], users), dtype=torch.float64)
    gains = 0.5 * (1.0 + np.sqrt(rng.exponential(size=rounds)))
    return [RoundFacts(participation_prob=p, noise_var=s2, alignment_gain=float(c), n0=1.0, sensitivity=2.0,
                       dim=dim, participants=0) for c in gains]


def _reference_total(monkeypatch, keys, delta):
    """compose_exact_rounds with the replaced pieces: the reference root finder, dp_accounting's
    composition, the scan envelope, eq. (1) at every point."""
    with monkeypatch.context() as m:
        m.setattr(cells, "mixture_hockey_stick", mixture_hockey_stick_reference)
        m.setattr(pld, "compose_dense_counted", lambda plds, *a, **k: pld.compose_counted(plds))
        m.setattr(pld, "lower_convex_envelope", pld._lower_convex_envelope_scan)
        engine.clear_caches()
        return engine.compose_exact_rounds(keys, delta_target=delta, others_stride=1)["epsilon"]


@pytest.mark.parametrize("kind", ["central", "local"])
def test_fast_exact_total_against_the_previous_implementation(monkeypatch, kind):
    """Random heterogeneous fading facts: the fast total is at least the previous
    implementation's (1e-9) and at most 0.5 % above it (issue 31's tolerance)."""
    facts = _random_facts(3)
    keys = engine.run_row_keys(facts, kind)
    ref = _reference_total(monkeypatch, keys, 1e-5)
    engine.clear_caches()
    fast = engine.compose_exact_rounds(keys, delta_target=1e-5)["epsilon"]
    assert math.isfinite(ref) and ref > 0
    assert ref * (1 - REL) <= fast <= ref * 1.005


@pytest.mark.parametrize("kind", ["central", "local"])
def test_rounded_total_is_at_least_the_unrounded_one(kind):
    """Rounding to the leakier side (the channel noise down, a local row's p up) only raises the
    total: at least the unrounded total (1e-9), and within 1 % of it (the grids' own cost on
    these few, widely varied rounds)."""
    facts = _random_facts(4)
    engine.clear_caches()
    exact = engine.compose_exact_rounds(engine.run_row_keys(facts, kind, engine.NO_ROUNDING), delta_target=1e-5,
                                        others_stride=1)
    engine.clear_caches()
    rounded = engine.compose_exact_rounds(engine.run_row_keys(facts, kind), delta_target=1e-5)
    assert rounded["distinct_rows"] <= exact["distinct_rows"]
    assert exact["epsilon"] * (1 - REL) <= rounded["epsilon"] <= exact["epsilon"] * 1.01


def test_round_pmfs_of_all_rows_at_once_equal_each_rows_own_connect_the_dots_pmf():
    """pld_dense.round_pmfs (every round's profile at once: running minimum, convex envelope,
    connect-the-dots masses, tails cut) equals the one-row path it replaced (lower_convex_envelope,
    connect_dots_pmf, _trim) on 60 random profiles (seed 17: convex ones, kinked minima of two,
    a NaN, values off [0, 1] by a little): the same loss range and infinite mass, masses within
    1e-15 absolute."""
    from otafl.privacy.analysis import pld_dense

    rng = np.random.default_rng(17)
    points, gap = 80, 0.05
    e = gap * np.arange(points + 1)
    rows = []
    for i in range(60):
        a, b = rng.uniform(0.5, 4.0, size=2)
        prof = np.exp(-a * e * e - rng.uniform(0, 2) * e)
        if i % 3 == 1:
            prof = np.minimum(prof, 0.5 * np.exp(-b * e))  # min of two: not convex
        if i % 7 == 2:
            prof[rng.integers(points)] = np.nan
        if i % 11 == 3:
            prof = prof * (1 + 1e-12)
        rows.append(prof)
    got = pld_dense.round_pmfs(np.stack(rows), gap, tail=1e-15)
    for prof, pmf in zip(rows, got):
        pos = np.minimum.accumulate(np.clip(np.nan_to_num(prof, nan=1.0), 0.0, 1.0))
        pos = pld.lower_convex_envelope(np.exp(e), pos)
        neg = 1.0 - np.exp(-e) + np.exp(-e) * pos
        one = pld_dense._trim(pld_dense.connect_dots_pmf(gap, points, np.clip(np.concatenate([neg[::-1], pos[1:]]), 0, 1)),
                              1e-15)
        assert pmf._lower_loss == one._lower_loss and len(pmf._probs) == len(one._probs)  # noqa: SLF001
        assert math.isclose(pmf._infinity_mass, one._infinity_mass, rel_tol=1e-12, abs_tol=1e-300)  # noqa: SLF001
        assert np.allclose(pmf._probs, one._probs, rtol=0, atol=1e-15)  # noqa: SLF001
