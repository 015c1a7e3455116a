"""Monte Carlo audit of a round: intervals against exact's bounds and closed forms.

Every statistical check uses a fixed seed and a 99.9% Clopper-Pearson interval, so a
correct implementation fails a check with probability <= 1e-3 per interval; the seeds
below are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import norm

from otafl.errors import OtaflInputError
from otafl.privacy.accountants import paper_round, tight_round
from otafl.privacy.audit import audit_round, clopper_pearson
from otafl.privacy.analysis.count_law import binomial_count_law, local_count_law
from otafl.privacy.analysis.ota_round import RoundSpec, round_delta

F64 = torch.float64


def one(v):
    return torch.tensor([float(v)], dtype=F64)


def central_spec(users, p, sigma2, n0_over_c2, dim, own=None):
    law = binomial_count_law(one(p), users - 1, tail_mass=1e-12)
    return RoundSpec(participation_prob=one(p), own_noise_var=one(sigma2 if own is None else own),
                     others_noise_var=one(sigma2), channel_noise_var=one(n0_over_c2), half_sensitivity=one(1.0),
                     law=law, dim=dim)


def test_clopper_pearson_matches_closed_forms_at_the_ends():
    lo, hi = clopper_pearson(torch.tensor([0, 1000]), 1000, confidence=0.95)
    assert float(lo[0]) == 0.0 and float(hi[0]) == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-9)
    assert float(hi[1]) == 1.0 and float(lo[1]) == pytest.approx(0.025 ** (1 / 1000), rel=1e-9)


def test_single_user_d1_audit_matches_the_gaussian_mechanism():
    spec = RoundSpec(participation_prob=one(1.0), own_noise_var=one(1.0), others_noise_var=one(0.0),
                     channel_noise_var=one(0.0), half_sensitivity=one(1.0), law=local_count_law(1), dim=1)
    eps = torch.tensor([0.0, 1.0, 2.0], dtype=F64)
    res = audit_round(spec, eps, samples=200_000, generator=torch.Generator().manual_seed(11), confidence=0.999)
    for e, lo, hi in zip(eps.tolist(), res.lower.tolist(), res.upper.tolist()):
        ref = norm.cdf(1 - e / 2) - math.exp(e) * norm.cdf(-1 - e / 2)  # Balle & Wang, Delta = 2, s = 1
        assert lo <= ref <= hi


@pytest.mark.parametrize("conditioning", ["others", "total"])
def test_revealed_count_audits_contain_the_matching_exact_bound(conditioning):
    # K = 10 (few counts), d = 20, heterogeneous own noise so that s matters in both.
    spec = central_spec(10, 0.3, 0.1, 0.5, dim=20, own=0.3)
    eps = torch.tensor([0.3, 0.6, 1.0], dtype=F64)
    up, lo = round_delta(eps[None], spec, conditioning=conditioning)
    res = audit_round(spec, eps, samples=200_000, generator=torch.Generator().manual_seed(5),
                      adversary=conditioning, confidence=0.999)
    for j in range(3):
        assert float(res.lower[j]) <= float(up[0, j]) and float(lo[0, j]) <= float(res.upper[j])


def test_the_hidden_adversary_never_beats_exact_and_paper_is_not_below_the_audit():
    # The paper's preset at p = 0.5 (N0 = 0): exact's delta at its own eps, paper's claim at its eps.
    spec = central_spec(200, 0.5, 0.1, 0.0, dim=7850)
    kw = dict(participation_prob=0.5, users=200, noise_var=0.1, alignment_gain=1.0, n0=0.0, sensitivity=2.0,
              delta_l=1e-5)
    paper = paper_round(**kw)
    eps = torch.tensor([0.6, 1.0, float(paper.epsilon_central)], dtype=F64)
    up, _ = round_delta(eps[None], spec)
    res = audit_round(spec, eps, samples=100_000, generator=torch.Generator().manual_seed(7),
                      adversary="hidden", confidence=0.999)
    assert bool((res.lower <= up[0]).all())
    assert float(paper.delta_central) >= float(res.lower[2])


def test_t_rounds_add_their_losses():
    # Two identical Gaussian rounds (d = 1, p = 1) compose to sensitivity 2 sqrt(2), s = 1.
    spec = RoundSpec(participation_prob=one(1.0), own_noise_var=one(1.0), others_noise_var=one(0.0),
                     channel_noise_var=one(0.0), half_sensitivity=one(1.0), law=local_count_law(1), dim=1)
    res = audit_round(spec, torch.tensor([1.0], dtype=F64), samples=200_000, rounds=2,
                      generator=torch.Generator().manual_seed(3), confidence=0.999)
    r = math.sqrt(2)
    ref = norm.cdf(r - 1 / (2 * r)) - math.e * norm.cdf(-r - 1 / (2 * r))
    assert float(res.lower[0]) <= ref <= float(res.upper[0])


def test_the_audit_is_reproducible_and_rejects_bad_input():
    spec = central_spec(20, 0.5, 0.1, 1.0, dim=5)
    a = audit_round(spec, [0.5], samples=5_000, generator=torch.Generator().manual_seed(1))
    b = audit_round(spec, [0.5], samples=5_000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.hits, b.hits) and torch.equal(a.delta, b.delta)
    gen = torch.Generator().manual_seed(0)
    for bad in (dict(samples=0), dict(adversary="oracle"), dict(confidence=1.0), dict(rounds=0)):
        with pytest.raises(OtaflInputError):
            audit_round(spec, [0.5], **{"samples": 10, "generator": gen, **bad})


def test_tight_ldp_holds_where_amplification_by_sampling_fails():
    # K = 50, sigma^2 = 0.5, N0/c^2 = 1, d = 20, Delta = 2, delta_l = 1e-2, p = 0.1. The server sees
    # N(0, N0/c^2) without user k and N(g_k, sigma^2 + N0/c^2) with it: the received energy tells
    # them apart, so eps amplified by p (log(1 + p (e^eps - 1))) understates the leakage. tight's
    # unamplified eps with delta p delta_l (joint convexity) holds.
    p, delta_l = 0.1, 1e-2
    tight = tight_round(participation_prob=p, users=50, noise_var=0.5, alignment_gain=1.0, n0=1.0,
                        sensitivity=2.0, delta_l=delta_l)
    amplified = math.log1p(p * math.expm1(float(tight.epsilon_local)))
    spec = RoundSpec(participation_prob=one(p), own_noise_var=one(0.5), others_noise_var=one(0.5),
                     channel_noise_var=one(1.0), half_sensitivity=one(1.0), law=local_count_law(1), dim=20)
    eps = torch.tensor([amplified, float(tight.epsilon_local)], dtype=F64)
    res = audit_round(spec, eps, samples=200_000, generator=torch.Generator().manual_seed(0), confidence=0.999)
    claimed = float(tight.delta_local)  # p delta_l = 1e-3
    assert float(res.lower[0]) > claimed  # the amplified claim is violated
    assert float(res.upper[1]) < claimed  # the sound one is not
    up, _ = round_delta(eps[None], spec)  # and exact agrees with the audit
    assert float(res.lower[0]) <= float(up[0, 0]) and float(up[0, 1]) <= claimed


@pytest.mark.parametrize("k,ch", [(0, 1.0), (4, 1.0), (19, 0.0)])
def test_the_hidden_losses_equal_the_branch_densities_summed_over_the_counts(k, ch):
    """The hidden adversary's loss, one log-sum-exp per branch of an outer product, against the
    per-count branch densities (Gaussian times scaled chi-square, constants included) mixed over
    n directly: equal within 1e-9 (absolute, nats) on seeded draws, an atom at n = 0 when N0 = 0."""
    from otafl.privacy.audit import _hidden_log_densities, _log_branch_densities

    gen = torch.Generator().manual_seed(k)
    n_vals = torch.arange(0, 12, dtype=F64)
    n_prob = torch.softmax(torch.randn(12, generator=gen, dtype=F64), 0)
    so2, s2, a, p = 0.3, 0.5, 0.7, 0.4
    u = 2 * torch.randn(500, generator=gen, dtype=F64)
    s = (torch.rand(500, generator=gen, dtype=F64) * 10 + 0.1) if k else torch.zeros(500, dtype=F64)
    wn = n_vals * so2 + ch
    num, den = _hidden_log_densities(u, s, wn, s2, a, p, k, n_prob)
    atom = wn <= 0
    wn_s = torch.where(atom, torch.ones_like(wn), wn)
    la, lp, lm = _log_branch_densities(u[:, None], s[:, None], wn_s[None, :], (wn + s2)[None, :], a,
                                       torch.tensor(p, dtype=F64), k)
    la = torch.where(atom[None, :], torch.full_like(la, -math.inf), la)
    logw = torch.log(n_prob)[None, :]
    ref = torch.logsumexp(logw + torch.logaddexp(la, lp), 1) - torch.logsumexp(logw + torch.logaddexp(la, lm), 1)
    assert torch.allclose(num - den, ref, rtol=0, atol=1e-9)
    assert float(ref.abs().max()) > 0.1  # losses far from 0: the comparison can tell them apart
