r"""A least-squares model and the crafted data sets of ``otafl audit-run`` (docs/privacy/auditing.md#auditing).

The model is linear, w in R^d without bias, and a record (x_j, y_j) has the loss
l_j(w) = (1/2) (y_j - x_j . w)^2, whose gradient is -(y_j - x_j . w) x_j: a record's gradient
always points along its own x_j, which the cross-entropy presets cannot arrange. The audit
feeds it to the simulator's own functions: :func:`least_squares_sums` has the signature of
:func:`otafl.fl.local.clipped_gradient_sums` (the ``gradient_sums`` hook of
:class:`~otafl.fl.local.LocalSteps`), :func:`user_gradients` returns the FedSGD users' minibatch
gradients as the round's aggregators take them.

:func:`audit_records` builds the neighbouring data sets (docs/privacy/auditing.md#auditing):

* the **canary** (target user): x = e_c, y = +CANARY_TARGET, so that its per-example gradient,
  -(y - w_c) e_c, is clipped to exactly -C e_c (local steps) or -L e_c (FedSGD) along the canary
  coordinate c; in its place the neighbour holds a **null** record (x = 0, y = 0: gradient 0) for
  the local steps' add/remove relation, or the **mirrored** canary (y = -CANARY_TARGET: +L e_c)
  for FedSGD's replace-one relation (sensitivity 2L). The user's record count D_k is the same
  in both, so the public normaliser q D_k is too.
* **curvature** (``audit.curvature`` kappa > 0): the target's other records have the loss
  (kappa / 2) w_c^2, so its local steps' gradients move with the model it starts from (and with
  SCAFFOLD's correction c - c_k): a later round then reveals what the earlier rounds' state holds.
* **noise-cancelling** co-users: every record x = sqrt(lambda) e_c, y = 0 with
  lambda = 1 / eta_l, so the loss is (lambda / 2) w_c^2; started at w = 0, each DP-SGD step with
  q = 1 resets the co-user's model to the optimum minus that step's fresh noise, and its update
  carries only its last step's noise. ``null`` co-users hold null records only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from otafl.fl.grads import StackedGradients

__all__ = ["CANARY_TARGET", "CO_USERS", "AuditRecords", "audit_records", "least_squares_model",
           "least_squares_sums", "user_gradients"]

CANARY_TARGET = 1.0e6
"""|y| of the canary record: its gradient's norm stays near 1e6, far above any clip."""

from otafl.privacy.names import CO_USERS  # noqa: E402 (the names, torch-free; audit.co_users)


def least_squares_model(dim: int, *, dtype=torch.float64, device="cpu") -> nn.Module:
    """The linear model w in R^d (no bias), started at w = 0."""
    model = nn.Linear(dim, 1, bias=False, dtype=dtype, device=device)
    with torch.no_grad():
        model.weight.zero_()
    return model


def _per_example(weights: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Per-example gradients [..., b, d] and losses [..., b] at weights [..., d]."""
    x = x.to(weights.dtype)
    residual = y.to(weights.dtype) - torch.matmul(x, weights[..., :, None])[..., 0]
    return -residual[..., None] * x, 0.5 * residual.square()


def least_squares_sums(model: nn.Module, weights: Tensor, x: Tensor, y: Tensor, mask: Tensor, clip: float, *,
                       method: str = "auto") -> tuple[Tensor, Tensor]:
    """:func:`otafl.fl.local.clipped_gradient_sums` for the least-squares loss: weights [n, d],
    x [n, b, d], y [n, b] float, mask [n, b]; returns sum_j mask_j min(1, C / ||g_j||) g_j [n, d]
    and the summed losses [n]. ``model`` and ``method`` are unused (one closed form)."""
    del model, method
    g, loss = _per_example(weights, x, y)
    mask = mask.to(weights.dtype)
    factor = clip / torch.linalg.vector_norm(g, dim=-1).clamp(min=clip) * mask
    return torch.bmm(factor[:, None, :], g)[:, 0], (loss * mask).sum(1)


def user_gradients(weights: Tensor, x: Tensor, y: Tensor, index: Tensor, counts: Tensor) -> StackedGradients:
    """FedSGD: every listed user's gradient of its mean loss over its records (the minibatch is
    the whole of its D_k records), unclipped, as StackedGradients (the aggregator clips).
    index [n, max_D], counts [n]."""
    valid = (torch.arange(index.shape[1], device=index.device)[None, :] < counts[:, None]).to(weights.dtype)
    g, loss = _per_example(weights.expand(index.shape[0], -1), x[index], y[index])
    weight = valid / counts[:, None].to(weights.dtype)
    return StackedGradients(torch.einsum("nb,nbd->nd", weight, g), (loss * weight).sum(1))


@dataclass(frozen=True)
class AuditRecords:
    """The crafted records of both neighbouring data sets in one training set.

    x [N, d], y [N] (float64).  ``users(present)``: (index [K, D], counts [K]) of the data set
    with the canary (``present=True``) or with its neighbour record. ``target``: the user holding it.
    """

    x: Tensor
    y: Tensor
    index_present: Tensor
    index_absent: Tensor
    counts: Tensor
    target: int

    def users(self, present: bool) -> tuple[Tensor, Tensor]:
        return (self.index_present if present else self.index_absent), self.counts


def audit_records(*, users: int, records: int, dim: int, canary: int, target: int, co_users: str,
                  neighbour: str, local_lr: float, curvature: float = 0.0, device="cpu") -> AuditRecords:
    """The records of :func:`least_squares_model`'s audit (module docstring).

    users K, records D per user, canary coordinate c, target user, co_users (:data:`CO_USERS`),
    neighbour ``null`` (add/remove) or ``mirror`` (replace-one), local_lr eta_l (sets lambda),
    curvature kappa: the target's other records have the loss (kappa / 2) w_c^2 (x = sqrt(kappa) e_c,
    y = 0; 0: null records), so that its gradients move with its local model.
    Rows: user k's records are k D .. k D + D - 1 (the target's first one is the canary); row
    K D is the neighbour's record in its place.
    """
    f64 = dict(dtype=torch.float64, device=device)
    x = torch.zeros(users * records + 1, dim, **f64)
    y = torch.zeros(users * records + 1, **f64)
    if co_users == "noise-cancelling":
        x[:, canary] = math.sqrt(1.0 / local_lr)  # lambda = 1 / eta_l; y = 0: the optimum is w_c = 0
    elif co_users != "null":
        raise ValueError(f"co_users = {co_users!r}")
    rows = slice(target * records, (target + 1) * records)
    x[rows] = 0.0  # the target's other records are null, or of loss (kappa / 2) w_c^2
    if curvature > 0:
        x[rows, canary] = math.sqrt(curvature)
    first = target * records
    x[first, canary], y[first] = 1.0, CANARY_TARGET
    last = users * records  # the neighbour's record
    x[last] = 0.0
    if neighbour == "mirror":
        x[last, canary], y[last] = 1.0, -CANARY_TARGET
    elif neighbour != "null":
        raise ValueError(f"neighbour = {neighbour!r}")
    index = torch.arange(users * records, device=device).view(users, records)
    absent = index.clone()
    absent[target, 0] = last
    counts = torch.full((users,), records, dtype=torch.int64, device=device)
    return AuditRecords(x=x, y=y, index_present=index, index_absent=absent, counts=counts, target=target)
