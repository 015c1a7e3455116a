r"""Random rotation by a fast Walsh-Hadamard transform, batched over users.

The digital mechanisms need every coordinate of a user's vector to be small (a bounded
per-coordinate range for the modular sum, the PBM's box [-c, c]); rotating by a random
orthonormal map spreads a vector of norm L over all D coordinates (docs/model.md#digital):

    R x = H_D (xi * x) / sqrt(D),       R^{-1} y = xi * (H_D y) / sqrt(D),

with x zero-padded from d to D = 2^k coordinates, xi in {-1, +1}^D random signs and H_D the
Sylvester-Hadamard matrix (H_D^2 = D I). For a fixed x each coordinate of R x is a Rademacher
sum, so P(|(R x)_j| > t) <= 2 exp(-t^2 D / (2 ||x||^2)) and, by a union bound,
max_j |(R x)_j| <= ||x|| sqrt(2 ln(2D / beta) / D) with probability >= 1 - beta.

H_D = H_{f_1} (x) ... (x) H_{f_r} (Kronecker) with factors of at most 2^5, so the transform
is r small matrix products over the [n, D] batch: O(n D sum_i f_i) flops in a few batched
GEMMs instead of log2(D) memory-bound butterfly passes (for D = 8192, factors 16, 16, 32:
about 3 ms for 200 users on one core, against 50 ms for the butterflies).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

__all__ = ["padded_dim", "hadamard_factors", "fwht", "random_signs", "rotation_columns", "rotate", "unrotate",
           "coordinate_bound"]

MAX_FACTOR_LOG2 = 5


def padded_dim(dim: int) -> int:
    """D = the smallest power of two >= d."""
    return 1 << max(0, int(dim) - 1).bit_length()


def hadamard_factors(D: int) -> list[int]:
    """Balanced factor sizes (powers of two, each <= 2^5, smallest first) with product D: the
    largest factor is applied last, along the contiguous axis, as one plain GEMM (about 10%
    faster than largest first at D = 8192)."""
    k = int(D).bit_length() - 1
    if 1 << k != D:
        raise ValueError(f"D = {D} is not a power of two")
    parts = max(1, math.ceil(k / MAX_FACTOR_LOG2))
    sizes = [k // parts + (1 if i < k % parts else 0) for i in range(parts)]
    return sorted(1 << s for s in sizes if s > 0) or [1]


@functools.lru_cache(maxsize=32)
def _hadamard(size: int, dtype: torch.dtype, device: str) -> Tensor:
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h.to(device)


def fwht(x: Tensor) -> Tensor:
    """Unnormalised Walsh-Hadamard transform H_D x along the last dimension (D a power of two).

    x : [..., D]. Returns a new [..., D] tensor of the same dtype (H_D^2 = D I).
    """
    D = x.shape[-1]
    lead = x.shape[:-1]
    factors = hadamard_factors(D)
    y = x.reshape(-1, D)
    left, right = y.shape[0], D
    for f in factors:  # y viewed as [left, f, right / f]: apply H_f to the middle index
        right //= f
        if f == 1:
            continue
        h = _hadamard(f, x.dtype, str(x.device))
        y = y.reshape(left, f) @ h if right == 1 else torch.matmul(h, y.reshape(left, f, right))
        left *= f
    return y.reshape(*lead, D)


def random_signs(D: int, generator: torch.Generator, dtype=torch.float32) -> Tensor:
    """xi: [D] independent uniform signs in {-1, +1} (one draw of D bits from ``generator``)."""
    bits = torch.randint(0, 2, (D,), generator=generator, device=generator.device)
    return (2 * bits - 1).to(dtype)


def rotation_columns(signs: Tensor, dim: int, scale: float = 1.0, dtype=None) -> Tensor:
    """[dim] ``scale`` xi_j / sqrt(D): what the first ``dim`` padded coordinates are multiplied
    by before H_D, so that ``scale`` R x = fwht(pad(x * rotation_columns(...)))."""
    D = signs.numel()
    return signs.to(dtype or signs.dtype)[:dim] * (float(scale) / math.sqrt(D))


def rotate(x: Tensor, signs: Tensor, scale: float = 1.0) -> Tensor:
    """``scale`` R x for x: [n, d] (zero-padded to D = signs.numel()); returns [n, D].

    The signs, 1/sqrt(D) and ``scale`` are applied in the one pass that pads x."""
    D, d = signs.numel(), x.shape[-1]
    padded = x.new_zeros(*x.shape[:-1], D)
    torch.mul(x, rotation_columns(signs, d, scale, x.dtype), out=padded[..., :d])
    return fwht(padded)


def unrotate(y: Tensor, signs: Tensor, dim: int) -> Tensor:
    """R^{-1} y for y: [..., D], truncated to the first ``dim`` coordinates."""
    D = signs.numel()
    return (fwht(y) * signs.to(y.dtype) / math.sqrt(D))[..., :dim]


def coordinate_bound(*, norm: float, coordinates: int, failure: float) -> float:
    """c = norm sqrt(2 ln(2 D / beta) / D): all coordinates of R x lie in [-c, c] with
    probability >= 1 - beta for ||x|| <= norm (module docstring)."""
    D = float(coordinates)
    return float(norm) * math.sqrt(2.0 * math.log(2.0 * D / failure) / D)
