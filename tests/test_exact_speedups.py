"""The approximations behind issue 31's faster ``exact`` accounting: each keeps the bound an
upper bound (never below the finer computation, up to the root finders' 1e-9) and within a
stated tolerance of it. Seeded fading gains; a few seconds in all."""

from __future__ import annotations

import numpy as np
import torch

from otafl.privacy.accountants import exact_run as er
from otafl.privacy.analysis import count_law
from otafl.privacy.analysis.cells import DEFAULT_GRID
from otafl.privacy.analysis.ota_round import round_epsilon
from otafl.privacy.facts import uniform_facts

REL = 1e-9
F64 = torch.float64


def _fading(users: int, dim: int, rounds: int = 12, seed: int = 0, n0: float = 1.0):
    gains = 0.5 * (1.0 + np.sqrt(np.random.default_rng(seed).exponential(size=rounds)))
    return [uniform_facts(users, 0.5, 0.1, float(c), n0, 2.0, dim) for c in gains]


def test_screened_total_is_at_least_the_total_with_eq_1_and_within_the_slack():
    """Central rows where eq. (1) cannot help the total: the screen leaves it out, and the
    total is at least the one with eq. (1) solved (slack 0: never screened) and within 1e-3."""
    keys = er.run_row_keys(_fading(40, 100), "central")
    er.clear_caches()
    quick = er.compose_exact_rounds(keys, delta_target=1e-5)
    full = er.compose_exact_rounds(keys, delta_target=1e-5, slack=0.0)
    assert quick["screened"] and not full["screened"]
    assert full["epsilon"] * (1 - REL) <= quick["epsilon"] <= full["epsilon"] * (1 + 1e-3)


def test_the_screen_keeps_eq_1_where_it_lowers_the_total():
    """Local rows with much channel noise (N0 = 20): eq. (1) hides participation and lowers the
    total by more than the slack, so the screen lets it in; eq. (5) alone (slack 1: always
    screened) is the larger total."""
    keys = er.run_row_keys(_fading(40, 100, n0=20.0), "local")
    er.clear_caches()
    used = er.compose_exact_rounds(keys, delta_target=1e-5)
    skipped = er.compose_exact_rounds(keys, delta_target=1e-5, slack=1.0)
    assert not used["screened"] and skipped["screened"]
    assert used["epsilon"] < (1 - 1e-3) * skipped["epsilon"]


def test_lumped_total_count_law_is_above_the_exact_one_and_within_a_tenth_of_a_percent(monkeypatch):
    """K = 10^4 (blocks of 4 counts): eq. (5)'s epsilon with the lumped law of m is at least
    the one with every count (1e-9) and at most 0.1 % above it, at delta 1e-5 and 1e-9."""
    keys = list(dict.fromkeys(k for ks in er.run_row_keys(_fading(10_000, 210, rounds=6), "central") for k in ks))
    spec = er._spec(keys, 1e-12)
    law = count_law.total_count_law(spec.law, spec.participation_prob)
    assert law.m.shape[1] < 0.3 * (spec.law.weight.shape[1] + 1)  # blocks of 4
    for lumped, exact in _eq5_epsilons_with_and_without(monkeypatch, spec, "TOTAL_LUMP"):
        assert bool((lumped >= exact * (1 - REL)).all()) and bool((lumped <= exact * 1.001).all())


def _eq5_epsilons_with_and_without(monkeypatch, spec, knob: str):
    """Eq. (5)'s epsilons of ``spec``'s rows at delta 1e-5 and 1e-9: (as they are, with
    count_law's ``knob`` set to 0), per delta."""
    out = []
    for delta in (1e-5, 1e-9):
        t = torch.full((spec.participation_prob.shape[0],), delta, dtype=F64)
        ours = round_epsilon(t, spec, conditioning="total")
        with monkeypatch.context() as m:
            m.setattr(count_law, knob, 0.0)
            out.append((ours, round_epsilon(t, spec, conditioning="total")))
    return out


