"""The fast round (ghost norms + book-kept clipped sum) against the per-user autograd loop.

Correctness, not time. Exact comparisons run in float64 (tolerance 1e-9 relative, well
inside the required 1e-6); the statistical noise checks state their seed and tolerance.
"""

import functools
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from otafl.config import load_spec
from otafl.errors import OtaflInputError
from otafl.fl import loop
from otafl.data import UserSplit, sample_minibatches, split_users
from otafl.fl.sketch import InputSketch
from otafl.fl.grads import (
    GhostGradients,
    StackedGradients,
    flatten,
    ghost_gradients,
    layer_method,
    param_dict,
    per_user_gradients,
    supports_ghost,
    user_gradients,
)
from otafl.fl.round import ChannelSetup, ideal_aggregate, ota_aggregate
from otafl.models import make_model
from otafl.transmit import clip_factors, effective_noise_var, max_power

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_round.py"
_spec = importlib.util.spec_from_file_location("bench_round", _BENCH)
bench_round = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_round)
per_user_loop_gradients = bench_round.per_user_loop_gradients

USERS, BATCH, FEATURES, CLASSES, HIDDEN = 12, 6, 40, 5, 30


def _problem(name: str, seed: int = 0, dtype=torch.float64):
    """A model and a padded minibatch: users 0-3 hold only 4 of the 6 slots (weight 0 on padding)."""
    gen = torch.Generator().manual_seed(seed)
    model = make_model(name, FEATURES, CLASSES, hidden=HIDDEN, generator=gen).to(dtype)
    x = torch.rand(USERS, BATCH, FEATURES, generator=gen, dtype=dtype)
    x[::2] *= 3.0  # spread the gradient norms so that a middle L clips some users and not others
    y = torch.randint(0, CLASSES, (USERS, BATCH), generator=gen)
    counts = torch.full((USERS,), BATCH)
    counts[:4] = 4
    valid = torch.arange(BATCH)[None, :] < counts[:, None]
    weight = valid.to(dtype) / counts[:, None].to(dtype)
    return model, x, y, weight


def _setup(dim: int, clip: float, sigma2: float = 0.0, n0: float = 0.0) -> ChannelSetup:
    snr = torch.full((USERS,), 10.0, dtype=torch.float64)
    noise_var = torch.full((USERS,), sigma2, dtype=torch.float64)
    return ChannelSetup(power=max_power(snr, dim, n0), noise_var=noise_var, n0=n0, clip=clip, dim=dim)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("name", ["single-layer", "two-layer"])
def test_fast_round_matches_the_per_user_loop_in_norms_and_clipped_sum(name, weight_decay):
    model, x, y, weight = _problem(name)
    ref_grads, ref_losses = per_user_loop_gradients(model, x, y, weight, weight_decay=weight_decay)
    ref_norms = torch.linalg.vector_norm(ref_grads, dim=1)
    clip = float(ref_norms.median())  # between the smallest and the largest norm
    clipped = ref_norms > clip
    assert 0 < int(clipped.sum()) < USERS
    ref_sum = (ref_grads * torch.clamp(clip / ref_norms, max=1.0)[:, None]).sum(dim=0)

    fast = user_gradients(model, x, y, weight, weight_decay=weight_decay)
    assert isinstance(fast, GhostGradients)  # the models take the fast path
    active = torch.ones(USERS, dtype=torch.bool)
    agg = ideal_aggregate(fast, torch.ones(USERS, dtype=torch.float64), active, _setup(fast.dim, clip), None)

    assert torch.allclose(fast.norms, ref_norms, rtol=1e-9, atol=0)
    assert torch.allclose(fast.losses, ref_losses, rtol=1e-9, atol=0)
    assert _rel(agg.aligned_sum, ref_sum) <= 1e-9
    assert _rel(fast.materialise(), ref_grads) <= 1e-9


