r"""The Skellam mechanism and the norm of a stochastically rounded vector.

Skellam (Agarwal, Kairouz & Liu 2021, "The Skellam mechanism for differentially private
federated learning", Thm 3.5): adding i.i.d. symmetric Skellam noise of variance V per
coordinate (Poisson(V/2) - Poisson(V/2)) to an integer vector with l2 sensitivity Delta_2
and l1 sensitivity Delta_1 is (alpha, eps(alpha))-RDP for every integer alpha > 1 with

    eps(alpha) = alpha Delta_2^2 / (2 V)
                 + min( ((2 alpha - 1) Delta_2^2 + 6 Delta_1) / (4 V^2),  3 Delta_1 / (2 V) ).

The sum of n participants' independent shares of variance V_u is Skellam of variance n V_u.

Rounding (Kairouz, Liu & Steinke 2021, "The distributed discrete Gaussian mechanism",
the randomized-rounding norm bound; derived here by Hoeffding): unbiased stochastic
rounding of x in R^D with ||x|| <= c gives x~ with

    ||x~||_2 <= c + sqrt(D)                                              always,
    ||x~||_2^2 <= c^2 + D/4 + sqrt(2 ln(1/beta)) (c + sqrt(D)/2)        w.p. >= 1 - beta.

(||x~||^2 - ||x||^2 = sum_j (2 x_j e_j + e_j^2) with independent e_j of range 1; its mean is
at most D/4 and the j-th term has range |2 floor(x_j) + 1| <= 2|x_j| + 1, so Hoeffding with
sum_j (2|x_j| + 1)^2 <= (2c + sqrt(D))^2.) Pure float64 functions.
"""

from __future__ import annotations

import math

import torch

__all__ = ["skellam_rdp", "rounded_norm_bound", "integer_l1_bound"]


def skellam_rdp(*, orders, l2_sensitivity, l1_sensitivity, variance) -> torch.Tensor:
    """eps(alpha) of the Skellam mechanism (module docstring).

    Parameters
    ----------
    orders : [A] integers > 1.
    l2_sensitivity, l1_sensitivity : [...] float >= 0 (integer units).
    variance : [...] float > 0, V per coordinate of the released sum (0: +inf).

    Returns
    -------
    [..., A] float64.
    """
    a = torch.as_tensor(orders, dtype=torch.float64)
    d2, d1, v = (torch.as_tensor(t, dtype=torch.float64).unsqueeze(-1)
                 for t in (l2_sensitivity, l1_sensitivity, variance))
    lead = a * d2 * d2 / (2 * v)
    extra = torch.minimum(((2 * a - 1) * d2 * d2 + 6 * d1) / (4 * v * v), 3 * d1 / (2 * v))
    out = lead + extra
    return torch.where(v > 0, out, torch.full_like(out, math.inf))


def rounded_norm_bound(*, norm: float, dim: int, beta: float = 0.0) -> float:
    """Bound on ||x~||_2 after unbiased stochastic rounding of x with ||x|| <= ``norm`` in
    ``dim`` coordinates: the deterministic c + sqrt(D) (beta = 0), else the smaller of it and
    the Hoeffding bound that fails with probability at most beta."""
    c, D = float(norm), float(dim)
    always = c + math.sqrt(D)
    if beta <= 0.0:
        return always
    whp = math.sqrt(c * c + D / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(D) / 2))
    return min(always, whp)


def integer_l1_bound(*, l2: float, dim: int) -> float:
    """l1 norm of an integer vector with l2 norm <= l2 in ``dim`` coordinates:
    min(l2^2, sqrt(D) l2) (|v_j| <= v_j^2 for integers; Cauchy-Schwarz)."""
    return min(l2 * l2, math.sqrt(dim) * l2)