def test_tail_blocks_of_the_total_count_are_above_every_count_and_within_a_hundredth_of_a_percent(monkeypatch):
    """K = 200, p = 0.1 ... 0.9: the law of m with its tails (mass <= 1e-6) in blocks of 16 has
    fewer terms, and eq. (5)'s epsilon with it is at least the one with every count (1e-9) and
    at most 1e-4 above it, at delta 1e-5 and 1e-9. A row's blocks do not depend on its batch: a
    longer row without tails beside them leaves their terms as they were."""
    facts = [uniform_facts(200, p, 0.1, 1.0, 1.0, 2.0, 7850) for p in (0.1, 0.3, 0.5, 0.7, 0.9)]
    keys = list(dict.fromkeys(k for ks in er.run_row_keys(facts, "central") for k in ks))
    spec = er._spec(keys, 1e-15)
    law = count_law.total_count_law(spec.law, spec.participation_prob)
    assert law.m.shape[1] < 0.8 * (spec.law.weight.shape[1] + 1)
    for blocked, every in _eq5_epsilons_with_and_without(monkeypatch, spec, "TAIL_BLOCK_MASS"):
        assert bool((blocked >= every * (1 - REL)).all()) and bool((blocked <= every * (1 + 1e-4)).all())
        assert bool((blocked > every * (1 + REL)).any())  # the blocks are in use
    with monkeypatch.context() as m:
        m.setattr(count_law, "TAIL_BLOCK_MASS", 0.0)
        law = count_law.total_count_law(spec.law, spec.participation_prob)  # every count
    alone = count_law.tail_blocks(law)
    flat = torch.full((1, law.m.shape[1] + 8), 1.0 / (law.m.shape[1] + 8), dtype=F64)  # no tails, longer
    padded = lambda t, fill: torch.cat([t, fill.expand(t.shape[0], 8)], 1)  # noqa: E731
    both = count_law.TotalLaw(
        m=torch.cat([padded(law.m, law.m[:, -1:]), torch.arange(flat.shape[1], dtype=F64)[None]]),
        weight=torch.cat([padded(law.weight, torch.zeros(1, 1, dtype=F64)), flat]),
        share=torch.cat([padded(law.share, torch.zeros(1, 1, dtype=F64)), torch.full_like(flat, 0.5)]),
        dropped=torch.cat([law.dropped, torch.zeros(1, dtype=F64)]))
    beside = count_law.tail_blocks(both)
    G = alone.m.shape[1]
    for field in ("m", "weight", "share"):
        assert torch.equal(getattr(beside, field)[:-1, :G], getattr(alone, field))


def test_one_dimensional_eq_5_is_solved_without_the_detour_through_the_free_bound(monkeypatch):
    """Central rows with equal noises and local rows (pi in {0, 1}): eq. (5) is the same bound in
    every dimension, so its root is solved once, not first for the dimension-free bound and
    then again: the same epsilons (1e-9), at most 90 % of the rows' evaluations (74 % central, 81 % local here)."""
    from otafl.privacy.analysis import ota_round

    facts = _fading(200, 7850, rounds=6)
    evals = []
    inner = ota_round.round_delta

    def counted(eps, spec, **kw):
        evals.append(spec.participation_prob.shape[0])
        return inner(eps, spec, **kw)

    monkeypatch.setattr(ota_round, "round_delta", counted)
    for kind in ("central", "local"):
        keys = list(dict.fromkeys(k for ks in er.run_row_keys(facts, kind) for k in ks))
        spec = er._spec(keys, 1e-12)
        t = torch.full((len(keys),), 1e-5, dtype=F64)
        evals.clear()
        direct = round_epsilon(t, spec, conditioning="total")
        n_direct = sum(evals)
        with monkeypatch.context() as m:
            m.setattr(ota_round, "_total_is_flat", lambda spec: False)
            evals.clear()
            detour = round_epsilon(t, spec, conditioning="total")
            n_detour = sum(evals)
        assert torch.allclose(direct, detour, rtol=2e-9, atol=0.0)
        assert n_direct <= 0.9 * n_detour


def test_per_round_epsilons_on_the_coarser_cells_are_above_the_default_grid_and_close():
    """ROW_GRIDS (nested in DEFAULT_GRID): each row's epsilon is at least DEFAULT_GRID's
    (1e-9) and within 0.05 % (central) and 0.2 % (local) of it, d = 7850."""
    facts = _fading(200, 7850, rounds=6, n0=4.0)
    for kind, tol in (("central", 5e-4), ("local", 2e-3)):
        keys = [k for ks in er.run_row_keys(facts, kind) for k in ks]
        er.clear_caches()
        ours = er.row_epsilons(keys, 1e-5)
        fine = er.row_epsilons(keys, 1e-5, grid=DEFAULT_GRID)
        for k in ours:
            assert fine[k] * (1 - REL) <= ours[k] <= fine[k] * (1 + tol)


