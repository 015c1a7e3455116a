r"""Renyi DP of the distributed discrete Gaussian (DDG) summed under secure aggregation.

The mechanism (Kairouz, Liu & Steinke 2021, "The distributed discrete Gaussian mechanism for
federated learning with secure aggregation", ICML; arXiv:2102.06387): each of n participants
adds i.i.d. N_Z(0, sigma^2) noise to every one of the d coordinates of its integer vector;
the server sees the sum. The sum of discrete Gaussians is *not* a discrete Gaussian, but it
is close to one. Their Theorem 1 / Proposition 14 (eq. 17), in the form the paper's public
accounting code uses (google-research/federated, distributed_dp/accounting_utils.py; the
paper's text was not at hand, and the condition sigma >= 1/2 is applied conservatively):
for sigma >= 1/2, every Delta in Z^d and every alpha >= 1, with

    tau_n = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)),

the sum Z_n of the n noise vectors satisfies D_alpha(Z_n + Delta || Z_n) <= eps_n(alpha),

    eps_n(alpha) = min( alpha Delta_2^2 / (2 n sigma^2) + tau_n d,
                        alpha / 2 (Delta_2^2 / (n sigma^2) + 2 tau_n Delta_1 / (sqrt(n) sigma)
                                   + tau_n^2 d) )

(Delta_2, Delta_1 the l2 and l1 norms of Delta; the paper's third form
alpha/2 (Delta_2 / (sqrt(n) sigma) + tau_n sqrt(d))^2 is never smaller than the second,
since Delta_1 <= sqrt(d) Delta_2). As zCDP: the second form is rho-zCDP with
rho = (Delta_2^2/(n sigma^2) + 2 tau_n Delta_1/(sqrt(n) sigma) + tau_n^2 d) / 2, i.e. the
paper's "eps^2/2-concentrated DP".

Always valid, for any sigma and n >= 1, is the one-share bound alpha Delta_2^2 / (2 sigma^2)
(Canonne, Kamath & Steinke 2020: a discrete Gaussian vector is (Delta_2^2 / (2 sigma^2))-zCDP;
the other n - 1 shares are a post-processing). With n = 1 (local DP) tau_1 = 0 and the forms
coincide with it. Below sigma = 1/2, where the theorem is not stated, only the one-share bound
is used. Checked against the exact divergence of convolved pmfs in
``tests/test_privacy_digital.py``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["DDG_MIN_SIGMA", "ddg_tau", "ddg_rdp"]

DDG_MIN_SIGMA = 0.5
"""Smallest per-share sigma (integer units) at which the sum theorem (tau_n) is applied."""


def ddg_tau(participants, sigma2: float) -> torch.Tensor:
    """tau_n = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)) for each n of ``participants``
    (float64, same shape; 0 for n <= 1)."""
    n = torch.as_tensor(participants, dtype=torch.int64)
    top = int(n.max()) if n.numel() else 1
    k = torch.arange(1, max(top, 1), dtype=torch.float64)
    terms = torch.exp(-2.0 * math.pi ** 2 * float(sigma2) * k / (k + 1))
    cum = torch.cat([torch.zeros(2, dtype=torch.float64), torch.cumsum(terms, 0)])  # cum[n] = sum_{k<n}
    return 10.0 * cum[torch.clamp(n, min=0, max=top)]


def ddg_rdp(*, orders, l2_sensitivity: float, l1_sensitivity: float, sigma2: float, participants,
            dim: int) -> torch.Tensor:
    """eps_n(alpha) of the sum of n discrete Gaussian shares (module docstring).

    Parameters
    ----------
    orders : [A] orders >= 1.
    l2_sensitivity, l1_sensitivity : norms of the integer shift (integer units).
    sigma2 : per-share sigma^2 (integer units; <= 0: +inf).
    participants : [N] integers n >= 1.
    dim : d, coordinates of the vector.

    Returns
    -------
    [N, A] float64.
    """
    a = torch.as_tensor(orders, dtype=torch.float64)
    n = torch.as_tensor(participants, dtype=torch.int64).reshape(-1)
    if not sigma2 > 0:
        return torch.full((n.numel(), a.numel()), math.inf, dtype=torch.float64)
    d2, d1 = float(l2_sensitivity), float(l1_sensitivity)
    nf = n.to(torch.float64).clamp(min=1.0).unsqueeze(-1)
    single = a * d2 * d2 / (2.0 * sigma2)
    if math.sqrt(sigma2) < DDG_MIN_SIGMA:
        return single.expand(n.numel(), -1).clone()
    tau = ddg_tau(n, sigma2).unsqueeze(-1)
    sq = d2 * d2 / (nf * sigma2)
    first = a * sq / 2.0 + tau * dim
    second = a / 2.0 * (sq + 2.0 * tau * d1 / (nf.sqrt() * math.sqrt(sigma2)) + tau * tau * dim)
    return torch.minimum(torch.minimum(first, second), single)
