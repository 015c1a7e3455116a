r"""Sampling the discrete Gaussian N_Z(0, sigma^2) on torch, batched (docs/model.md#digital).

N_Z(0, sigma^2) has P(X = x) proportional to exp(-x^2 / (2 sigma^2)) on the integers (its
variance is below sigma^2; Canonne, Kamath & Steinke 2020). The sampler is theirs
(Algorithm 3, rejection from a discrete Laplace), vectorised:

1. Proposal: the discrete Laplace with P(Y = y) proportional to exp(-|y| / t),
   t = floor(sigma) + 1, drawn as the difference of two i.i.d. geometric variables
   G = floor(-t log U) (P(G >= k) = exp(-k / t), U uniform on (0, 1]).
2. Accept Y with probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)) (this is
   exp(-Y^2 / (2 sigma^2)) / exp(-|Y| / t) divided by its maximum, so accepted values have
   exactly the target law).
3. Draw a block of candidates for every missing sample, keep the accepted ones, repeat for
   the rest (the acceptance rate is at least 0.45 for every sigma, 0.76 for large sigma, so a few
   passes suffice).

No continuous Gaussian is rounded: the law is the discrete Gaussian itself. Uniforms are
float64 from ``generator`` (the Bernoulli(exp(-gamma)) and geometric steps are comparisons
with float64 uniforms, so probabilities are realised to within 2^-53, as for
``torch.poisson``; CKS's rational arithmetic would remove even that).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

__all__ = ["discrete_gaussian", "discrete_gaussian_pmf", "discrete_gaussian_sum", "sum_table"]

MAX_PASSES = 64
"""Rejection passes before giving up (the acceptance rate is at least 0.45 for every sigma
and each pass draws 1.5 candidates per missing sample, so a pass leaves a given sample
missing with probability about 1/2 at worst; the sampler raises rather than return a
wrong law)."""


def _geometric(n: int, t: float, generator: torch.Generator) -> Tensor:
    """n draws of floor(-t log U), U uniform on (0, 1]: P(G >= k) = exp(-k / t)."""
    u = torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device)
    return torch.floor(-t * torch.log1p(-u))  # 1 - u is uniform on (0, 1]


def discrete_gaussian(shape, sigma2: float, generator: torch.Generator) -> Tensor:
    """i.i.d. N_Z(0, sigma2) of the given shape, float64 integers on ``generator``'s device
    (module docstring). ``sigma2 <= 0`` gives zeros."""
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    total = math.prod(shape)
    out = torch.zeros(total, dtype=torch.float64, device=generator.device)
    if sigma2 <= 0.0 or total == 0:
        return out.view(shape)
    sigma = math.sqrt(sigma2)
    t = math.floor(sigma) + 1.0
    centre = sigma2 / t
    missing = torch.arange(total, device=generator.device)
    for _ in range(MAX_PASSES):
        m = missing.numel()
        # a little more than needed, so that most passes end the loop (acceptance >= ~0.5)
        draws = m + m // 2 + 16
        y = _geometric(draws, t, generator) - _geometric(draws, t, generator)
        accept = torch.rand(draws, generator=generator, dtype=torch.float64, device=generator.device)
        ok = accept < torch.exp(-(y.abs() - centre) ** 2 / (2.0 * sigma2))
        good = y[ok]
        k = min(m, good.numel())
        out[missing[:k]] = good[:k]
        missing = missing[k:]
        if missing.numel() == 0:
            return out.view(shape)
    raise RuntimeError(f"discrete_gaussian: rejection did not finish in {MAX_PASSES} passes (sigma2 = {sigma2})")


def discrete_gaussian_pmf(x, sigma2: float):
    """The exact pmf of N_Z(0, sigma2) at integers ``x`` (numpy float64 array), normalised by
    the sum over |y| <= 60 sigma + 60 (the rest weighs below 1e-700 relative)."""
    import numpy as np

    sigma = math.sqrt(sigma2)
    half = int(60 * sigma + 60)
    y = np.arange(-half, half + 1, dtype=np.float64)
    norm = np.exp(-y * y / (2 * sigma2)).sum()
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-x * x / (2 * sigma2)) / norm


SUM_TAIL_SIGMAS = 20.0
"""The law of a sum of n shares is tabulated on |x| <= 20 sqrt(n) sigma + 20 (every share is
sub-Gaussian with variance proxy sigma^2, so the mass outside is below 2 exp(-200) ~ 1e-87)."""

SUM_TABLE_MAX = 1 << 21
"""Largest table (support points, 16 MiB) :func:`sum_table` builds; larger sums are drawn share by
share. With the cache of 32 tables that bounds its memory by 512 MiB (a table of the paper
preset's sizes is about 1 MiB)."""


@functools.lru_cache(maxsize=32)
def sum_table(n: int, sigma2: float):
    """(lowest value, cdf [L] float64 tensor, CPU) of the sum of n i.i.d. N_Z(0, sigma2), or None
    when its support would exceed SUM_TABLE_MAX points.

    The pmf is the n-th power of one share's characteristic function (a real FFT of the
    share's pmf on a grid wide enough that nothing wraps round), transformed back, clipped at
    zero and normalised: the law of the sum up to float64 rounding (tested against direct
    convolution: below 1e-12 in total variation for small n; about 1e-13 measured at n = 200,
    per-share variance 2500; the error grows slowly with the table's width)."""
    import numpy as np

    sigma = math.sqrt(sigma2)
    half = int(math.ceil(SUM_TAIL_SIGMAS * sigma * math.sqrt(n) + SUM_TAIL_SIGMAS))
    width = 2 * half + 1
    if width > SUM_TABLE_MAX:
        return None
    size = 1 << (width - 1).bit_length()
    share_half = min(half, int(math.ceil(SUM_TAIL_SIGMAS * sigma + SUM_TAIL_SIGMAS)))
    y = np.arange(-share_half, share_half + 1, dtype=np.float64)
    share = np.exp(-y * y / (2.0 * sigma2))
    share /= share.sum()
    grid = np.zeros(size)
    grid[y.astype(np.int64) % size] = share  # circular: negative values wrap to the top
    total = np.fft.irfft(np.fft.rfft(grid) ** n, n=size)
    pmf = np.concatenate([total[size - half:], total[:half + 1]])  # values -half .. half
    pmf = np.clip(pmf, 0.0, None)
    cdf = np.cumsum(pmf)
    cdf /= cdf[-1]
    return -half, torch.from_numpy(cdf)


def discrete_gaussian_sum(shape, n: int, sigma2: float, generator: torch.Generator) -> Tensor:
    """i.i.d. draws of Z_1 + ... + Z_n, Z_k ~ N_Z(0, sigma2), of the given shape (float64
    integers): by inversion of :func:`sum_table`'s cdf with one float64 uniform per draw, or
    share by share (:func:`discrete_gaussian`) where no table is built."""
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    if n <= 0 or sigma2 <= 0.0:
        return torch.zeros(shape, dtype=torch.float64, device=generator.device)
    table = sum_table(int(n), float(sigma2))
    if table is None:
        return discrete_gaussian((int(n),) + shape, sigma2, generator).sum(0)
    low, cdf = table
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device)
    idx = torch.searchsorted(cdf.to(u.device), u.reshape(-1), right=True)
    return (idx.clamp_(max=cdf.numel() - 1).to(torch.float64) + low).view(shape)