def test_lumped_check_of_eq_1_keeps_the_per_round_epsilon(monkeypatch):
    """round_epsilon checks where eq. (1) can beat eq. (5) with the law of n in blocks (an
    upper bound on eq. (1)): at K = 10^4 (blocks of ~10 counts) the epsilons are at least those
    of the unlumped check (1e-9) and within 0.2 % of them, at much channel noise (N0 = 50,
    where eq. (1) wins on some rows) and little."""
    from otafl.privacy.analysis import ota_round

    for n0 in (1.0, 50.0):
        keys = list(dict.fromkeys(k for ks in er.run_row_keys(_fading(10_000, 210, rounds=4, n0=n0), "central")
                                  for k in ks))
        spec = er._spec(keys, 1e-12)
        t = torch.full((len(keys),), 1e-5, dtype=F64)
        ours = round_epsilon(t, spec)
        monkeypatch.setattr(ota_round, "CHECK_LUMP", 0.0)
        plain = round_epsilon(t, spec)
        monkeypatch.undo()
        assert bool((ours >= plain * (1 - REL)).all()) and bool((ours <= plain * 1.002).all())


def test_upper_bound_alone_equals_the_upper_bound_of_both():
    """``lower=False`` (what the profiles and roots read) leaves the upper bound bit for bit
    as with the lower bound computed: the 1-D mixture (equal and unequal variances), the d
    dimensional cells, and a round's eq. (1) and eq. (5) with a lumped law of n."""
    from otafl.privacy.analysis.cells import conditional_delta
    from otafl.privacy.analysis.mixture import mixture_hockey_stick
    from otafl.privacy.analysis.ota_round import lumped, round_delta

    g = torch.Generator().manual_seed(3)
    eps = torch.linspace(0.0, 4.0, 9, dtype=F64)[:, None]
    lam = torch.logit(torch.rand(1, 7, generator=g, dtype=F64).clamp(0.05, 0.95))
    for w, W in ((2.0, 2.0), (2.0, 2.5)):
        both = mixture_hockey_stick(eps, log_odds=lam, absent_var=torch.tensor(w, dtype=F64),
                                    present_var=torch.tensor(W, dtype=F64), half_sensitivity=torch.tensor(1.0, dtype=F64))
        alone = mixture_hockey_stick(eps, log_odds=lam, absent_var=torch.tensor(w, dtype=F64),
                                     present_var=torch.tensor(W, dtype=F64),
                                     half_sensitivity=torch.tensor(1.0, dtype=F64), lower=False)
        assert alone[1] is None and torch.equal(both[0], alone[0])
    kw = dict(participation_prob=torch.tensor([0.3, 0.5, 1.0], dtype=F64)[:, None],
              absent_var=torch.tensor([1.0, 3.0, 2.0], dtype=F64)[:, None],
              own_noise_var=torch.tensor([0.5, 0.0, 0.4], dtype=F64)[:, None],
              half_sensitivity=torch.tensor(1.0, dtype=F64), dim=50)
    both, alone = conditional_delta(eps.T, **kw), conditional_delta(eps.T, lower=False, **kw)
    assert alone[1] is None and torch.equal(both[0], alone[0])
    keys = list(dict.fromkeys(k for ks in er.run_row_keys(_fading(2000, 30, rounds=2), "central") for k in ks))
    spec = er._spec(keys, 1e-12)
    e = torch.linspace(0.1, 2.0, 3, dtype=F64).expand(len(keys), 3)
    for cond, spec in (("others", lumped(spec, 0.01)), ("others", spec), ("total", spec), ("best", spec)):
        both, alone = round_delta(e, spec, conditioning=cond), round_delta(e, spec, conditioning=cond, lower=False)
        assert alone[1] is None and torch.equal(both[0], alone[0])


