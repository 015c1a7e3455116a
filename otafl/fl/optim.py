"""The server update: the registered optimizers and the flat gradient buffer they read.

The server writes each round's gradient estimate g_hat into one flat [d] buffer whose
slices are the parameters' ``.grad`` and takes one optimizer step (docs/model.md#update).
"""

from __future__ import annotations

import torch
from torch import Tensor

from otafl.errors import OtaflInputError


class _Adam:
    """Adam, fused (one kernel per step): torch's own ``torch.optim.adam.adam`` kernel on state
    kept here, bit for bit ``torch.optim.Adam(params, lr=lr, fused=True)``
    (tests/test_optim.py).

    Not the ``torch.optim.Adam`` class: its ``__init__`` and ``step`` import ``torch._dynamo``
    (torch.compile's machinery, 1-3 s on a 2-core machine) in every process that trains, and
    nothing here compiles."""

    def __init__(self, params, *, lr: float) -> None:
        self.params = list(params)
        self.lr = lr
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
        # the fused kernel keeps (and increments) its step counters as float32 tensors on the
        # parameters' device, as torch.optim.Adam's fused state does
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        from torch.optim.adam import adam

        adam(self.params, [p.grad for p in self.params], self.exp_avgs, self.exp_avg_sqs, [], self.steps,
             fused=True, amsgrad=False, beta1=0.9, beta2=0.999, lr=self.lr, weight_decay=0.0, eps=1e-8,
             maximize=False)


class _SGD:
    """Plain gradient descent w <- w - lr g_hat: ``torch.optim.SGD(params, lr=lr)``'s update
    (``param.add_(grad, alpha=-lr)``), without its ``torch._dynamo`` import (see :class:`_Adam`)."""

    def __init__(self, params, *, lr: float) -> None:
        self.params = list(params)
        self.lr = lr

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            p.add_(p.grad, alpha=-self.lr)


def _adam(params, *, lr: float) -> _Adam:
    """Adam, fused (one kernel per step), torch's defaults (betas 0.9 / 0.999, eps 1e-8)."""
    return _Adam(params, lr=lr)


def _sgd(params, *, lr: float) -> _SGD:
    """Plain gradient descent w <- w - lr g_hat."""
    return _SGD(params, lr=lr)


#: Server optimizers by name (``train.optimizer``): ``fn(params, *, lr) -> Optimizer``.
from otafl.names import OPTIMIZERS  # noqa: E402 (the names, torch-free; entries resolve here)


def make_optimizer(name: str, params, lr: float):
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
