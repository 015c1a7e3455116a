"""Concentration of the number of participants |K_t| = sum_k Bernoulli(p_k).

Functions here are pure and batched: leading dimensions of ``p`` are a sweep grid,
the last dimension indexes users.
"""

from __future__ import annotations

import torch


def poisson_binomial_pmf(p: torch.Tensor) -> torch.Tensor:
    """Exact law of the number of successes among independent Bernoulli(p_k) coins.

    Parameters
    ----------
    p : [..., K], float
        Success probability of each of K independent coins, in [0, 1].

    Returns
    -------
    pmf : [..., K + 1], float64
        ``pmf[..., n] = P(sum_k X_k = n)``, computed by the O(K^2) dynamic-programming
        recursion pmf_j(n) = (1 - p_j) pmf_{j-1}(n) + p_j pmf_{j-1}(n - 1), on the
        device of ``p``. Every step is a convex combination of non-negative numbers, so
        the result is non-negative and sums to one up to rounding.
    """
    p = p.to(torch.float64)
    K = p.shape[-1]
    batch = p.shape[:-1]
    pmf = torch.zeros(*batch, K + 1, dtype=torch.float64, device=p.device)
    pmf[..., 0] = 1.0
    for j in range(K):
        pj = p[..., j : j + 1]
        upto = j + 2  # entries 0..j+1 can be non-zero after coin j
        head = pmf[..., :upto]
        shifted = torch.nn.functional.pad(head[..., :-1], (1, 0))
        pmf[..., :upto] = (1.0 - pj) * head + pj * shifted
    return pmf