def test_a_predicted_first_step_finds_the_same_root_from_the_hint():
    """Eq. (1)'s hinted solve with a first step far below the hint (as the predicted saving
    gives) or right at it (xtol): the same epsilon (1e-9), and delta there meets the target."""
    from otafl.privacy.analysis.ota_round import round_delta

    keys = list(dict.fromkeys(k for ks in er.run_row_keys(_fading(1, 30, rounds=3, n0=20.0), "local") for k in ks))
    spec = er._spec(keys, 1e-12)
    t = torch.full((len(keys),), 1e-5, dtype=F64)
    hint = round_epsilon(t, spec, conditioning="total")
    plain = round_epsilon(t, spec, conditioning="others", upper_hint=hint)
    for step in (0.05, 0.4):
        fast = round_epsilon(t, spec, conditioning="others", upper_hint=hint,
                             first_step=torch.full_like(hint, step))
        assert torch.allclose(fast, plain, rtol=2 * REL, atol=0.0)
        assert bool((round_delta(fast, spec, conditioning="others")[0] <= t).all())
    assert bool((plain < 0.99 * hint).all())  # eq. (1) wins here: the step down is exercised


def test_uniform_rounds_keyed_without_their_bytes_give_the_same_rows():
    """A uniform round's rows keyed by (K, p, sigma^2) equal those keyed by its arrays' bytes
    (central and local), and a heterogeneous round still goes by its bytes."""
    import numpy as np

    for K in (1, 5, 300):
        p, s2 = np.full(K, 0.3), np.full(K, 0.1)
        for kind in ("central", "local"):
            assert er._rows_of(p, s2, kind) == er._sampling_rows(p.tobytes(), s2.tobytes(), kind)
    p, s2 = np.array([0.3, 0.6, 0.0]), np.array([0.1, 0.1, 0.2])
    for kind in ("central", "local"):
        assert er._rows_of(p, s2, kind) == er._sampling_rows(p.tobytes(), s2.tobytes(), kind)


def test_batched_poisson_binomial_pmfs_equal_each_rounds_own():
    """The pmfs a run prefetches in one batched recursion are bit for bit each round's own
    pmf, which is the shifted-copy recursion's (the in-place form does the same arithmetic)."""
    import numpy as np

    from otafl.privacy.analysis.concentration import poisson_binomial_pmf, prefetch_poisson_binomial_pmfs

    rng = np.random.default_rng(5)
    keys = [("pb", tuple(rng.uniform(0.0, 1.0, k).tolist())) for k in (7, 7, 30, 1)]
    er.clear_caches()
    prefetch_poisson_binomial_pmfs([k[1] for k in keys])
    for k in keys:
        q = np.array(k[1])
        ref = np.zeros(len(q) + 1)
        ref[0] = 1.0
        for j, pj in enumerate(q):
            head = ref[: j + 2].copy()
            ref[: j + 2] = (1.0 - pj) * head + pj * np.concatenate([[0.0], head[:-1]])
        own = poisson_binomial_pmf(torch.tensor([k[1]], dtype=F64))
        assert torch.equal(er._pmf(k), own) and np.array_equal(own[0].numpy(), ref)


def test_uniform_batches_skip_the_gathers_with_the_same_bounds():
    """A batch whose every element takes one path (all 1-D, all d-dimensional cells, all
    closed-form equal-variance roots) gives bit for bit the bounds those elements get in a
    mixed batch (where they are gathered and scattered)."""
    from otafl.privacy.analysis.cells import conditional_delta
    from otafl.privacy.analysis.mixture import mixture_hockey_stick

    g = torch.Generator().manual_seed(7)
    eps = torch.linspace(0.1, 4.0, 6, dtype=F64)
    p = torch.rand(6, generator=g, dtype=F64).clamp(0.05, 0.95)
    w = 0.5 + torch.rand(6, generator=g, dtype=F64)
    one = torch.tensor(1.0, dtype=F64)
    for s2, dim in ((0.0, 40), (0.3, 40), (0.3, 1)):
        v = torch.full((6,), s2, dtype=F64)
        alone = conditional_delta(eps, participation_prob=p, absent_var=w, own_noise_var=v, half_sensitivity=one,
                                  dim=dim)
        pm = torch.cat([p, torch.tensor([1.0], dtype=F64)])  # p = 1: the Gaussian, another path
        mixed = conditional_delta(torch.cat([eps, eps[:1]]), participation_prob=pm, absent_var=torch.cat([w, w[:1]]),
                                  own_noise_var=torch.cat([v, v[:1]]), half_sensitivity=one, dim=dim)
        assert all(torch.equal(x, y[:6]) for x, y in zip(alone, mixed))
    lam = torch.logit(p)
    alone = mixture_hockey_stick(eps, log_odds=lam, absent_var=w, present_var=w, half_sensitivity=one)
    mixed = mixture_hockey_stick(torch.cat([eps, eps[:1]]), log_odds=torch.cat([lam, lam[:1]]),
                                 absent_var=torch.cat([w, w[:1]]), present_var=torch.cat([w, 2 * w[:1]]),
                                 half_sensitivity=one)
    assert all(torch.equal(x, y[:6]) for x, y in zip(alone, mixed))


