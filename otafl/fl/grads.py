"""Per-user minibatch gradients for all users in one batched computation (torch.func).

User k's gradient is that of its weighted minibatch loss

    F_k(w) = sum_j weight[k, j] * CE(f_w(x[k, j]), y[k, j]) + (Omega / 2) ||w||^2,

with ``weight[k, j] = 1 / b_k`` on the user's b_k samples and 0 on padding, so F_k is the
mean cross-entropy over the user's minibatch. ``torch.func.vmap`` over the user dimension
computes every g_k(w) at once: no Python loop over users.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap


def param_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's parameters, detached, in registration order."""
    return {name: p.detach() for name, p in model.named_parameters()}


def flatten(tensors: dict[str, Tensor], batch_dims: int = 0) -> Tensor:
    """Concatenate parameter-shaped tensors into ``[*batch, d]`` (registration order)."""
    return torch.cat([t.reshape(*t.shape[:batch_dims], -1) for t in tensors.values()], dim=-1)


def unflatten(flat: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`flatten` for a single (unbatched) vector ``flat: [d]``."""
    out, i = {}, 0
    for name, t in like.items():
        n = t.numel()
        out[name] = flat[i : i + n].view_as(t)
        i += n
    return out


def per_user_gradients(model: nn.Module, x: Tensor, y: Tensor, weight: Tensor, *,
                       weight_decay: float = 0.0) -> tuple[Tensor, Tensor]:
    """Every user's minibatch gradient and loss at the model's current weights.

    Parameters
    ----------
    model : nn.Module
        Evaluated functionally at its current parameters (they are not modified).
    x : [K, b, F] float32
        Each user's minibatch features.
    y : [K, b] int64
        Labels.
    weight : [K, b] float32
        Per-sample loss weights (1/b_k on real samples, 0 on padding).
    weight_decay : float
        Omega; adds Omega * w to every gradient.

    Returns
    -------
    grads : [K, d] float32
        g_k(w_t), flattened in parameter registration order.
    losses : [K] float32
        The users' weighted minibatch cross-entropy (without the regulariser).
    """
    params = param_dict(model)

    def user_loss(p: dict[str, Tensor], xk: Tensor, yk: Tensor, wk: Tensor) -> tuple[Tensor, Tensor]:
        logits = functional_call(model, p, (xk,))
        ce = (torch.nn.functional.cross_entropy(logits, yk, reduction="none") * wk).sum()
        total = ce
        if weight_decay:
            total = total + 0.5 * weight_decay * sum((v * v).sum() for v in p.values())
        return total, ce

    grad_fn = vmap(grad_and_value(user_loss, has_aux=True), in_dims=(None, 0, 0, 0))
    grads, (_, ce) = grad_fn(params, x, y, weight)
    return flatten(grads, batch_dims=1), ce
