"""Concentration of the number of participants |K_t| = sum_k Bernoulli(p_k).

Functions here are pure and batched: leading dimensions of ``p`` are a sweep grid,
the last dimension indexes users.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from otafl.privacy.analysis.gaussian import broadcast_shapes


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
    if p.device.type == "cpu":
        # The same recursion in numpy: identical arithmetic, without torch's per-op overhead.
        import numpy as np

        q = p.detach().numpy()
        K = q.shape[-1]
        out = np.zeros((*q.shape[:-1], K + 1))
        out[..., 0] = 1.0
        for j in range(K):
            pj = q[..., j : j + 1]
            # (1 - p_j) pmf(n) + p_j pmf(n - 1) in place: the same products and sums in the
            # same order as with a shifted copy (entry j + 1 is 0 before), without it.
            prev = pj * out[..., : j + 1]
            out[..., : j + 1] *= 1.0 - pj
            out[..., 1 : j + 2] += prev
        return torch.from_numpy(out)
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


_PB_CACHE: OrderedDict = OrderedDict()
_PB_CACHE_SIZE = 2048


def cached_poisson_binomial_pmf(p: tuple) -> torch.Tensor:
    """:func:`poisson_binomial_pmf` of the coins ``p`` (a tuple of floats), [1, K + 1], kept in
    a module-level LRU of 2048 laws (filled in batches by :func:`prefetch_poisson_binomial_pmfs`)."""
    hit = _PB_CACHE.get(p)
    if hit is None:
        prefetch_poisson_binomial_pmfs([p])
        hit = _PB_CACHE[p]
    else:
        _PB_CACHE.move_to_end(p)
    return hit


def prefetch_poisson_binomial_pmfs(ps) -> None:
    """The pmfs of the coin tuples ``ps`` not cached yet, in batched recursions by length: the
    K steps once for a whole run's rounds (channel-aware sampling: each round its own p), not
    once per round. Each row's arithmetic is that of its pmf on its own (elementwise)."""
    by: dict[int, list] = {}
    for p in dict.fromkeys(ps):
        if p not in _PB_CACHE:
            by.setdefault(len(p), []).append(p)
    for group in by.values():
        for i in range(0, len(group), 256):
            part = group[i:i + 256]
            pmfs = poisson_binomial_pmf(torch.tensor(part, dtype=torch.float64))
            for r, p in enumerate(part):
                _PB_CACHE[p] = pmfs[r:r + 1].clone()
    while len(_PB_CACHE) > _PB_CACHE_SIZE:
        _PB_CACHE.popitem(last=False)


def clear_poisson_binomial_cache() -> None:
    """Forget the cached pmfs of :func:`cached_poisson_binomial_pmf`."""
    _PB_CACHE.clear()


AUTO_DELTA_PRIME_SLACK = 1e-5
"""The additive term of the paper's default delta' = 2 exp(-2 mu^2 / K) + 1e-5."""


@dataclass(frozen=True)
class AutoShare:
    """``delta_prime = "auto"`` with the additive term ``slack`` instead of 1e-5: a run's
    share of its delta_total per round (:func:`otafl.privacy.accountants.run.split_share`)."""

    slack: float


def auto_delta_prime(*, mean_participants, users, slack: float = AUTO_DELTA_PRIME_SLACK) -> torch.Tensor:
    """The paper's default concentration failure probability.

        delta'_t = 2 exp(-2 mu_t^2 / K) + slack        (slack = 1e-5 in the paper)

    It always exceeds 2 exp(-2 mu_t^2 / K), so the Hoeffding quantile below is positive,
    but it reaches 1 when mu_t^2 <= K ln(2 / (1 - slack)) / 2 (few expected
    participants); callers treat delta' >= 1 as "bound undefined".

    Parameters
    ----------
    mean_participants : [...], float -- mu_t = sum_k p_{k,t}.
    users : [...], float             -- K.

    Returns
    -------
    delta_prime : [...], float64.
    """
    mu = torch.as_tensor(mean_participants, dtype=torch.float64)
    K = torch.as_tensor(users, dtype=torch.float64, device=mu.device)
    return 2.0 * torch.exp(-2.0 * mu * mu / K) + slack