@pytest.mark.parametrize("use_gram", [True, False])
@pytest.mark.parametrize("name", ["single-layer", "two-layer"])
def test_gram_norms_and_materialised_norms_agree_per_layer(name, use_gram):
    # force every layer onto one method: both must give the loop's norms and weighted sums
    model, x, y, weight = _problem(name, seed=1)
    ref_grads, _ = per_user_loop_gradients(model, x, y, weight, weight_decay=0.01)
    fast = ghost_gradients(model, x, y, weight, weight_decay=0.01, ghost=use_gram)
    coef = torch.rand(USERS, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert torch.allclose(fast.norms, torch.linalg.vector_norm(ref_grads, dim=1), rtol=1e-9, atol=0)
    assert _rel(fast.weighted_sum(coef), coef @ ref_grads) <= 1e-9


def test_float32_fast_norms_match_vmap_on_the_paper_shapes():
    # the training dtype and the paper's sizes (784 -> 100 -> 10, b = 32): float32 agreement
    gen = torch.Generator().manual_seed(3)
    model = make_model("two-layer", 784, 10, hidden=100, generator=gen)
    x = torch.rand(16, 32, 784, generator=gen)
    y = torch.randint(0, 10, (16, 32), generator=gen)
    weight = torch.full((16, 32), 1 / 32)
    ref, _ = per_user_gradients(model, x, y, weight)
    fast = ghost_gradients(model, x, y, weight)
    assert torch.allclose(fast.norms, torch.linalg.vector_norm(ref, dim=1), rtol=1e-4, atol=0)
    coef = torch.rand(16, generator=gen)
    assert _rel(fast.weighted_sum(coef), coef @ ref) <= 1e-5


def test_layer_choice_follows_the_cost_comparison():
    # b^2 (F_in + F_out) vs b F_in F_out: Gram for 784 -> 100, materialise for 784 -> 10 and 100 -> 10
    assert layer_method(32, 784, 100) == "gram" and layer_method(32, 784, 10) == "materialise"
    # a sketch of rank r costs b F_out (r + 1): taken for the paper's first layers (r = 20 or 300)
    assert layer_method(32, 784, 10, sketch_rank=20) == "sketch"
    assert layer_method(32, 784, 100, sketch_rank=300) == "gram"  # 32 * 100 * 301 > 32^2 * 884
    assert layer_method(32, 784, 100, sketch_rank=20) == "sketch"
    assert layer_method(32, 784, 10, sketch_rank=20, ghost=True) == "gram"
    model, x, y, weight = _problem("two-layer")
    fast = ghost_gradients(model, x, y, weight)
    expected = [layer_method(BATCH, FEATURES, HIDDEN), layer_method(BATCH, HIDDEN, CLASSES)]
    assert [t.method for t in fast.terms] == expected


@pytest.mark.parametrize("samples,batch", [(90, 9), (300, 9)])  # D_k = 7-8 < b (padding); D_k = 25 > b
@pytest.mark.parametrize("bias", [True, False])
def test_input_sketch_preserves_inner_products_within_users_and_gives_the_loop_round(samples, batch, bias):
    gen = torch.Generator().manual_seed(7)
    x_train = torch.rand(samples, FEATURES, generator=gen, dtype=torch.float64)
    x_train[1] = x_train[0]  # a duplicate image: a rank-deficient local Gram matrix
    y_train = torch.randint(0, CLASSES, (samples,), generator=gen)
    split = split_users(y_train, USERS, scheme="iid", generator=gen)
    sketch = InputSketch.build(x_train, split)
    assert sketch.rank == int(split.counts.max()) < FEATURES
    idx, weight = sample_minibatches(split, batch, gen)
    x, phi = x_train[idx], sketch.minibatch(idx)
    # phi_j . phi_j' + 1 = x_j . x_j' + 1 for samples of one user (the last coordinate is the 1)
    assert torch.allclose(torch.bmm(phi, phi.transpose(1, 2)), torch.bmm(x, x.transpose(1, 2)) + 1,
                          rtol=1e-10, atol=1e-10)
    torch.manual_seed(7)  # nn.Linear's default init (test-only models)
    models = [make_model("single-layer", FEATURES, CLASSES, generator=gen).double(),
              make_model("two-layer", FEATURES, CLASSES, hidden=HIDDEN, generator=gen).double(),
              nn.Sequential(nn.Linear(FEATURES, 4, bias=bias), nn.Tanh(), nn.Linear(4, CLASSES)).double()]
    for model in models:
        ref_grads, _ = per_user_loop_gradients(model, x, y_train[idx], weight.double(), weight_decay=0.02)
        fast = ghost_gradients(model, x, y_train[idx], weight.double(), weight_decay=0.02, input_sketch=phi)
        assert torch.allclose(fast.norms, torch.linalg.vector_norm(ref_grads, dim=1), rtol=1e-9, atol=0)
        coef = torch.rand(USERS, generator=gen, dtype=torch.float64)
        assert _rel(fast.weighted_sum(coef), coef @ ref_grads) <= 1e-9
        assert _rel(fast.materialise(), ref_grads) <= 1e-9


def test_input_sketch_is_skipped_where_it_cannot_pay_off():
    # r + 1 >= F (users hold about as many samples as there are features): materialising is cheaper
    gen = torch.Generator().manual_seed(8)
    x_train = torch.rand(600, FEATURES, generator=gen, dtype=torch.float64)  # D_k = 50 > F = 40
    split = split_users(torch.randint(0, CLASSES, (600,), generator=gen), USERS, scheme="iid", generator=gen)
    assert InputSketch.build(x_train, split) is None
    # and the loop gathers it only where layer_method takes it for the first layer
    small = InputSketch.build(x_train[:90], split_users(torch.zeros(90, dtype=torch.long), USERS, scheme="iid",
                                                       generator=gen))
    assert small.pays_off(nn.Linear(FEATURES, CLASSES), 32)
    assert not small.pays_off(nn.Tanh(), 32)
    assert not small.pays_off(nn.Linear(FEATURES, 30), 1)  # b = 1, F_out = 30: b^2 (F_in + F_out) < b F_out (r + 1)


def test_input_sketch_refuses_mixed_rows_and_poisons_samples_nobody_holds():
    gen = torch.Generator().manual_seed(9)
    x_train = torch.rand(12, FEATURES, generator=gen, dtype=torch.float64)
    split = UserSplit(index=torch.tensor([[0, 1, 2], [3, 4, 0]]), counts=torch.tensor([3, 2]))
    sketch = InputSketch.build(x_train, split)  # samples 5..11 are nobody's
    with pytest.raises(OtaflInputError, match="one user"):
        sketch.minibatch(torch.tensor([[0, 3]]))
    assert torch.isnan(sketch.minibatch(torch.tensor([[7, 8]]))).all()
    # too large for the memory budget, or a sample held by two users: no sketch
    assert InputSketch.build(x_train, split, max_entries=10) is None
    shared = UserSplit(index=torch.tensor([[0, 1], [1, 2]]), counts=torch.tensor([2, 2]))
    assert InputSketch.build(x_train, shared) is None


def test_layers_without_bias_and_other_activations_take_the_fast_path():
    gen = torch.Generator().manual_seed(8)
    torch.manual_seed(8)  # nn.Linear's default init (test-only model)
    model = nn.Sequential(nn.Linear(FEATURES, 20, bias=False), nn.Tanh(), nn.Linear(20, CLASSES)).double()
    _, x, y, weight = _problem("single-layer", seed=8)
    ref_grads, _ = per_user_loop_gradients(model, x, y, weight, weight_decay=0.03)
    for use_gram in (True, False):
        fast = ghost_gradients(model, x, y, weight, weight_decay=0.03, ghost=use_gram)
        assert torch.allclose(fast.norms, torch.linalg.vector_norm(ref_grads, dim=1), rtol=1e-9, atol=0)
        coef = torch.rand(USERS, generator=gen, dtype=torch.float64)
        assert _rel(fast.weighted_sum(coef), coef @ ref_grads) <= 1e-9
        assert _rel(fast.materialise(), ref_grads) <= 1e-9


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "blocks"])
@pytest.mark.parametrize("users,batch,hidden,bias", [(21, 6, None, True), (19, 3, 7, True), (9, 5, 12, False),
                                                     (40, 1, None, False)])