def test_the_grid_is_sized_for_all_but_the_quietest_share_of_the_rounds():
    """A fading run whose quietest tenth of the rounds sit in deep fades (gain 0.05: about 400x
    the channel noise): sized for them (quiet_share 0) the grid has several times the points,
    sized for the other rounds (the default QUIET_SHARE) it has about ``points``; the two
    totals, each an upper bound, agree within 0.5 %, central and local."""
    rounds = _fading(40, 100, rounds=18)
    deep = [uniform_facts(40, 0.5, 0.1, 0.05, 1.0, 2.0, 100)] * 2
    assert er.QUIET_SHARE >= len(deep) / len(rounds + deep)
    for kind in ("central", "local"):
        keys = er.run_row_keys(rounds + deep, kind)
        er.clear_caches()
        coarse = er.compose_exact_rounds(keys, delta_target=1e-5)
        fine = er.compose_exact_rounds(keys, delta_target=1e-5, quiet_share=0.0)
        assert fine["points"] >= 3 * coarse["points"], (kind, fine["points"], coarse["points"])
        assert abs(coarse["epsilon"] / fine["epsilon"] - 1) <= 5e-3, (kind, coarse["epsilon"], fine["epsilon"])


def test_eq_1_solve_reuses_its_checks_value_and_cells_for_the_same_epsilons(monkeypatch):
    """At K = 200 (no blocks in the check of where eq. (1) wins), round_epsilon's "best" solve
    takes eq. (1)'s value at eq. (5)'s epsilon and its s cells from that check: the cells are
    built once (not again for the solve), at most 90 % of eq. (1)'s row evaluations, and the
    same epsilons as without (2e-9 relative: both are the upper end of a 1e-9 bracket)."""
    import dataclasses

    from otafl.privacy.analysis import ota_round

    keys = list(dict.fromkeys(k for ks in er.run_row_keys(_fading(200, 7850, rounds=6, n0=4.0), "local")
                              for k in ks))
    spec = er._spec(keys, 1e-12)
    t = torch.full((len(keys),), 1e-5, dtype=F64) * spec.participation_prob
    built, evals = [], []
    cells_of, delta_of = ota_round.round_cells, ota_round.round_delta
    monkeypatch.setattr(ota_round, "round_cells", lambda s, *a, **k: built.append(a[1:2]) or cells_of(s, *a, **k))

    def counted(eps, s, **kw):
        if kw.get("conditioning") == "others" and s.dim == 7850:
            evals.append(s.participation_prob.shape[0])
        return delta_of(eps, s, **kw)

    monkeypatch.setattr(ota_round, "round_delta", counted)
    ours = round_epsilon(t, spec)
    n_ours, b_ours = sum(evals), len(built)
    evals.clear(), built.clear()
    with monkeypatch.context() as m:  # as before: the check's own cells, the hint's value computed again
        solve = ota_round.round_epsilon
        m.setattr(ota_round, "lumped", lambda s, rel: dataclasses.replace(s))
        m.setattr(ota_round, "round_epsilon", lambda *a, hint_delta=None, cells=None, **k: solve(*a, **k))
        plain = round_epsilon(t, spec)
    assert n_ours > 0 and n_ours <= 0.9 * sum(evals) and b_ours < len(built)
    assert torch.allclose(ours, plain, rtol=2e-9, atol=0.0)