def hoeffding_beta(*, delta_prime, users) -> torch.Tensor:
    """Hoeffding deviation per user: beta_t = sqrt(ln(2 / delta') / (2 K)).

    Hoeffding's inequality for K independent coins gives
    P(|K_t| <= mu_t - K beta_t) <= exp(-2 K beta_t^2) = delta'/2 <= delta'.

    Parameters
    ----------
    delta_prime : [...], float in (0, 1);  users : [...], float (K >= 1).

    Returns
    -------
    beta : [...], float64.
    """
    dp = torch.as_tensor(delta_prime, dtype=torch.float64)
    K = torch.as_tensor(users, dtype=torch.float64, device=dp.device)
    return torch.sqrt(torch.log(2.0 / dp) / (2.0 * K))


def hoeffding_lower_quantile(*, mean_participants, users, delta_prime) -> torch.Tensor:
    """The paper's high-probability lower bound m_t = mu_t - K beta_t on |K_t|.

    P(|K_t| < m_t) <= delta'. Non-positive where mu_t <= K beta_t (the bound is then
    undefined; callers report +inf with a reason).

    Returns
    -------
    m : [...], float64 (real-valued, not rounded).
    """
    mu = torch.as_tensor(mean_participants, dtype=torch.float64)
    K = torch.as_tensor(users, dtype=torch.float64, device=mu.device)
    return mu - K * hoeffding_beta(delta_prime=delta_prime, users=K)


def _quantile_from_cdf(cdf: torch.Tensor, delta_prime: torch.Tensor) -> torch.Tensor:
    """Largest integer m with P(N < m) = cdf[m - 1] <= delta' (cdf[-1] := 0).

    cdf is non-decreasing in its last index, so m = #{j : cdf[j] <= delta'}.
    """
    m = torch.searchsorted(cdf.contiguous(), delta_prime.unsqueeze(-1).contiguous(), right=True)
    return m.squeeze(-1).clamp(max=cdf.shape[-1] - 1).to(torch.float64)