def test_materialised_norms_kept_or_taken_block_by_block_give_the_vmap_norms_and_clipped_sum(
        monkeypatch, users, batch, hidden, bias, kept):
    # not kept: blocks of 8 users (the smallest block), so that there are several and the last
    # one is partial, and the clipped sum book-kept
    from otafl.fl import blocks

    if not kept:
        monkeypatch.setattr(blocks, "KEEP_FLOATS", 0)
        monkeypatch.setattr(blocks, "BLOCK_FLOATS", 1)
    gen = torch.Generator().manual_seed(users)
    torch.manual_seed(users)  # nn.Linear's default init (test-only models)
    layers = [nn.Linear(FEATURES, CLASSES, bias=bias)] if hidden is None else \
        [nn.Linear(FEATURES, hidden, bias=bias), nn.ReLU(), nn.Linear(hidden, CLASSES, bias=bias)]
    model = nn.Sequential(*layers).double()
    x = torch.rand(users, batch, FEATURES, generator=gen, dtype=torch.float64) * (1 + torch.arange(users)[:, None, None] % 3)
    y = torch.randint(0, CLASSES, (users, batch), generator=gen)
    weight = torch.full((users, batch), 1.0 / batch, dtype=torch.float64)
    ref, _ = per_user_gradients(model, x, y, weight)
    ref_norms = torch.linalg.vector_norm(ref, dim=1)
    fast = ghost_gradients(model, x, y, weight, ghost=False)  # every layer materialised
    assert [t.method for t in fast.terms] == ["materialise"] * (1 if hidden is None else 2)
    assert all((t.weight_grads is not None) == kept for t in fast.terms)
    assert torch.allclose(fast.norms, ref_norms, rtol=1e-9, atol=0)
    clip = float(ref_norms.median())
    factor = torch.clamp(clip / ref_norms, max=1.0)
    assert _rel(fast.weighted_sum(factor), factor @ ref) <= 1e-9
    rows = torch.tensor([users - 1, 0, users // 2])
    assert _rel(fast.materialise_rows(rows, factor[rows]), ref[rows] * factor[rows, None]) <= 1e-9


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("name,ghost,fused", [("single-layer", False, True), ("two-layer", None, True),
                                              ("two-layer", False, False)])
def test_clipped_sum_accumulated_block_by_block_equals_the_per_user_reference(monkeypatch, name, ghost, fused,
                                                                              weight_decay):
    # every materialised layer taken block by block; the clipped sum is accumulated in the same
    # pass when exactly one layer is (else book-kept), and any other coefficients are book-kept
    from otafl.fl import blocks

    monkeypatch.setattr(blocks, "KEEP_FLOATS", 0)
    monkeypatch.setattr(blocks, "BLOCK_FLOATS", 1)
    model, x, y, weight = _problem(name, seed=6)
    ref_grads, _ = per_user_loop_gradients(model, x, y, weight, weight_decay=weight_decay)
    ref_norms = torch.linalg.vector_norm(ref_grads, dim=1)
    clip = float(ref_norms.median())
    factor = torch.clamp(clip / ref_norms, max=1.0)
    fast = user_gradients(model, x, y, weight, weight_decay=weight_decay, clip=clip) if ghost is None else \
        ghost_gradients(model, x, y, weight, weight_decay=weight_decay, ghost=ghost, clip=clip)
    assert sum(t.clipped is not None for t in fast.terms) == (1 if fused else 0)
    for t in fast.terms:  # the factors the aggregation computes, so that it takes the accumulated sum
        assert t.clipped is None or torch.equal(t.clipped[0], clip_factors(fast.norms, clip))
    assert torch.allclose(fast.norms, ref_norms, rtol=1e-9, atol=0)
    agg = ideal_aggregate(fast, torch.ones(USERS, dtype=torch.float64), torch.ones(USERS, dtype=torch.bool),
                          _setup(fast.dim, clip), None)
    assert _rel(agg.aligned_sum, factor @ ref_grads) <= 1e-9
    coef = torch.rand(USERS, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    assert _rel(fast.weighted_sum(coef), coef @ ref_grads) <= 1e-9


def test_unsupported_models_fall_back_to_vmap():
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(3, 4, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (3, 4), generator=gen)
    weight = torch.full((3, 4), 0.25, dtype=torch.float64)
    with_norm = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3)).double()
    inplace = nn.Sequential(nn.Linear(6, 5), nn.ReLU(inplace=True), nn.Linear(5, 3)).double()
    for model in (with_norm, inplace):
        assert not supports_ghost(model)
        grads = user_gradients(model, x, y, weight)
        assert isinstance(grads, StackedGradients)
        ref, _ = per_user_loop_gradients(model, x, y, weight)
        assert _rel(grads.materialise(), ref) <= 1e-9
        with pytest.raises(OtaflInputError, match="nn.Sequential"):
            ghost_gradients(model, x, y, weight)
    with pytest.raises(OtaflInputError, match="'fast'"):
        user_gradients(inplace, x, y, weight, method="fast")


def _round_inputs(seed: int):
    """Two-layer problem of the coin winners (users 1 and 5 lose their coins) and the gains."""
    model, x, y, weight = _problem("two-layer", seed=seed)
    h = 0.3 + torch.rand(USERS, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    active = torch.ones(USERS, dtype=torch.bool)
    active[[1, 5]] = False
    return model, x[active], y[active], weight[active], h, active


def test_aggregate_and_per_user_superposition_agree_without_noise():
    model, x, y, weight, h, active = _round_inputs(5)
    fast = ghost_gradients(model, x, y, weight)
    setup = _setup(fast.dim, clip=float(fast.norms.median()))
    a = ota_aggregate(fast, h, active, setup, torch.Generator().manual_seed(0), superposition="aggregate")
    b = ota_aggregate(fast, h, active, setup, torch.Generator().manual_seed(0), superposition="per-user")
    ref_grads, _ = per_user_loop_gradients(model, x, y, weight)
    norms = torch.linalg.vector_norm(ref_grads, dim=1)
    ref = (ref_grads * torch.clamp(setup.clip / norms, max=1.0)[:, None]).sum(dim=0)
    assert _rel(a.aligned_sum, ref) <= 1e-9 and _rel(b.aligned_sum, ref) <= 1e-9
    assert a.max_power_ratio == pytest.approx(b.max_power_ratio, rel=1e-12)
    assert a.effective_noise_var == b.effective_noise_var == 0.0
    assert torch.equal(a.transmitting, b.transmitting) and torch.equal(a.transmitting, active)
    with pytest.raises(OtaflInputError, match="superposition"):
        ota_aggregate(fast, h, active, setup, torch.Generator(), superposition="both")


@pytest.mark.parametrize("superposition", ["aggregate", "per-user"])
def test_noise_of_the_aligned_sum_has_the_effective_variance(superposition):
    # seed 6; d = 1,385 coordinates of one round: the sample variance of (aligned - clean sum)
    # has relative standard error sqrt(2 / d) ~ 3.8 %; tolerance 5 standard errors (19 %).
    model, x, y, weight, h, active = _round_inputs(6)
    fast = ghost_gradients(model, x, y, weight)
    setup = _setup(fast.dim, clip=1.0, sigma2=0.02, n0=1.0)
    agg = ota_aggregate(fast, h, active, setup, torch.Generator().manual_seed(6), superposition=superposition)
    clean = fast.weighted_sum(torch.clamp(1.0 / fast.norms, max=1.0))
    noise = agg.aligned_sum - clean
    expected = float(effective_noise_var(setup.noise_var, active, setup.n0, agg.alignment_gain))
    assert agg.effective_noise_var == pytest.approx(expected, rel=1e-12)
    assert abs(float(noise.var()) / expected - 1.0) < 5 * math.sqrt(2 / fast.dim)
    assert abs(float(noise.mean())) < 5 * math.sqrt(expected / fast.dim)


def test_a_training_run_through_the_fast_path_equals_the_vmap_path(monkeypatch):
    # the same seed through ghost and through vmap gradients: the same model after 8 rounds
    overrides = ["data.name=synthetic", "data.users=16", "data.batch_size=8", "model.name='two-layer'",
                 "model.hidden=16", "train.rounds=8", "train.eval_every=8", "train.weight_decay=0.01",
                 "transmit.clip=1.0", "privacy.accountants=[]"]
    captured = []
    orig_eval = loop.evaluate

    def spy(model, x, y, batch=4096):
        captured.append(flatten(param_dict(model)).clone())
        return orig_eval(model, x, y, batch)

    monkeypatch.setattr(loop, "evaluate", spy)
    fast = loop.run_experiment(load_spec(None, overrides))
    from otafl.fl import algorithms  # FedSGD's transmit vectors come from user_gradients

    monkeypatch.setattr(algorithms, "user_gradients", functools.partial(user_gradients, method="vmap"))
    slow = loop.run_experiment(load_spec(None, overrides))
    assert 0.0 < fast.summary["final_train_loss"]
    fractions = [r["clipped_fraction"] for r in fast.rounds]
    assert fractions == pytest.approx([r["clipped_fraction"] for r in slow.rounds])
    assert any(0.0 < r["clipped_fraction"] < 1.0 for r in fast.rounds)
    assert torch.max(torch.abs(captured[0] - captured[1])).item() <= 1e-5


def test_a_user_in_a_deep_fade_silences_the_round_under_min_alignment():
    # h_k = 0 for one user: c_t = min_k h_k sqrt(...) = 0, so nobody can be aligned: no participant,
    # no gradient, and the loop skips the update (participants = 0)
    model, x, y, weight = _problem("single-layer")
    grads = ghost_gradients(model, x, y, weight)
    h = torch.ones(USERS, dtype=torch.float64)
    h[3] = 0.0
    agg = ota_aggregate(grads, h, torch.ones(USERS, dtype=torch.bool), _setup(grads.dim, 1.0, 0.1, 1.0),
                        torch.Generator().manual_seed(0))
    assert agg.alignment_gain == 0.0 and agg.participants == 0 and not bool(agg.transmitting.any())
    assert agg.effective_noise_var == math.inf and not bool(agg.aligned_sum.any())