def test_newton_stops_a_step_early_with_the_same_bounds(monkeypatch):
    """mixture_hockey_stick takes its last Newton step (below NEWTON_NEAR) without evaluating
    it, the tightening certifies the bracket: the same upper and lower bounds as iterating to
    the end (1e-8 relative, 1e-20 absolute: the brackets are as wide, from another starting
    point; seed 11, 20,000 random elements with w < W) for at most 85 % of the Newton evaluations."""
    from otafl.privacy.analysis import mixture

    g = torch.Generator().manual_seed(11)
    n = 20000
    nrm = lambda: torch.randn(n, generator=g, dtype=F64)  # noqa: E731
    eps = 5 * torch.rand(n, generator=g, dtype=F64)
    w = torch.exp(2 * nrm())
    x = dict(log_odds=4 * nrm(), absent_var=w, present_var=w + torch.exp(2 * nrm()), half_sensitivity=torch.exp(nrm()))
    count, terms = [], mixture._ratio_terms
    monkeypatch.setattr(mixture, "_ratio_terms", lambda u, *a: count.append(u.numel()) or terms(u, *a))
    up, lo = mixture.mixture_hockey_stick(eps, **x)
    n_near = sum(count)
    count.clear()
    monkeypatch.setattr(mixture, "NEWTON_NEAR", 0.0)
    up0, lo0 = mixture.mixture_hockey_stick(eps, **x)
    assert torch.allclose(up, up0, rtol=1e-8, atol=1e-20) and torch.allclose(lo, lo0, rtol=1e-8, atol=1e-20)
    assert n_near <= 0.85 * sum(count)


def test_the_newton_kernel_equals_the_likelihood_ratio_it_rewrites():
    """_ratio_terms (L through D = A - (B + C) / 2 and t = (B - C) / 2) against
    _likelihood_ratio (the log-sum-exps of the three branches), at random points u around the
    root's scale (seed 13, 20,000 elements, pi up to 1 - 1e-12 and down to 1e-12): L within
    1e-12 absolute plus 1e-12 of |A|, dL/du within 1e-9 relative plus 1e-12 absolute."""
    import torch.nn.functional as F

    from otafl.privacy.analysis import mixture

    g = torch.Generator().manual_seed(13)
    n = 20000
    nrm = lambda: torch.randn(n, generator=g, dtype=F64)  # noqa: E731
    lam = (10 * nrm()).clamp(-27.6, 27.6)
    w = torch.exp(2 * nrm())
    W = w + torch.exp(2 * nrm())
    a, eps = torch.exp(nrm()), 5 * torch.rand(n, generator=g, dtype=F64)
    u = (eps * W / (2 * a)) * torch.exp(nrm())
    log_pi, log_1mpi = F.logsigmoid(lam), F.logsigmoid(-lam)
    G0, dG0 = mixture._likelihood_ratio(u, eps, log_pi, log_1mpi, w, W, a)
    k = mixture._ratio_consts(log_1mpi - 0.5 * torch.log(w), log_pi - 0.5 * torch.log(W), 1 / w, 1 / W, a)
    G, dG = mixture._ratio_terms(u, eps, *k)
    scale = (log_1mpi - u * u / (2 * w)).abs()
    assert bool(((G - G0).abs() <= 1e-12 + 1e-12 * scale).all())
    assert bool(((dG - dG0).abs() <= 1e-9 * dG0.abs() + 1e-12).all())
    assert torch.equal(mixture._ratio_value(u, eps, *k), G)


def test_the_screens_floor_at_the_quick_looks_points_first_gives_the_same_totals(monkeypatch):
    """compose_exact_rounds computes the d = 1 floor first at the points the quick look reads and
    at the others only where they decide something. On a fading run (K = 200, d = 7850, 12
    rounds): the same totals bit for bit as with the floor at every point at once; the central
    total takes the full look (94 grid points), so its floor is completed at every point; the
    local one is decided by the quick look (231 points), with at most 80 % of the evaluations."""
    from otafl.privacy.analysis import pld

    facts = _fading(200, 7850, rounds=12, n0=4.0)
    sizes, inner = [], pld.others_floor
    monkeypatch.setattr(pld, "others_floor", lambda e, s, *a, **k: sizes.append(e.numel() * s.participation_prob.shape[0])
                        or inner(e, s, *a, **k))
    out = {}
    for first in (True, False):
        monkeypatch.setattr(er, "FLOOR_FIRST", first)
        for kind in ("central", "local"):
            sizes.clear()
            got = er.compose_exact_rounds(er.run_row_keys(facts, kind), delta_target=1e-5)
            out[first, kind] = (got["epsilon"], got["screened"], sum(sizes))
    assert out[True, "central"] == out[False, "central"] and out[True, "central"][1]
    assert out[True, "local"][:2] == out[False, "local"][:2] and not out[True, "local"][1]
    assert out[True, "local"][2] <= 0.8 * out[False, "local"][2]


