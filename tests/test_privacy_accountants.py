"""Per-round accountants `paper` and `tight`, the registry contract, and account_run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otafl.errors import OtaflInputError
from otafl.privacy.accountants import (
    ACCOUNTANTS,
    REASON_DELTA_PRIME,
    REASON_HOEFFDING,
    REASON_NO_CENTRAL_NOISE,
    REASON_NO_LOCAL_NOISE,
    REASONS,
    account_run,
    evaluate_in_chunks,
    paper_round,
    reason_text,
    tight_round,
)
from otafl.privacy.accountants.result import FLAGGED_REASONS
from otafl.privacy.facts import RoundFacts
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon

F64 = torch.float64


def paper_closed_form(p, K, sigma2, L, delta_l):
    """The paper's eq.: log(1 + p/(1-delta')(exp(c/sqrt(K(p-beta))) - 1)), written out in numpy."""
    delta_prime = 2 * np.exp(-2 * (K * p) ** 2 / K) + 1e-5
    beta = np.sqrt(np.log(2 / delta_prime) / (2 * K))
    c = 2 * L * np.sqrt(2 * np.log(1.25 / delta_l)) / np.sqrt(sigma2)
    return np.log(1 + p / (1 - delta_prime) * (np.exp(c / np.sqrt(K * (p - beta))) - 1))


def test_paper_equals_the_closed_form_with_uniform_p_and_equal_sigma():
    p = np.array([0.3, 0.5, 0.7, 0.9, 0.99])[:, None, None, None]
    K = np.array([100, 200, 1000])[None, :, None, None]
    sigma2 = np.array([0.1, 1.0, 10.0])[None, None, :, None]
    L = np.array([0.1, 1.0])[None, None, None, :]
    bound = paper_round(participation_prob=torch.tensor(p), users=torch.tensor(K), noise_var=torch.tensor(sigma2),
                        sensitivity=2 * torch.tensor(L), alignment_gain=1.0, n0=1.0, delta_l=1e-5)
    expected = paper_closed_form(p, K, sigma2, L, 1e-5)
    assert bound.epsilon_central.shape == expected.shape
    np.testing.assert_allclose(bound.epsilon_central.numpy(), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_per_user_inputs_equal_the_implicit_uniform_form(name):
    fn = ACCOUNTANTS[name].round_bound
    K = 40
    kw = dict(alignment_gain=0.7, n0=1.0, sensitivity=2.0, delta_l=1e-5)
    p = torch.tensor([0.3, 0.8], dtype=F64)
    uniform = fn(participation_prob=p, noise_var=0.5, users=K, **kw)
    per_user = fn(participation_prob=p[:, None].expand(2, K), noise_var=torch.full((2, K), 0.5, dtype=F64), **kw)
    for field in ("epsilon_local", "delta_local", "epsilon_central", "delta_central", "quantile", "delta_prime"):
        assert torch.allclose(getattr(uniform, field), getattr(per_user, field), rtol=1e-12, atol=0), field


@settings(max_examples=60, deadline=None)
@given(users=st.integers(2, 2000), p=st.floats(0.01, 1.0), sigma2=st.floats(1e-3, 100.0),
       clip=st.floats(0.01, 10.0), c=st.floats(0.01, 100.0), n0=st.sampled_from([0.0, 1.0]),
       log_delta_l=st.floats(-12, -2), delta_prime=st.sampled_from(["auto", 1e-6, 1e-3, 0.1]))
def test_tight_never_exceeds_paper_where_the_classic_step_is_valid(users, p, sigma2, clip, c, n0, log_delta_l,
                                                                   delta_prime):
    kw = dict(participation_prob=p, users=users, noise_var=sigma2, sensitivity=2 * clip, alignment_gain=c, n0=n0,
              delta_l=math.exp(log_delta_l), delta_prime=delta_prime)
    paper, tight = paper_round(**kw), tight_round(**kw)
    if bool(paper.classic_valid):
        assert float(tight.epsilon_central) <= float(paper.epsilon_central) * (1 + 1e-12)
        assert float(tight.quantile) >= float(paper.quantile)
    if bool(paper.classic_valid_local):  # p = 1: no amplification in either
        assert float(tight.epsilon_local) <= float(paper.epsilon_local) * (1 + 1e-12)
    assert float(tight.delta_central) == pytest.approx(float(paper.delta_central), rel=1e-12)


def test_tight_ldp_is_the_unamplified_analytic_gaussian_and_paper_flags_its_amplification():
    # tight: eps_G(Delta, sqrt(sigma^2 + N0/c^2), delta_l) whatever p > 0, delta p delta_l (joint convexity)
    kw = dict(users=50, noise_var=0.5, alignment_gain=2.0, n0=1.0, sensitivity=2.0, delta_l=1e-3)
    ref = float(analytic_gaussian_epsilon(sensitivity=2.0, noise_std=math.sqrt(0.5 + 1.0 / 4.0), delta=1e-3))
    for p in (0.1, 0.5, 1.0):
        tight = tight_round(participation_prob=p, **kw)
        assert float(tight.epsilon_local) == pytest.approx(ref, rel=1e-12)
        assert float(tight.delta_local) == pytest.approx(p * 1e-3, rel=1e-12)
        assert float(tight.local_sampling_rate) == 1.0  # its RDP view is the plain Gaussian
        assert bool(tight.classic_valid_local)
    # paper amplifies by p: a theorem only for p = 1 (and its classic step needs eps_0 <= 1)
    big = dict(kw, noise_var=400.0)
    assert not bool(paper_round(participation_prob=0.5, **big).classic_valid_local)
    assert bool(paper_round(participation_prob=1.0, **big).classic_valid_local)
    per_user = paper_round(participation_prob=torch.tensor([1.0, 0.0, 1.0], dtype=F64), noise_var=400.0,
                           alignment_gain=2.0, n0=1.0, sensitivity=2.0, delta_l=1e-3)
    assert bool(per_user.classic_valid_local)  # a user who never takes part is no exception


def test_paper_flags_its_classic_step_outside_the_valid_range():
    # L = 1, sigma^2 = 0.1, K = 200: eps_0 > 1 at every p (the paper's Table II a).
    bound = paper_round(participation_prob=torch.tensor([0.5, 0.9]), users=200, noise_var=0.1, sensitivity=2.0,
                        alignment_gain=1.0, n0=0.0, delta_l=1e-5)
    assert not bool(bound.classic_valid.any())
    # L = 0.1: eps_0 < 1, the flag is set.
    bound = paper_round(participation_prob=torch.tensor([0.5, 0.9]), users=200, noise_var=0.1, sensitivity=0.2,
                        alignment_gain=1.0, n0=0.0, delta_l=1e-5)
    assert bool(bound.classic_valid.all())


def table_ii(clip: float, p: list[float]) -> np.ndarray:
    return paper_round(participation_prob=torch.tensor(p, dtype=F64), users=200, noise_var=0.1,
                       sensitivity=2 * clip, alignment_gain=1.0, n0=0.0, delta_l=1e-5).epsilon_central.numpy()


def test_table_ii_directions_with_l_equal_1_central_leakage_falls_with_p():
    eps = table_ii(1.0, [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert (np.diff(eps) < 0).all()


def test_table_ii_directions_with_l_equal_0_1_central_leakage_rises_with_p_from_one_half():
    eps = table_ii(0.1, [0.5, 0.6, 0.7, 0.8, 0.9])
    assert (np.diff(eps) > 0).all()
    # Below 1/2 the Hoeffding slack K beta dominates `paper`: the leakage falls again
    # towards 0.5 (0.3 -> 0.5), and explodes at p = 0.1 where mu - K beta is ~7e-4.
    low = table_ii(0.1, [0.1, 0.3, 0.5])
    assert low[0] > 100 and low[1] > low[2]


def test_undefined_points_are_infinite_with_a_reason_and_do_not_raise():
    p = torch.tensor([0.02, 0.5, 0.5], dtype=F64)
    sigma2 = torch.tensor([0.1, 0.1, 0.0], dtype=F64)
    for name in sorted(ACCOUNTANTS):
        b = ACCOUNTANTS[name].round_bound(participation_prob=p, users=200, noise_var=sigma2, sensitivity=2.0,
                                          alignment_gain=1.0, n0=0.0, delta_l=1e-5)
        assert b.reason[1] == 0 and math.isfinite(b.epsilon_central[1])
        # sigma^2 = 0 and N0 = 0: nothing protects anybody.
        assert b.reason[2] & REASON_NO_LOCAL_NOISE and b.reason[2] & REASON_NO_CENTRAL_NOISE
        assert b.epsilon_central[2] == math.inf and b.epsilon_local[2] == math.inf
        if name in ("exact", "steps", "steps-sumdom"):
            # no concentration step (exact) / a quantile whose failure is charged to delta
            # (steps, steps-sumdom): p = 0.02 (mu = 4) still has a finite bound
            assert b.reason[0] == 0 and math.isfinite(b.epsilon_central[0])
            continue
        # p = 0.02: mu = 4, auto delta' = 2 exp(-0.16) + 1e-5 > 1.
        assert b.reason[0] & REASON_DELTA_PRIME and b.epsilon_central[0] == math.inf
        assert b.defined.tolist() == [False, True, False]
    # Hoeffding: a fixed delta' too small for mu. `tight`'s exact quantile is then 0
    # (P(|K_t| = 0) = 0.9^200 > 1e-30): only the channel noise is left to protect.
    kw = dict(participation_prob=0.1, users=200, noise_var=0.1, sensitivity=2.0, alignment_gain=1.0,
              delta_l=1e-5, delta_prime=1e-30)
    assert int(paper_round(n0=1.0, **kw).reason) == REASON_HOEFFDING
    assert float(tight_round(n0=1.0, **kw).quantile) == 0.0
    assert int(tight_round(n0=1.0, **kw).reason) == 0
    assert int(tight_round(n0=0.0, **kw).reason) == REASON_NO_CENTRAL_NOISE
    assert reason_text(REASON_HOEFFDING | REASON_NO_LOCAL_NOISE) == \
        f"{REASONS[REASON_HOEFFDING]}; {REASONS[REASON_NO_LOCAL_NOISE]}"


def test_channel_noise_counts_in_tight_central_but_not_in_paper():
    kw = dict(participation_prob=0.5, users=200, noise_var=0.1, sensitivity=2.0, alignment_gain=0.5, delta_l=1e-5)
    assert float(paper_round(n0=1.0, **kw).epsilon_central) == float(paper_round(n0=0.0, **kw).epsilon_central)
    assert float(tight_round(n0=1.0, **kw).epsilon_central) < float(tight_round(n0=0.0, **kw).epsilon_central)
    # LDP: with colluding others only the user's own noise and the channel protect it.
    assert float(paper_round(n0=1.0, **kw).epsilon_local) < float(paper_round(n0=0.0, **kw).epsilon_local)


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_accountant_contract(name):
    fn = ACCOUNTANTS[name].round_bound
    assert ACCOUNTANTS[name].name == name
    b = fn(participation_prob=torch.tensor([[0.2], [0.6]], dtype=F64), users=torch.tensor([[100], [300]]),
           noise_var=torch.tensor([0.1, 1.0, 10.0], dtype=F64), sensitivity=2.0, alignment_gain=1.0, n0=1.0,
           delta_l=1e-5)
    for field in ("epsilon_local", "delta_local", "epsilon_central", "delta_central", "quantile", "delta_prime"):
        value = getattr(b, field)
        assert value.shape == (2, 3) and value.dtype == F64, field
    assert b.reason.dtype == torch.int64 and b.classic_valid.dtype == torch.bool
    # More noise, less leakage.
    assert (torch.diff(b.epsilon_central, dim=1) < 0).all() and (torch.diff(b.epsilon_local, dim=1) < 0).all()
    # A user who never takes part leaks nothing locally.
    zero = fn(participation_prob=torch.tensor([0.0, 0.5], dtype=F64), noise_var=0.1, sensitivity=2.0,
              alignment_gain=1.0, n0=1.0, delta_l=1e-5)
    assert float(zero.epsilon_local) > 0  # the worst user is the participating one
    none = fn(participation_prob=0.0, users=10, noise_var=0.1, sensitivity=2.0, alignment_gain=1.0, n0=1.0,
              delta_l=1e-5)
    assert float(none.epsilon_local) == 0.0 and float(none.delta_local) == 0.0
    # Bad input raises before computing anything.
    good = dict(participation_prob=0.5, users=10, noise_var=0.1, sensitivity=2.0, alignment_gain=1.0, n0=1.0,
                delta_l=1e-5)
    for bad in (dict(participation_prob=1.5), dict(noise_var=-1.0), dict(delta_l=1.0), dict(users=0),
                dict(delta_prime=0.0), dict(delta_prime="sometimes"), dict(sensitivity=0.0), dict(n0=-1.0)):
        with pytest.raises(OtaflInputError):
            fn(**{**good, **bad})


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_chunked_evaluation_equals_one_call(name):
    gen = torch.Generator().manual_seed(3)  # seed 3; 3000 scattered points, chunks of 256
    n = 3000
    if name == "exact":  # its integrals take 10 CPU-seconds at 3000 points: 600 in chunks of 64 (a short last one)
        n = 600
    kw = dict(participation_prob=torch.rand(n, generator=gen, dtype=F64) * 0.9 + 0.1,
              users=torch.randint(20, 400, (n,), generator=gen),
              noise_var=torch.rand(n, generator=gen, dtype=F64) + 0.01,
              alignment_gain=torch.rand(n, generator=gen, dtype=F64) + 0.1, n0=1.0, sensitivity=2.0, delta_l=1e-5)
    fn = ACCOUNTANTS[name].round_bound
    whole, chunked = fn(**kw), evaluate_in_chunks(fn, chunk_size=64 if name == "exact" else 256, **kw)
    for field in ("epsilon_local", "epsilon_central", "quantile", "reason"):
        if name == "exact" and field.startswith("epsilon"):
            # exact's integrals batch their rows in memory-sized chunks, and torch's vectorised
            # special functions may round an element's last bit differently with its position
            # in a batch: equal to rounding, not bit for bit.
            torch.testing.assert_close(getattr(whole, field), getattr(chunked, field), rtol=1e-12, atol=0.0)
        else:
            assert torch.equal(getattr(whole, field), getattr(chunked, field)), field


def fit_slope(K, eps):
    return float(np.polyfit(np.log(K.numpy()), np.log(eps.numpy()), 1)[0])


def test_central_leakage_scales_as_k_to_minus_three_quarters_and_minus_one_half():
    K = torch.logspace(2, 6, 41, dtype=F64).round()
    kw = dict(users=K, noise_var=10.0, sensitivity=2.0, alignment_gain=1.0, n0=0.0, delta_l=1e-5)
    fixed = paper_round(participation_prob=torch.full_like(K, 0.5), **kw).epsilon_central
    sqrt_p = paper_round(participation_prob=5.0 / torch.sqrt(K), **kw).epsilon_central
    assert fit_slope(K, fixed) == pytest.approx(-0.5, abs=0.05)
    assert fit_slope(K, sqrt_p) == pytest.approx(-0.75, abs=0.05)


def constant_facts(T=6, K=50, p=0.5, c=None):
    gen = torch.Generator().manual_seed(0)  # seed 0 for the per-round gains
    gains = c if c is not None else (0.5 + torch.rand(T, generator=gen, dtype=F64)).tolist()
    return [RoundFacts(participation_prob=torch.full((K,), p, dtype=F64), noise_var=torch.full((K,), 1.0, dtype=F64),
                       alignment_gain=float(gains[t]), n0=1.0, sensitivity=2.0, dim=100, participants=int(K * p))
            for t in range(T)]


def test_account_run_summary_fields_and_json():
    facts = constant_facts()
    result = account_run(facts, accountants=["paper", "tight"], delta_l=1e-5)
    out = result.summary_fields()
    json.dumps(out)
    for a in ("paper", "tight"):
        per_round = result[a].epsilon_central_per_round
        assert len(per_round) == 6 and len(result[a].epsilon_local_per_round) == 6
        assert out[f"{a}_epsilon_central"] == max(per_round)
        assert out[f"{a}_epsilon_local_max"] == max(result[a].epsilon_local_per_round)
        assert out[f"{a}_composition"] in ("basic", "advanced", "rdp", "pld")
        # paper is flagged here (classic step outside its range / LDP amplified by p < 1): its reason says so
        flagged = FLAGGED_REASONS[a] if a in FLAGGED_REASONS else ""
        assert out[f"{a}_defined"] is True and out[f"{a}_reason"] == flagged
        # A total over 6 rounds is at least the worst round and at most basic composition.
        assert out[f"{a}_epsilon_central"] <= out[f"{a}_epsilon_central_total"] <= sum(per_round) * (1 + 1e-12)
        assert out[f"{a}_delta_central_total"] >= out[f"{a}_delta_central"]
    # The realised participant count is informational only.
    other = [RoundFacts(**{**f.__dict__, "participants": 0}) for f in facts]
    assert account_run(other, accountants=["tight"], delta_l=1e-5)["tight"].epsilon_central_total == \
        out["tight_epsilon_central_total"]


def test_account_run_reports_an_undefined_round():
    facts = constant_facts(T=3, K=200, p=0.02)  # mu = 4: auto delta' >= 1
    out = account_run(facts, accountants=["paper"], delta_l=1e-5).summary_fields()
    assert out["paper_defined"] is False and "delta'" in out["paper_reason"]
    assert out["paper_epsilon_central_total"] == math.inf and out["paper_composition"] == "none"


def test_account_run_rejects_unknown_accountant_and_bad_delta():
    with pytest.raises(OtaflInputError, match="accountant"):
        account_run(constant_facts(T=1), accountants=["magic"], delta_l=1e-5)
    with pytest.raises(OtaflInputError, match="delta_l"):
        account_run(constant_facts(T=1), accountants=["paper"], delta_l=0.0)


def test_registry_is_the_single_source_of_names():
    from otafl.privacy.accountants import exact_round, get_accountant
    from otafl.privacy.accountants.digital import digital_round

    from otafl.privacy.accountants.steps import steps_round

    assert {ACCOUNTANTS[n].round_bound for n in ("paper", "tight", "exact", "steps", "digital")} == {
        paper_round, tight_round, exact_round, steps_round, digital_round}
    for name, acc in ACCOUNTANTS.items():  # contract: every registered accountant bounds a small grid
        b = acc.bound(participation_prob=torch.tensor([0.3, 0.9], dtype=torch.float64), users=50,
                      noise_var=0.5, sensitivity=2.0, alignment_gain=1.0, n0=1.0, delta_l=1e-5, dim=20)
        assert b.epsilon_central.shape == (2,) and bool((b.epsilon_central >= 0).all()), name
        assert bool((b.epsilon_local >= 0).all()), name
    assert all(get_accountant(n) is a and a.name == n for n, a in ACCOUNTANTS.items())
    with pytest.raises(OtaflInputError, match=r"accountant = 'magic' is outside the allowed range \{digital, exact, paper, steps, steps-sumdom, tight\}"):
        get_accountant("magic")
