"""Batched minibatch sampling: every user's minibatch drawn at once, without a loop over users.

:func:`sample_minibatches` returns indices into the training set; :func:`gather_rows` turns
them into the [K, b, ...] features and labels.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from otafl.data.container import _check_int
from otafl.data.splits import UserSplit


def gather_rows(table: Tensor, idx: Tensor, *, buffer: Tensor | None = None) -> Tensor:
    """``table[idx]`` for an index tensor ``idx`` [n, b]: [n, b, *table.shape[1:]].

    ``index_select`` on the flattened index: a plain row copy, which on the CPU is faster
    than advanced indexing and gives the same result. ``buffer`` (a flat tensor of
    ``table``'s dtype and device with at least ``idx.numel() * row size`` elements, e.g. from
    :class:`RowBuffer`): the rows are copied into its prefix, which the result then views
    (the same values; it saves the first-touch page faults of a fresh allocation, which at
    K = 10^4 cost 4x the copy itself). The result is only valid until the buffer is reused.
    """
    shape = (*idx.shape, *table.shape[1:])
    if buffer is None:
        return table.index_select(0, idx.reshape(-1)).view(shape)
    out = buffer[: idx.numel() * math.prod(table.shape[1:])].view(idx.numel(), *table.shape[1:])
    torch.index_select(table, 0, idx.reshape(-1), out=out)
    return out.view(shape)


class RowBuffer:
    """A reusable flat buffer for :func:`gather_rows` (grown by a quarter beyond the request
    when too small; one per table, reused round after round)."""

    def __init__(self) -> None:
        self._buf: Tensor | None = None

    def gather(self, table: Tensor, idx: Tensor) -> Tensor:
        need = idx.numel() * math.prod(table.shape[1:])
        buf = self._buf
        if buf is None or buf.numel() < need or buf.dtype != table.dtype or buf.device != table.device:
            buf = self._buf = torch.empty(need + need // 4, dtype=table.dtype, device=table.device)
        return gather_rows(table, idx, buffer=buf)


def sample_minibatches(split: UserSplit, batch_size: int, generator: torch.Generator, *,
                       replacement: bool = False) -> tuple[Tensor, Tensor]:
    """Draw every user's minibatch at once (no Python loop over users).

    Without replacement (default), user k takes b_k = min(b, D_k) distinct samples of
    its own D_k, uniformly at random: each valid slot j < D_k of ``split.index[k]`` gets
    an independent U(0, 1) key, padding slots get the key 2, and the b_k smallest keys
    win (a uniformly random b_k-subset, as in a random permutation's first b_k entries).
    With ``replacement=True`` every user takes b i.i.d. uniform draws from its D_k
    samples: slot = floor(U D_k).

    The weights turn per-sample losses into each user's minibatch mean,

        L_k = sum_j weight[k, j] * loss(idx[k, j]),   weight[k, j] = 1{j < b_k} / b_k,

    so ``weight`` sums to one for every user and padding positions (j >= b_k, which
    occur when D_k < b) carry weight 0 while pointing at a valid sample of user k.

    Parameters
    ----------
    split : UserSplit
        ``index`` [K, max_D] and ``counts`` [K] (D_k >= 1).
    batch_size : int >= 1
        b, the minibatch size per user.
    generator : torch.Generator
        On the device of ``split``.
    replacement : bool
        Draw with replacement instead (all b positions valid, weight 1/b).

    Returns
    -------
    idx : [K, b], int64
        Training-set indices.
    weight : [K, b], float32
        Averaging weights as above.
    """
    b = _check_int("batch_size", batch_size, 1, None)
    index, counts = split.index, split.counts
    k_users, max_d = index.shape
    device = index.device

    if replacement:
        u = torch.rand(k_users, b, generator=generator, device=device)
        slot = torch.minimum((u * counts.unsqueeze(1)).to(torch.int64), (counts - 1).unsqueeze(1))
        weight = torch.full((k_users, b), 1.0 / b, dtype=torch.float32, device=device)
        return index.gather(1, slot), weight

    taken = min(b, max_d)
    keys = torch.rand(k_users, max_d, generator=generator, device=device)
    is_padding = torch.arange(max_d, device=device).unsqueeze(0) >= counts.unsqueeze(1)
    keys = keys.masked_fill(is_padding, 2.0)
    slot = torch.topk(keys, taken, dim=1, largest=False, sorted=True).indices
    idx = index.gather(1, slot)
    if taken < b:  # b exceeds every D_k: pad the extra columns with each user's first sample
        idx = torch.cat([idx, index[:, :1].expand(k_users, b - taken)], dim=1)
    per_user = torch.clamp(counts, max=b)
    valid = torch.arange(b, device=device).unsqueeze(0) < per_user.unsqueeze(1)
    weight = valid.to(torch.float32) / per_user.unsqueeze(1).to(torch.float32)
    return idx, weight
