"""The server update: the registered optimizers and the flat gradient buffer they read.

The server writes each round's gradient estimate g_hat into one flat [d] buffer whose
slices are the parameters' ``.grad`` and takes one optimizer step (docs/model.md#update).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from otafl.errors import OtaflInputError


def _adam(params, *, lr: float) -> torch.optim.Optimizer:
    """Adam, fused (one kernel per step)."""
    return torch.optim.Adam(params, lr=lr, fused=True)


def _sgd(params, *, lr: float) -> torch.optim.Optimizer:
    """Plain gradient descent w <- w - lr g_hat."""
    return torch.optim.SGD(params, lr=lr)


#: Server optimizers by name (``train.optimizer``): ``fn(params, *, lr) -> Optimizer``.
from otafl.names import OPTIMIZERS  # noqa: E402 (the names, torch-free; entries resolve here)


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """The registered server optimizer ``name`` over ``params``."""
    if name not in OPTIMIZERS:
        raise OtaflInputError(f"train.optimizer = {name!r} is not one of: {', '.join(sorted(OPTIMIZERS))}")
    return OPTIMIZERS[name](params, lr=lr)


def bind_flat_grad(params: list[torch.nn.Parameter]) -> Tensor:
    """One zeroed [d] buffer whose consecutive slices are the parameters' ``.grad`` (views).

    The server writes each round's gradient estimate into it with a single ``copy_``; the
    optimizer reads the parameters' gradients from it. Nothing may replace ``p.grad`` (no
    ``zero_grad(set_to_none=True)``) while it is bound. All parameters share a dtype/device.
    """
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat
