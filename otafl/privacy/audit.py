r"""Monte Carlo audit of one over-the-air round: the leakage of the mechanism itself.

Where each accountant's bound sits relative to the truth (docs/privacy/auditing.md#auditing). We
draw the server's sufficient statistics under dataset D (user k's gradient +a e) and
evaluate the privacy-loss random variable L = log f_P(y) / f_Q(y) (Q: gradient -a e)
*exactly* from the densities; then for any eps

    delta(eps) = E_P[(1 - e^{eps - L})_+] = P_P(L > eps + E),   E ~ Exp(1) independent.

The indicator 1{L > eps + E} is a Bernoulli(delta(eps)) variable, so the Clopper–Pearson
interval on its count is an exact (conservative) confidence interval for delta(eps); the
point estimate is the lower-variance mean of (1 - e^{eps - L})_+.

The model is that of :mod:`otafl.privacy.analysis.ota_round`: n other participants from
their exact law, user k's coin b ~ Bernoulli(p), u ~ N(b a, v), s ~ v chi2_{d-1} with
v = n sigma_o^2 + N0/c^2 + b sigma_k^2. Adversaries: ``hidden`` (default) knows only the
laws of the counts, the real threat model (the true leakage of the worst-case pair);
``others`` is told n (its delta is the right side of eq. (1) there); ``total`` is told
m = n + 1{k takes part} (eq. (5)). ``exact`` reports the smaller of (1) and (5), so each
revealed audit's interval should contain the matching conditional bound.

T identical independent rounds (``rounds``) compose by adding the per-round losses:
delta_T(eps) = E[(1 - e^{eps - sum_t L_t})_+]. Every random draw comes from one explicit
``torch.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.analysis.ota_round import RoundSpec
from otafl.privacy.names import ADVERSARIES

_DT = torch.float64
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class AuditResult:
    """Monte Carlo estimate of delta at given epsilons (all [A], float64).

    Attributes
    ----------
    epsilon : the epsilons audited.
    delta : point estimate, mean of (1 - e^{eps - L})_+.
    lower, upper : Clopper–Pearson interval (two-sided, ``confidence``) for delta(eps).
    hits : number of samples with L > eps + E (the Bernoulli count behind the interval).
    samples : int, number of draws; confidence : float.
    """

    epsilon: torch.Tensor
    delta: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    hits: torch.Tensor
    samples: int
    confidence: float


def clopper_pearson(hits: torch.Tensor, samples: int, confidence: float = 0.95
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact binomial interval: Beta(alpha/2; x, n-x+1) and Beta(1-alpha/2; x+1, n-x) quantiles.

    Parameters
    ----------
    hits : [A], integer counts x in [0, samples].

    Returns
    -------
    lower, upper : [A], float64 (lower = 0 where x = 0, upper = 1 where x = n).
    """
    from scipy.special import betaincinv

    x = hits.detach().cpu().double().numpy()
    alpha = 1.0 - confidence
    lo = [0.0 if v <= 0 else float(betaincinv(v, samples - v + 1, alpha / 2)) for v in x]
    hi = [1.0 if v >= samples else float(betaincinv(v + 1, samples - v, 1 - alpha / 2)) for v in x]
    dev = hits.device
    return torch.tensor(lo, dtype=_DT, device=dev), torch.tensor(hi, dtype=_DT, device=dev)


def _count_pmf(spec: RoundSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Support n [N] and probabilities [N] of the (windowed) law of n of row 0."""
    law = spec.law
    if not torch.equal(law.n_first, law.n_last):
        raise OtaflInputError("the audit needs the law of n per count (block_rel_width = 0)")
    w = law.weight[0]
    keep = w > 0
    return law.n_first[0][keep], w[keep] / w[keep].sum()


def _log_gauss(x, var):
    return -x * x / (2 * var) - 0.5 * torch.log(var) - _HALF_LOG_2PI


def _log_chi2_scaled(s, var, k):
    """log density of s = var * chi2_k (k >= 1)."""
    x = s / var
    return ((k / 2 - 1) * torch.log(x) - x / 2 - (k / 2) * math.log(2) - math.lgamma(k / 2)
            - torch.log(var))


def _log_branch_densities(u, s, w, W, a, p, k):
    """log of (1-p) f_absent, p f_present(+a), p f_present(-a) at (u, s), broadcast."""
    log_abs = torch.log1p(-p) + _log_gauss(u, w)
    log_plus = torch.log(p) + _log_gauss(u - a, W)
    log_minus = torch.log(p) + _log_gauss(u + a, W)
    if k > 0:
        log_abs = log_abs + _log_chi2_scaled(s, w, k)
        g_W = _log_chi2_scaled(s, W, k)
        log_plus, log_minus = log_plus + g_W, log_minus + g_W
    return log_abs, log_plus, log_minus


def _loss_chunk(spec: RoundSpec, n_vals, n_prob, S, adversary, gen):
    """S draws of the privacy loss of row 0 of ``spec`` under P (gradient +a)."""
    dev = n_vals.device
    p = float(spec.participation_prob[0])
    s2 = float(spec.own_noise_var[0])
    so2 = float(spec.others_noise_var[0])
    ch = float(spec.channel_noise_var[0])
    a = float(spec.half_sensitivity[0])
    d = spec.dim
    idx = torch.multinomial(n_prob, S, replacement=True, generator=gen)
    n = n_vals[idx]
    b = torch.rand(S, generator=gen, dtype=_DT, device=dev) < p
    w = n * so2 + ch
    v = w + b.to(_DT) * s2
    u = b.to(_DT) * a + v.sqrt() * torch.randn(S, generator=gen, dtype=_DT, device=dev)
    if d is None:  # infinite dimension: the norm reveals b (and v) exactly
        return torch.where(b, 2 * u * a / v, torch.zeros_like(u))
    k = d - 1
    if k > 0:
        chi = 2.0 * torch._standard_gamma(torch.full((S,), k / 2.0, dtype=_DT, device=dev),
                                          generator=gen)
        s = v * chi
    else:
        s = torch.zeros_like(u)
    if p >= 1.0:  # everybody's branch is "present": a Gaussian pair
        W = w + s2
        return 2 * u * a / W
    if adversary == "total":
        m = n + b.to(_DT)
        # pi_m = p P_o(m - 1) / ((1 - p) P_o(m) + p P_o(m - 1)), P_o on the window.
        lookup = {float(v): float(q) for v, q in zip(n_vals.tolist(), n_prob.tolist())}
        m_vals = torch.unique(m)
        prev = torch.tensor([lookup.get(float(v) - 1, 0.0) for v in m_vals.tolist()], dtype=_DT, device=dev)
        cur = torch.tensor([lookup.get(float(v), 0.0) for v in m_vals.tolist()], dtype=_DT, device=dev)
        share_m = p * prev / ((1 - p) * cur + p * prev)
        share = share_m[torch.searchsorted(m_vals, m)]
        wm = m * so2 + ch
        Wm = wm + max(s2 - so2, 0.0)
        both_point = wm <= 0  # m = 0, N0 = 0: only the absent branch, an atom
        wm_s = torch.where(both_point, torch.ones_like(wm), wm)
        la = torch.log1p(-share) + _log_gauss(u, wm_s)
        lp = torch.log(share) + _log_gauss(u - a, Wm)
        lm = torch.log(share) + _log_gauss(u + a, Wm)
        if k > 0 and s2 > so2:
            la = la + _log_chi2_scaled(s, wm_s, k)
            g = _log_chi2_scaled(s, Wm, k)
            lp, lm = lp + g, lm + g
        loss = torch.logaddexp(la, lp) - torch.logaddexp(la, lm)
        loss = torch.where(share >= 1, 2 * u * a / Wm, loss)
        return torch.where(both_point | (share <= 0), torch.zeros_like(loss), loss)
    if adversary == "others":
        W = w + s2
        point = w <= 0  # the absent branch is an atom at (0, 0): loss 0 there
        w_s = torch.where(point, torch.ones_like(w), w)
        la, lp, lm = _log_branch_densities(u, torch.where(point & ~b, torch.ones_like(s), s),
                                           w_s, W, a, torch.tensor(p, dtype=_DT), k)
        loss = torch.logaddexp(la, lp) - torch.logaddexp(la, lm)
        gauss_loss = 2 * u * a / W
        return torch.where(point, torch.where(b, gauss_loss, torch.zeros_like(u)), loss)
    # hidden: mix over the law of n. A count with w_n = 0 (n = 0, N0 = 0) makes the
    # absent branch an atom at (0, 0): it has no density elsewhere, and at the atom
    # (drawn exactly when n = 0 and b = 0) P and Q put the same mass, so L = 0 there.
    num, den = _hidden_log_densities(u, s, n_vals * so2 + ch, s2, a, p, k, n_prob)
    at_atom = (w <= 0) & ~b
    return torch.where(at_atom, torch.zeros_like(num), num - den)


def _hidden_log_densities(u, s, wn, s2: float, a: float, p: float, k: int, n_prob):
    """log P and log Q of (u, s) [S] under the hidden adversary's mixtures over the counts n
    (variances ``wn`` [N] without the user's noise, weights ``n_prob``), up to a term common to
    both: (k/2 - 1) log s and the densities' constants. Per count and branch the density is
    exp(c - q / (2 var)) with q = (u - mean)^2 + s and c = log(weight) - (1 + k) / 2 log var, so
    each branch is one log-sum-exp over n of an outer product (the same values as
    :func:`_log_branch_densities` summed over n, to rounding)."""
    atom = wn <= 0
    wn_s = torch.where(atom, torch.ones_like(wn), wn)
    Wn = wn + s2
    half = 0.5 * (1 + k)
    logw = torch.log(n_prob)
    c_abs = torch.where(atom, torch.full_like(wn, -math.inf), math.log1p(-p) + logw - half * torch.log(wn_s))
    c_pre = math.log(p) + logw - half * torch.log(Wn)
    i_abs, i_pre = 0.5 / wn_s, 0.5 / Wn
    absent = torch.logsumexp(c_abs[None, :] - (u * u + s)[:, None] * i_abs[None, :], dim=1)
    plus = torch.logsumexp(c_pre[None, :] - ((u - a) ** 2 + s)[:, None] * i_pre[None, :], dim=1)
    minus = torch.logsumexp(c_pre[None, :] - ((u + a) ** 2 + s)[:, None] * i_pre[None, :], dim=1)
    return torch.logaddexp(absent, plus), torch.logaddexp(absent, minus)


def audit_round(spec: RoundSpec, epsilon, *, samples: int, generator: torch.Generator,
                rounds: int = 1, adversary: str = "hidden", confidence: float = 0.95,
                chunk: int = 1 << 16) -> AuditResult:
    r"""Monte Carlo estimate of delta(eps) of row 0 of ``spec`` (one user, one round).

    Parameters
    ----------
    spec : a :class:`~otafl.privacy.analysis.ota_round.RoundSpec` whose row 0 is audited; its law of n
        must list single counts (built with the default ``block_rel_width`` and K < 1000).
    epsilon : [A] float, the epsilons at which delta is estimated (+inf gives 0).
    samples : number of draws S >= 1 (of T rounds each).
    generator : the only source of randomness (its device is used).
    rounds : T identical independent rounds (losses add).
    adversary : "hidden" (knows only the laws of the counts), "others" (knows n) or
        "total" (knows m = n + 1{k takes part}).
    confidence : two-sided level of the Clopper–Pearson interval.

    Returns
    -------
    :class:`AuditResult`.
    """
    check_range("samples", samples, lo=1)
    check_range("rounds", rounds, lo=1)
    check_range("confidence", confidence, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if adversary not in ADVERSARIES:
        raise OtaflInputError(f"adversary = {adversary!r} is outside the allowed range "
                              f"{{{', '.join(ADVERSARIES)}}}")
    dev = generator.device
    eps = torch.as_tensor(epsilon, dtype=_DT, device=dev).reshape(-1)
    n_vals, n_prob = (t.to(dev) for t in _count_pmf(spec))
    if float(spec.participation_prob[0]) <= 0:
        zero = torch.zeros_like(eps)
        _, upper = clopper_pearson(zero.long(), samples, confidence)
        return AuditResult(epsilon=eps, delta=zero, lower=zero, upper=upper, hits=zero.long(),
                           samples=samples, confidence=confidence)
    finite = torch.isfinite(eps)
    eps_f = torch.where(finite, eps, torch.zeros_like(eps))
    total_y = torch.zeros_like(eps)
    hits = torch.zeros(eps.shape, dtype=torch.long, device=dev)
    done = 0
    while done < samples:
        S = min(chunk, samples - done)
        loss = torch.zeros(S, dtype=_DT, device=dev)
        for _ in range(rounds):
            loss = loss + _loss_chunk(spec, n_vals, n_prob, S, adversary, generator)
        e = -torch.log(torch.rand(S, generator=generator, dtype=_DT, device=dev))  # Exp(1)
        gap = loss[None, :] - eps_f[:, None]  # [A, S]
        total_y += (-torch.expm1(-gap)).clamp(min=0.0).sum(1)
        hits += (gap > e[None, :]).sum(1)
        done += S
    hits = torch.where(finite, hits, torch.zeros_like(hits))
    delta = torch.where(finite, total_y / samples, torch.zeros_like(total_y))
    lower, upper = clopper_pearson(hits, samples, confidence)
    return AuditResult(epsilon=eps, delta=delta, lower=lower, upper=upper, hits=hits,
                       samples=samples, confidence=confidence)


__all__ = ["ADVERSARIES", "AuditResult", "audit_round", "clopper_pearson"]