def test_poisson_binomial_laws_windowed_together_equal_each_windowed_alone():
    """_laws windows the Poisson-binomial laws not cached yet in one batch per number of users
    (pmf_count_laws); each law is the one pmf_count_law gives its pmf alone, bit for bit (30
    random heterogeneous rounds of 25 and 40 users, at two tails; a binomial key among them),
    and a cached law is returned as is."""
    from otafl.privacy.accountants import exact_rows
    from otafl.privacy.analysis.count_law import pmf_count_law

    rng = np.random.default_rng(3)
    keys = [("pb", tuple(rng.uniform(0.02, 0.98, size=k).tolist())) for k in (25, 40) for _ in range(15)]
    keys.insert(7, ("binom", 30, 0.4))
    er.clear_caches()
    for tail in (1e-12, 1e-15):
        together = exact_rows._laws(keys, tail)
        for k, law in zip(keys, together):
            alone = exact_rows._one_law(k, tail) if k[0] != "pb" else \
                pmf_count_law(exact_rows._pmf(k), tail_mass=tail, exact_window=exact_rows.EXACT_WINDOW)
            for a, b in ((law.n_first, alone.n_first), (law.n_last, alone.n_last), (law.weight, alone.weight),
                         (law.dropped, alone.dropped)):
                assert a.shape == b.shape and torch.equal(a, b)
        assert all(a is b for a, b in zip(exact_rows._laws(keys, tail), together))


def test_the_lower_bound_alone_is_eq_3_at_the_newton_point_between_the_certified_bounds():
    """mixture_hockey_stick(upper=False) skips the bracket and takes eq. (3) at the Newton point
    (at most h_eps: u_1 maximises it). On 4,000 random elements, with eps = 0, pi = 1 and w = W
    among them: at least the certified lower bound (up to 1e-9 relative) and at most the
    certified upper bound; the total variation at eps = 0 and the Gaussian mechanism at pi = 1."""
    from otafl.privacy.analysis.gaussian import gaussian_hockey_stick
    from otafl.privacy.analysis.mixture import mixture_hockey_stick, zero_eps_value

    g = torch.Generator().manual_seed(11)
    n = 4000
    eps = torch.rand(n, generator=g, dtype=F64) * 6
    eps[:200] = 0.0
    lam = torch.randn(n, generator=g, dtype=F64) * 4
    lam[200:400] = float("inf")
    w = torch.rand(n, generator=g, dtype=F64) * 3 + 0.05
    W = w + torch.rand(n, generator=g, dtype=F64) * 2
    W[400:600] = w[400:600]
    a = torch.rand(n, generator=g, dtype=F64) + 0.1
    kw = dict(log_odds=lam, absent_var=w, present_var=W, half_sensitivity=a)
    up, lo = mixture_hockey_stick(eps, **kw)
    none, alone = mixture_hockey_stick(eps, upper=False, **kw)
    assert none is None
    # A little below the certified lower bound in the far tails (1e-50 ... 1e-190: the Newton point is
    # up to 1e-6 relative off the root, the bracket's end 1e-13): both are lower bounds.
    assert bool((alone >= lo * (1 - 1e-9) - 1e-300).all()) and bool((alone <= up).all())
    tv = zero_eps_value(lam[:200], w[:200], W[:200], a[:200])
    assert torch.allclose(alone[:200], tv, rtol=1e-12, atol=0)
    gauss = gaussian_hockey_stick(epsilon=eps[200:400], sensitivity=2 * a[200:400], noise_std=W[200:400].sqrt())
    assert torch.allclose(alone[200:400], gauss, rtol=1e-10, atol=1e-300)


