"""Materialised layer gradients, a cache-sized block of users at a time (for :mod:`otafl.fl.grads`).

A linear layer's per-user gradient G_k = sum_j delta_kj a_kj^T ([F_out, F_in]) is formed only
where :func:`otafl.fl.grads.layer_method` finds that cheaper than Gram matrices. While the n
users' G_k are few (:data:`KEEP_FLOATS` numbers) :func:`otafl.fl.grads.ghost_gradients` keeps
them; beyond that (at K = 10^4 users, single-layer MNIST shape: ~150 MiB a round, whose
first-touch page faults cost more than the product) they are formed here, :data:`BLOCK_FLOATS`
numbers at a time in one reused buffer, and each block is reduced while still in cache: to its
squared norms, and, given the clip norm, to its share of the clipped sum.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import Tensor

#: Most numbers of materialised layer gradients [n, F_out, F_in] kept for the weighted sum
#: (2^22: 16 MiB in float32, a single-layer MNIST model up to 535 users; coef @ G is then the
#: cheaper sum).
KEEP_FLOATS = 2**22

#: Floats of one block of materialised layer gradients (2^18: 1 MiB in float32, about one
#: core's L2 cache here).
BLOCK_FLOATS = 2**18


def _blocks(delta: Tensor, a: Tensor) -> Iterator[tuple[int, int, Tensor]]:
    """(start, stop, G [stop - start, F_out F_in]) of consecutive blocks of users; each G is
    valid until the next one (one buffer)."""
    n, _, f_out = delta.shape
    f_in = a.shape[-1]
    per_block = min(n, max(8, BLOCK_FLOATS // (f_out * f_in)))
    buf = delta.new_empty(per_block, f_out, f_in)
    for start in range(0, n, per_block):
        stop = min(n, start + per_block)
        yield start, stop, torch.bmm(delta[start:stop].transpose(1, 2), a[start:stop],
                                     out=buf[: stop - start]).flatten(1)


def materialised_squares(delta: Tensor, a: Tensor) -> Tensor:
    """||G_k||_F^2 [n] for delta [n, b, F_out], a [n, b, F_in], block by block."""
    out = delta.new_empty(delta.shape[0])
    for start, stop, gw in _blocks(delta, a):
        torch.linalg.vecdot(gw, gw, out=out[start:stop])
    return out


def clipped_pass(delta: Tensor, a: Tensor, block_norms: Callable[[int, int, Tensor], Tensor],
                 clip: float) -> tuple[Tensor, Tensor, Tensor]:
    """One pass over the blocks: ||G_k||_F^2 [n], the clip factors c_k = L / max(||g_k||, L) [n]
    and vec(sum_k c_k G_k) [F_out F_in].

    ``block_norms(start, stop, squares)`` gives the whole gradient norms ||g_k|| of users
    start..stop-1 from this layer's squared norms of theirs (the other layers' parts and weight
    decay are the caller's), so that the clipped sum is accumulated while each block is in cache.
    """
    n, f_out, f_in = delta.shape[0], delta.shape[-1], a.shape[-1]
    squares, factor = delta.new_empty(n), delta.new_empty(n)
    total = delta.new_zeros(f_out * f_in)
    for start, stop, gw in _blocks(delta, a):
        torch.linalg.vecdot(gw, gw, out=squares[start:stop])
        c = clip / block_norms(start, stop, squares[start:stop]).clamp(min=clip)
        factor[start:stop] = c
        total.addmv_(gw.T, c)
    return squares, factor, total