def binomial_lower_quantile(*, users, p, delta_prime, max_elements: int = 1 << 22,
                            tail_tolerance: float = 1e-12) -> torch.Tensor:
    """Exact lower quantile of |K_t| ~ Binomial(K, p) (uniform participation).

        m_t = the largest integer m with P(|K_t| < m) <= delta'.

    The CDF is a running sum of the exact pmf, accumulated upwards so the small
    lower-tail probabilities keep their relative precision. The pmf starts from
    log C(K, n0) + n0 log p + (K - n0) log(1 - p) (``lgamma``) and steps with the exact
    ratio pmf(n+1)/pmf(n) = (K - n) p / ((n + 1)(1 - p)) in log space. Only a window of
    n is summed: from n0 = floor(mu - sqrt(K ln(1/(tol delta'))/2)), below which
    Hoeffding leaves at most tol * delta' of mass (tol = ``tail_tolerance``; the
    comparison is then made against delta' (1 - tol), so the omitted mass can only lower
    m, never raise it), up to ceil(mu) when delta' < 1/2 (the binomial median is at most
    ceil(mu), where the CDF already exceeds delta'). Inputs broadcast; the work is done on
    their broadcast shape, which for a product sweep grid is only the (K, p, delta')
    sub-grid, never [grid, K].

    Parameters
    ----------
    users : [...], integer-valued  -- K >= 1.
    p : [...], float               -- participation probability in [0, 1].
    delta_prime : [...], float     -- in (0, 1).
    max_elements : int             -- memory cap for one chunk of [rows, window] terms.
    tail_tolerance : float         -- relative mass (of delta') allowed below the window.

    Returns
    -------
    m : [...] (the broadcast shape), float64, integer-valued in [0, K].
    """
    p = torch.as_tensor(p, dtype=torch.float64)
    device = p.device
    K = torch.as_tensor(users, dtype=torch.float64, device=device)
    dp = torch.as_tensor(delta_prime, dtype=torch.float64, device=device)
    K, p, dp = torch.broadcast_tensors(K, p, dp)
    shape = K.shape
    Ku, pu, du = K.reshape(-1), p.reshape(-1), dp.reshape(-1)
    out = torch.where((pu >= 1) | (dp.reshape(-1) >= 1), Ku, torch.zeros_like(Ku))  # p = 1 or delta' >= 1: m = K
    interior = torch.nonzero((pu > 0) & (pu < 1) & (dp.reshape(-1) < 1)).squeeze(1)
    if interior.numel() == 0:
        return out.reshape(shape)
    Ku, pu, du = Ku[interior], pu[interior], du[interior]
    mu = Ku * pu
    reach = torch.sqrt(Ku * torch.log(1.0 / (tail_tolerance * du)) / 2.0)
    start = torch.clamp(torch.floor(mu - reach), min=0.0)
    # delta' < 1/2: the binomial median is at most ceil(mu), where the CDF already exceeds
    # delta'. delta' >= 1/2: Hoeffding's upper tail, P(K_t > mu + t) <= exp(-2 t^2 / K) <=
    # tol (1 - delta'), puts the quantile below mu + t (the CDF there exceeds delta'), so
    # the window never spans all of K (it did: 8 GB at K = 1e9, delta' = 1).
    upper = torch.sqrt(Ku * torch.log(1.0 / (tail_tolerance * torch.clamp(1.0 - du, min=1e-300))) / 2.0)
    stop = torch.where(du < 0.5, torch.minimum(torch.ceil(mu), Ku), torch.minimum(torch.ceil(mu + upper) + 1.0, Ku))
    threshold = torch.where(start > 0, du * (1.0 - tail_tolerance), du)
    log_pmf0 = torch.lgamma(Ku + 1.0) - torch.lgamma(start + 1.0) - torch.lgamma(Ku - start + 1.0) \
        + start * torch.log(pu) + (Ku - start) * torch.log1p(-pu)
    logit = torch.log(pu) - torch.log1p(-pu)
    width = (stop - start + 1).to(torch.int64)
    order = torch.argsort(width)
    widths = width[order].tolist()
    result = torch.empty_like(Ku)
    i = 0
    while i < len(widths):
        rows = max(1, max_elements // widths[i])  # widths ascend: shrink until the widest row fits
        while rows > 1 and rows * widths[min(i + rows, len(widths)) - 1] > max_elements:
            rows //= 2
        idx = order[i:i + rows]
        w = int(width[idx].max())
        n = start[idx, None] + torch.arange(w - 1, dtype=torch.float64, device=device)
        step = torch.log(torch.clamp(Ku[idx, None] - n, min=0.0)) - torch.log(n + 1.0) + logit[idx, None]
        log_pmf = log_pmf0[idx, None] + torch.cat([torch.zeros_like(step[:, :1]), torch.cumsum(step, -1)], -1)
        inside = torch.arange(w, device=device) <= (stop[idx] - start[idx])[:, None]
        cdf = torch.cumsum(torch.where(inside, torch.exp(log_pmf), torch.zeros_like(log_pmf)), dim=-1)
        result[idx] = start[idx] + (cdf <= threshold[idx, None]).sum(-1).to(torch.float64)
        i += rows
    out[interior] = result
    return out.reshape(shape)


def poisson_binomial_lower_quantile(*, p, delta_prime) -> torch.Tensor:
    """Exact lower quantile of |K_t| = sum_k Bernoulli(p_k) (per-user probabilities).

        m_t = the largest integer m with P(|K_t| < m) <= delta',

    from :func:`poisson_binomial_pmf` (O(K^2) per grid point). Rows whose p is the
    same for every user take the binomial path (:func:`binomial_lower_quantile`).

    Parameters
    ----------
    p : [..., K], float          -- p_k in [0, 1].
    delta_prime : [...], float   -- in (0, 1), broadcast against p's leading dims.

    Returns
    -------
    m : [...], float64, integer-valued in [0, K].
    """
    p = torch.as_tensor(p, dtype=torch.float64)
    dp = torch.as_tensor(delta_prime, dtype=torch.float64, device=p.device)
    batch = broadcast_shapes(p.shape[:-1], dp.shape)
    K = p.shape[-1]
    p = p.expand(*batch, K).reshape(-1, K)
    dp = dp.expand(batch).reshape(-1)
    out = torch.empty(p.shape[0], dtype=torch.float64, device=p.device)
    uniform = (p == p[:, :1]).all(dim=1)
    if uniform.any():
        out[uniform] = binomial_lower_quantile(users=K, p=p[uniform, 0], delta_prime=dp[uniform])
    if (~uniform).any():
        cdf = torch.cumsum(poisson_binomial_pmf(p[~uniform]), dim=-1)
        out[~uniform] = _quantile_from_cdf(cdf, dp[~uniform])
    return out.reshape(batch)