def test_eq_1s_lower_bound_alone_charges_each_block_at_its_largest_count():
    """round_delta(conditioning="others", upper=False) on a law of n in blocks (K = 10^7, d = 1):
    the lower bound of round_delta with both bounds (each block at its largest n), up to 1e-12;
    and not the same sum charged at each block's smallest n (the upper bound's), which is larger."""
    from otafl.privacy.analysis import ota_round
    from otafl.privacy.analysis.ota_round import RoundSpec, round_delta

    law = er._law(("binom", 10_000_000, 0.5), 1e-12)
    assert not torch.equal(law.n_first, law.n_last)
    one = lambda x: torch.tensor([x], dtype=F64)  # noqa: E731
    spec = RoundSpec(participation_prob=one(0.5), own_noise_var=one(1.0), others_noise_var=one(1e-6),
                     channel_noise_var=one(1.0), half_sensitivity=one(1.0), law=law, dim=1)
    eps = torch.tensor([[0.0, 0.3, 1.0, 2.0]], dtype=F64)
    up, lo = round_delta(eps, spec, conditioning="others")
    none, alone = round_delta(eps, spec, conditioning="others", upper=False)
    assert none is None and torch.allclose(alone, lo, rtol=1e-12, atol=0)
    p, s2, a, w_first, _ = ota_round._round_params(spec)
    _, at_first = ota_round.conditional_delta(eps[:, :, None], participation_prob=p, absent_var=w_first,
                                              own_noise_var=s2, half_sensitivity=a, dim=1)
    at_first = (law.weight[:, None, :] * at_first).sum(-1)
    assert bool((at_first > alone * (1 + 1e-9)).any()) and bool((alone <= up).all())


def test_eq_1_enters_each_row_up_to_its_own_reach_with_the_same_totals(monkeypatch):
    """A stride group's points reach its largest row's reach; eq. (1) (the d-dimensional cells)
    now enters each row only up to its own (beyond it eq. (5) is below 1e-3 delta / T). On a
    fading run whose local rows' reaches spread (K = 40, d = 100, N0 = 20, 24 rounds): the same
    totals within 1e-9 relative as at every point, with at most 85 % of eq. (1)'s (row, point)
    evaluations (81 % measured; the paper preset's run: about half)."""
    from otafl.privacy.analysis import pld

    facts = _fading(40, 100, rounds=24, n0=20.0)
    keys = er.run_row_keys(facts, "local")
    sizes, inner, depth = [], pld._others_upper, [0]

    def counted(eps, spec, rows, *a, **k):  # the (row, point) bounds the outermost calls return
        depth[0] += 1
        try:
            out = inner(eps, spec, rows, *a, **k)
        finally:
            depth[0] -= 1
        if depth[0] == 0 and eps.dim() == 1 and eps.numel() > 1:
            sizes.append(int(torch.isfinite(out).sum()))
        return out

    monkeypatch.setattr(pld, "_others_upper", counted)
    got = {}
    for own in (True, False):
        monkeypatch.setattr(er, "OWN_REACH", own)
        sizes.clear()
        er.clear_caches()
        out = er.compose_exact_rounds(keys, delta_target=1e-5)
        got[own] = (out["epsilon"], out["screened"], sum(sizes))
    assert not got[True][1] and not got[False][1]  # eq. (1) entered
    assert abs(got[True][0] - got[False][0]) <= 1e-9 * got[False][0]
    assert got[True][2] <= 0.85 * got[False][2]  # measured 0.81


def test_others_upper_with_limits_is_the_same_bound_up_to_each_rows_band():
    """_others_upper with per-row limits: the unlimited values at every row's first ``limit``
    points (up to 1e-14), finite up to the largest limit of its band (the rows whose limits round up
    to the same multiple of LIMIT_BAND) and +inf beyond."""
    from otafl.privacy.analysis import pld
    from otafl.privacy.analysis.ota_round import take_rows

    keys = list(dict.fromkeys(k for ks in er.run_row_keys(_fading(40, 100, rounds=8, n0=20.0), "local") for k in ks))
    spec = er._spec(keys, 1e-15)
    rows = torch.arange(len(keys))
    eps = torch.linspace(0.0, 8.0, 50, dtype=F64)
    full = pld._others_upper(eps, spec, rows, er.PROFILE_GRID, 1 << 18)
    limit = torch.tensor([3, 50, 17, 1, 33, 16, 40, 8][:len(keys)])
    part = pld._others_upper(eps, take_rows(spec, rows[:len(limit)]), torch.arange(len(limit)), er.PROFILE_GRID,
                             1 << 18, limit=limit)
    band = (limit + pld.LIMIT_BAND - 1) // pld.LIMIT_BAND
    for i, lim in enumerate(limit.tolist()):
        assert torch.allclose(part[i, :lim], full[i, :lim], rtol=1e-14, atol=0)
        end = int(limit[band == band[i]].max())  # the largest limit of the row's band
        assert bool(torch.isinf(part[i, end:]).all()) and bool(torch.isfinite(part[i, :end]).all())
