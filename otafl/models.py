"""Model presets: softmax regression and a one-hidden-layer ReLU network.

The system model trains a model w in R^d with cross-entropy loss. Two presets, as in the
paper's experiments:

* ``single-layer``: softmax regression, logits = W x + b with W in R^{C x F}; no hidden
  layer. d = F C + C (7,850 for MNIST, F = 784, C = 10).
* ``two-layer``: logits = W2 relu(W1 x + b1) + b2 with H hidden units;
  d = F H + H + H C + C (79,510 for MNIST with H = 100).

Both return logits [B, C] (no softmax; pair them with ``torch.nn.functional.cross_entropy``)
and are plain ``nn.Sequential`` stacks of ``nn.Linear``, so ``torch.func.functional_call``
with ``vmap(grad(...))`` gives per-user gradients for all users at once.

Initialisation is a function of an explicit ``torch.Generator``: every weight and bias is
drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the same law as PyTorch's default
``nn.Linear`` init (``kaiming_uniform_(a=sqrt(5))`` gives bound gain * sqrt(3 / fan_in)
with gain = sqrt(2 / (1 + 5)), i.e. 1/sqrt(fan_in)), but without touching the global RNG.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from otafl.errors import OtaflInputError, out_of_range

__all__ = ["MODELS", "make_model", "num_parameters"]


def _linear(in_features: int, out_features: int, generator: torch.Generator) -> nn.Linear:
    """``nn.Linear`` with weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from ``generator``.

    ``skip_init`` builds the layer without running its default initialisation, so no
    global random state is consumed.
    """
    layer = nn.utils.skip_init(nn.Linear, in_features, out_features, dtype=torch.float32)
    bound = 1.0 / math.sqrt(in_features)
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        layer.bias.uniform_(-bound, bound, generator=generator)
    return layer


def _single_layer(in_features: int, num_classes: int, hidden: int,
                  generator: torch.Generator) -> nn.Module:
    """Softmax regression: one linear layer [F] -> [C]; ``hidden`` is unused."""
    del hidden
    return nn.Sequential(OrderedDict(linear=_linear(in_features, num_classes, generator)))


def _two_layer(in_features: int, num_classes: int, hidden: int,
               generator: torch.Generator) -> nn.Module:
    """Linear [F] -> [H], ReLU, Linear [H] -> [C]."""
    return nn.Sequential(OrderedDict(
        hidden=_linear(in_features, hidden, generator),
        relu=nn.ReLU(),
        output=_linear(hidden, num_classes, generator),
    ))


#: Model registry: name -> builder(in_features, num_classes, hidden, generator) -> nn.Module.
#: The names live in :mod:`otafl.names` (torch-free, for spec validation); entries resolve here.
from otafl.names import MODELS  # noqa: E402


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise out_of_range(name, value, "[1, inf) (an integer)")
    return value


def make_model(name: str, in_features: int, num_classes: int, *, hidden: int = 100,
               generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> nn.Module:
    """Build a model preset from :data:`MODELS` with seeded initial weights.

    Parameters
    ----------
    name : str
        ``single-layer`` or ``two-layer`` (``sorted(MODELS)``).
    in_features : int >= 1
        F, the flat input size (784 for MNIST).
    num_classes : int >= 1
        C, the number of logits.
    hidden : int >= 1
        H, hidden units of ``two-layer`` (checked but unused by ``single-layer``).
    generator : torch.Generator (CPU), optional
        Source of the initial weights. ``None`` means ``torch.Generator().manual_seed(0)``,
        so the result never depends on global random state.
    device : torch.device or str
        Where the float32 parameters live (drawn on the CPU, then moved).

    Returns
    -------
    nn.Module
        Maps x [B, F] float32 to logits [B, C] float32.
    """
    if name not in MODELS:
        raise OtaflInputError(
            f"model = {name!r} is not one of the allowed names: {', '.join(sorted(MODELS))}")
    in_features = _positive_int("in_features", in_features)
    num_classes = _positive_int("num_classes", num_classes)
    hidden = _positive_int("hidden", hidden)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    return MODELS[name](in_features, num_classes, hidden, generator).to(device)


def num_parameters(model: nn.Module) -> int:
    """d, the number of scalar parameters of ``model`` (the dimension of w)."""
    return sum(p.numel() for p in model.parameters())
