"""Model presets (otafl.models): shapes, sizes, seeded init, torch.func compatibility."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from otafl.errors import OtaflInputError
from otafl.models import MODELS, make_model, num_parameters


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_maps_features_to_float32_logits(name):
    model = make_model(name, 12, 5, hidden=7, generator=gen(0))
    out = model(torch.randn(3, 12, generator=gen(1)))
    assert out.shape == (3, 5) and out.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("name, expected", [
    ("single-layer", 7850),                          # 784 * 10 + 10
    ("two-layer", 784 * 100 + 100 + 100 * 10 + 10),  # 79,510
])
def test_mnist_parameter_counts(name, expected):
    assert num_parameters(make_model(name, 784, 10, generator=gen(0))) == expected


def test_parameter_count_formula_for_other_sizes():
    assert num_parameters(make_model("single-layer", 64, 3, generator=gen(0))) == 64 * 3 + 3
    assert num_parameters(make_model("two-layer", 64, 3, hidden=9, generator=gen(0))) == (
        64 * 9 + 9 + 9 * 3 + 3)


def test_single_layer_has_no_hidden_layer():
    model = make_model("single-layer", 6, 4, generator=gen(0))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 1 and linears[0].weight.shape == (4, 6)
    x = torch.randn(2, 6, generator=gen(2))
    torch.testing.assert_close(model(x), x @ linears[0].weight.T + linears[0].bias)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_generator_seed_gives_identical_weights(name):
    a = make_model(name, 20, 4, hidden=8, generator=gen(7)).state_dict()
    b = make_model(name, 20, 4, hidden=8, generator=gen(7)).state_dict()
    c = make_model(name, 20, 4, hidden=8, generator=gen(8)).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any(torch.equal(a[k], c[k]) for k in a)


def test_init_leaves_global_rng_untouched_and_default_is_deterministic():
    state = torch.get_rng_state()
    first = make_model("two-layer", 10, 3, hidden=5)
    assert torch.equal(torch.get_rng_state(), state)
    second = make_model("two-layer", 10, 3, hidden=5)
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters()))


def test_init_follows_pytorch_default_uniform_law():
    """Weights ~ U(-1/sqrt(784), 1/sqrt(784)): all inside the bound, variance bound^2 / 3.

    78,400 draws (seed 0): the relative standard error of the sample variance of a
    uniform is sqrt(0.8 / n) = 0.32%; tolerance 3% is about 9 of them.
    """
    w = make_model("two-layer", 784, 10, generator=gen(0)).hidden.weight.detach()
    bound = 1 / math.sqrt(784)
    assert float(w.abs().max()) <= bound
    assert float(w.abs().max()) > 0.99 * bound
    assert float(w.var()) == pytest.approx(bound**2 / 3, rel=0.03)
    assert abs(float(w.mean())) < 0.05 * bound


@pytest.mark.parametrize("name", sorted(MODELS))
def test_vmap_grad_over_users_matches_per_user_autograd(name):
    """Per-user gradients for K users at once, as fl/grads.py computes them."""
    users, batch, features, classes = 4, 6, 10, 3
    model = make_model(name, features, classes, hidden=8, generator=gen(0))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(users, batch, features, generator=gen(1))
    y = torch.randint(classes, (users, batch), generator=gen(2))

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    per_user = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for k in range(users):
        model.zero_grad()
        F.cross_entropy(model(x[k]), y[k]).backward()
        for pname, param in model.named_parameters():
            assert per_user[pname].shape == (users, *param.shape)
            torch.testing.assert_close(per_user[pname][k], param.grad, rtol=1e-5, atol=1e-6)


def test_unknown_model_lists_allowed_names():
    with pytest.raises(OtaflInputError) as err:
        make_model("resnet", 784, 10)
    assert "resnet" in str(err.value)
    for name in MODELS:
        assert name in str(err.value)


@pytest.mark.parametrize("kwargs, match", [
    (dict(hidden=0), r"hidden = 0 .*\[1, inf\)"),
    (dict(hidden=-2), "hidden"),
    (dict(hidden=2.5), "hidden"),
    (dict(in_features=0), "in_features"),
    (dict(num_classes=0), "num_classes"),
])
def test_invalid_sizes_raise(kwargs, match):
    args = dict(in_features=784, num_classes=10) | kwargs
    with pytest.raises(OtaflInputError, match=match):
        make_model("two-layer", args.pop("in_features"), args.pop("num_classes"), **args)
