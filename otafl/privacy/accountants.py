"""Per-round local and central DP accountants, a registry by name, and run totals.

Each accountant is a pure batched function (keyword-only arguments) that reads one
round's privacy facts and returns a :class:`RoundBound`:

    round_bound(*, participation_prob, noise_var, alignment_gain, n0, sensitivity,
                delta_l, delta_prime="auto", users=None, dim=None) -> RoundBound

Two ways to describe the users of a round (see :func:`prepare_round`):

- per user: ``participation_prob`` and ``noise_var`` are [..., K] (``users=None``);
- uniform:  ``participation_prob`` and ``noise_var`` are [...] (one value per grid point)
  and ``users`` [...] gives K. The users dimension is then never materialised, so a
  10^6-point sweep grid is one call.

All other arguments broadcast against the grid dimensions [...]; results are [...].
Where a bound is undefined the epsilon is +inf and ``reason`` says why (a bit mask,
see :data:`REASONS`); nothing raises mid-sweep. Out-of-range inputs raise
:class:`otafl.errors.OtaflInputError` before any computation.

Accountants (spec: shared/spec/privacy.md):

- ``paper``: the paper's closed forms. LDP: classic Gaussian with the user's noise and
  the channel noise, amplified by p_k. Central: Hoeffding quantile m_t = mu_t - K beta_t,
  noise m_t sigma_min^2 (channel noise left out), classic Gaussian, amplified by
  q = min(1, p_max / (1 - delta')). The classic Gaussian step is only a theorem where
  its eps_0 <= 1: ``classic_valid`` flags it; outside it ``paper`` can *understate* the
  leakage (for Delta/s above ~2 the analytic eps is larger) and is not a guaranteed bound.
  Its LDP amplification assumes the server cannot tell who took part; it can (see
  :func:`_local_dp`), so ``classic_valid_local`` is False wherever 0 < p_k < 1.
- ``tight``: the same argument with sharper pieces: the exact Poisson-binomial quantile
  of |K_t|, the analytic Gaussian mechanism (Balle & Wang 2018), and the channel noise
  N0/c_t^2 in the central noise. Its central eps never exceeds ``paper``'s where
  ``paper`` is valid. Its LDP is *not* amplified by sampling: (eps_G, p_k delta_l) by
  joint convexity, a theorem whatever the server can tell (the spec's "never exceeds
  paper" holds for LDP only at p = 1, where ``paper`` is a theorem too).

The central steps of both treat user k's own noise as present whether or not it takes
part (:mod:`otafl.privacy.compose`); with few participants in d dimensions the variance
a participant adds is visible, which the ``exact`` accountant models (and
``otafl audit`` measures: sound but loose at the paper preset).

Adding an accountant: write ``otafl/privacy/<name>.py`` with a ``round_bound`` function
of the signature above (:func:`prepare_round` does the validation, the uniform/per-user
handling and delta'; return a :class:`RoundBound`), then add one line to
:data:`ACCOUNTANTS`, e.g.

    "exact": Accountant("exact", lazy_round_bound("otafl.privacy.exact:round_bound"), "..."),

(:func:`lazy_round_bound` imports the module on first use, so it may import this one).
The contract test in tests/test_privacy_accountants.py then runs on it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.compose import COMPOSITIONS, compose_best
from otafl.privacy.concentration import (
    auto_delta_prime,
    binomial_lower_quantile,
    hoeffding_lower_quantile,
    poisson_binomial_lower_quantile,
)
from otafl.privacy.facts import RoundFacts, stack_facts
from otafl.privacy.gaussian import (
    amplify_by_sampling,
    analytic_gaussian_epsilon,
    as_float64,
    classic_gaussian_epsilon,
)

__all__ = [
    "REASON_HOEFFDING",
    "REASON_DELTA_PRIME",
    "REASON_NO_CENTRAL_NOISE",
    "REASON_NO_LOCAL_NOISE",
    "REASONS",
    "reason_text",
    "RoundInputs",
    "RoundBound",
    "prepare_round",
    "paper_round",
    "tight_round",
    "Accountant",
    "ACCOUNTANTS",
    "CENTRAL_REASONS",
    "GRID_CHUNK",
    "evaluate_in_chunks",
    "get_accountant",
    "lazy_round_bound",
    "compose_round_bounds",
    "composition_name",
    "account_run",
]

REASON_HOEFFDING = 1
REASON_DELTA_PRIME = 2
REASON_NO_CENTRAL_NOISE = 4
REASON_NO_LOCAL_NOISE = 8

REASONS: dict[int, str] = {
    REASON_HOEFFDING: "Hoeffding quantile undefined: mu_t <= K beta_t (too few expected participants for delta')",
    REASON_DELTA_PRIME: "delta' >= 1: too few expected participants for the concentration step",
    REASON_NO_CENTRAL_NOISE: "no central noise: zero participant quantile or zero artificial noise, and no channel noise",
    REASON_NO_LOCAL_NOISE: "no local noise: sigma_k^2 = 0 and no channel noise",
}
"""Bit -> text for :attr:`RoundBound.reason` (0 = defined). Bits combine."""


def reason_text(code: int) -> str:
    """Text of a reason bit mask: the set bits' texts joined by '; ' ('' for 0)."""
    return "; ".join(text for bit, text in REASONS.items() if int(code) & bit)


@dataclass(frozen=True, eq=False)
class RoundInputs:
    """Validated inputs of one round (see :func:`prepare_round`).

    Tensors keep their *natural* shapes: each broadcasts to the grid shape ``batch``
    but is only as large as the inputs it depends on, so a product grid never pays
    for dimensions a quantity does not depend on. ``participation_prob`` and
    ``noise_var`` carry a trailing users dimension K' (K per user, 1 when uniform);
    every other tensor is grid-shaped [...]. All float64, one device.
    """

    participation_prob: Tensor  # [..., K'] p_k
    noise_var: Tensor           # [..., K'] sigma_k^2
    users: Tensor               # [...] K
    uniform: bool               # True: the users dimension is implicit (K' = 1)
    batch: torch.Size           # the grid shape every result broadcasts to
    mean_participants: Tensor   # [...] mu_t = sum_k p_k
    max_participation_prob: Tensor  # [...] max_k p_k
    min_noise_var: Tensor       # [...] min of sigma_k^2 over users with p_k > 0
    channel_noise_var: Tensor   # [...] N0 / c_t^2 in gradient units; 0 where N0 = 0
    sensitivity: Tensor         # [...] Delta
    delta_l: Tensor             # [...]
    delta_prime: Tensor         # [...] delta'_t (resolved from "auto")
    dim: Tensor | None          # [...] model dimension d, or None


def _check_tensor(name: str, x: Tensor, lo: float, hi: float | None = None, lo_open: bool = False,
                  hi_open: bool = False) -> None:
    """Raise the standard OtaflInputError for the first element of x outside the interval."""
    ok = x >= lo if not lo_open else x > lo
    if hi is not None:
        ok = ok & ((x < hi) if hi_open else (x <= hi))
    if not bool(ok.all()):  # NaN fails every comparison
        check_range(name, x[~ok].reshape(-1)[0].item(), lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open)


def prepare_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                  delta_prime="auto", users=None, dim=None) -> RoundInputs:
    """Validate one round's facts, resolve delta', derive the per-round summaries.

    Parameters
    ----------
    participation_prob : [..., K] (``users=None``) or [...] (uniform), float -- p in [0, 1].
    noise_var : [..., K] or [..., 1] (per user) or [...] (uniform), float -- sigma^2 >= 0,
        per coordinate, gradient units.
    alignment_gain : [...], float -- c_t >= 0.
    n0 : [...], float -- receiver noise variance N0 >= 0 (0: no channel noise).
    sensitivity : [...], float -- Delta > 0.
    delta_l : [...], float -- in (0, 1).
    delta_prime : [...] float in (0, 1), or "auto" = 2 exp(-2 mu_t^2 / K) + 1e-5.
    users : [...], integer-valued >= 1 (uniform p), or None (per-user inputs).
    dim : [...], >= 1, or None -- model dimension (unused by ``paper`` and ``tight``).

    Raises
    ------
    OtaflInputError  for any value outside its range (checked before any computation).
    """
    p = torch.as_tensor(participation_prob, dtype=torch.float64)
    (var, c, n0, delta_s, delta_l) = as_float64(noise_var, alignment_gain, n0, sensitivity, delta_l, device=p.device)
    _check_tensor("participation_prob", p, 0.0, 1.0)
    _check_tensor("noise_var", var, 0.0)
    _check_tensor("alignment_gain", c, 0.0)
    _check_tensor("n0", n0, 0.0)
    _check_tensor("sensitivity", delta_s, 0.0, lo_open=True)
    _check_tensor("delta_l", delta_l, 0.0, 1.0, lo_open=True, hi_open=True)
    uniform = users is not None
    if uniform:
        K = as_float64(users, device=p.device)[0]
        _check_tensor("users", K, 1.0)
        if not bool((K == torch.round(K)).all()):
            raise OtaflInputError(f"users = {K[K != torch.round(K)][0].item()!r} is outside the allowed range "
                                  "(integers >= 1)")
        p = p.unsqueeze(-1)
        var = var.unsqueeze(-1)
    else:
        if p.dim() == 0:
            raise OtaflInputError("participation_prob has no users dimension; pass users=K for uniform p")
        K = torch.tensor(float(p.shape[-1]), dtype=torch.float64, device=p.device)
        if var.dim() == 0:
            var = var.reshape(1)
    batch = torch.broadcast_shapes(p.shape[:-1], var.shape[:-1], K.shape, c.shape, n0.shape, delta_s.shape,
                                   delta_l.shape)
    if uniform:
        mu = p[..., 0] * K
        max_p = p[..., 0]
        min_var = var[..., 0]
    else:
        p_full, var_full = torch.broadcast_tensors(p, var)
        mu = p.sum(-1)
        max_p = p.amax(-1)
        active_var = torch.where(p_full > 0, var_full, torch.full_like(var_full, math.inf)).amin(-1)
        min_var = torch.where(torch.isinf(active_var), var_full.amin(-1), active_var)  # nobody can take part
    if isinstance(delta_prime, str):
        if delta_prime != "auto":
            raise OtaflInputError(f"delta_prime = {delta_prime!r} is outside the allowed range (0, 1) or 'auto'")
        dp = auto_delta_prime(mean_participants=mu, users=K)
    else:
        dp = as_float64(delta_prime, device=p.device)[0]
        _check_tensor("delta_prime", dp, 0.0, 1.0, lo_open=True, hi_open=True)
        batch = torch.broadcast_shapes(batch, dp.shape)
    channel = torch.where(n0 == 0, torch.zeros_like(c), n0 / (c * c))
    if dim is not None:
        dim = as_float64(dim, device=p.device)[0]
        _check_tensor("dim", dim, 1.0)
    return RoundInputs(
        participation_prob=p, noise_var=var, users=K, uniform=uniform, batch=batch, mean_participants=mu,
        max_participation_prob=max_p, min_noise_var=min_var, channel_noise_var=channel, sensitivity=delta_s,
        delta_l=delta_l, delta_prime=dp, dim=dim)


@dataclass(frozen=True, eq=False)
class RoundBound:
    """One round's guarantees on a sweep grid; every field is [...] (the grid shape).

    Fields may be broadcast views of smaller tensors (``torch.broadcast_to``); call
    ``.contiguous()`` before writing into one.

    Attributes
    ----------
    epsilon_local, delta_local : LDP of the worst user: max_k eps_l,k,t and max_k p_k delta_l.
    epsilon_central, delta_central : central DP of the round (delta includes delta').
    users, mean_participants : K and mu_t = sum_k p_k.
    delta_prime : the concentration failure probability delta'_t used.
    quantile : m_t, the high-probability lower bound on |K_t| (real for Hoeffding).
    central_noise_std : s_c,t, the Gaussian noise std (gradient units) the central step
        relies on (0 where undefined); ``central_sampling_rate`` q_t = min(1, p_max/(1 - delta')).
        With ``sensitivity`` they are the round's sampled-Gaussian view for RDP.
    local_noise_std, local_sampling_rate : the dominating (smallest noise, largest rate)
        sampled-Gaussian view over users, for RDP composition of the LDP (rate p_max for
        ``paper``, 1 for ``tight``, whose LDP is not amplified).
    classic_valid : the classic Gaussian step's eps_0 <= 1 (central). Always True for
        accountants without a classic step.
    classic_valid_local : the LDP step is a theorem for every user who can take part; for
        ``paper`` that needs eps_0 <= 1 *and* p_k = 1 (no amplification, see
        :func:`_local_dp`). Always True for the other accountants.
    reason : int64 bit mask of :data:`REASONS` (0 = both bounds finite and defined).
    """

    epsilon_local: Tensor
    delta_local: Tensor
    epsilon_central: Tensor
    delta_central: Tensor
    users: Tensor
    mean_participants: Tensor
    delta_prime: Tensor
    quantile: Tensor
    central_noise_std: Tensor | None
    central_sampling_rate: Tensor | None
    local_noise_std: Tensor | None
    local_sampling_rate: Tensor | None
    sensitivity: Tensor
    classic_valid: Tensor
    classic_valid_local: Tensor
    reason: Tensor

    @property
    def defined(self) -> Tensor:
        """[...] bool: no reason bit set."""
        return self.reason == 0


CENTRAL_REASONS = REASON_HOEFFDING | REASON_DELTA_PRIME | REASON_NO_CENTRAL_NOISE
"""The reason bits that make the central bound +inf."""


class _Local(NamedTuple):
    """The LDP part of a round (worst user), as :func:`_local_dp` computes it."""

    epsilon: Tensor      # max_k eps_l,k
    delta: Tensor        # max_k p_k delta_l
    valid: Tensor        # the step is a theorem for every user who can take part (see _local_dp)
    no_noise: Tensor     # some user who can take part has s_k = 0
    noise_std: Tensor    # the smallest s_k over users who can take part
    sampling_rate: Tensor  # the RDP view's rate


def _local_dp(x: RoundInputs, gaussian_epsilon: Callable[..., Tensor], *, amplify: bool):
    """Per-user LDP, worst user, delta_l,k = p_k delta_l.

    s_k^2 = sigma_k^2 + N0/c_t^2 (only user k's own noise and the channel protect it from a
    server colluding with the others), eps_G,k = eps_G(Delta, s_k, delta_l).

    ``amplify=True`` (``paper``): eps_l,k = log(1 + p_k (exp(eps_G,k) - 1)), amplification by
    sampling. That is a theorem only if the server cannot tell whether user k took part;
    it can, from the received energy, whenever user k adds noise of its own (the output
    is N(0, N0/c^2) without user k and N(g_k, sigma_k^2 + N0/c^2) with it), so the
    amplified eps is flagged (``valid`` False) for every user with 0 < p_k < 1. (Without
    own noise, sigma_k = 0, the absent-user output is a Gaussian shift of the present one
    by ||g_k|| <= L, and amplification holds if L <= Delta; the accountant does not know L,
    so it does not claim that case either.)

    ``amplify=False`` (``tight``): eps_l,k = eps_G,k, sound for any p_k by joint convexity of
    the hockey-stick divergence: the two neighbouring outputs are (1 - p) R + p P1 and
    (1 - p) R + p Q1 with the same R (user k absent), so H_e^eps <= p H_e^eps(P1 || Q1)
    <= p delta_l. Users with p_k = 0 leak nothing (eps 0).

    Returns a :class:`_Local` of natural-shaped tensors.
    """
    s_local = torch.sqrt(x.noise_var + x.channel_noise_var.unsqueeze(-1))
    eps0 = gaussian_epsilon(sensitivity=x.sensitivity.unsqueeze(-1), noise_std=s_local,
                            delta=x.delta_l.unsqueeze(-1))
    p = x.participation_prob
    if amplify:
        eps, _ = amplify_by_sampling(epsilon=eps0, delta=0.0, sampling_rate=p)
    else:
        eps = torch.where(p > 0, eps0, torch.zeros_like(eps0))
    delta = x.max_participation_prob * x.delta_l
    active = p > 0
    # amplification is a theorem here only for a user who always (or never) takes part
    sound = ~active | (p >= 1) if amplify else torch.ones_like(active)
    # the RDP view: a sampled Gaussian at rate p_max when amplified, the plain Gaussian otherwise
    rate = x.max_participation_prob if amplify else (x.max_participation_prob > 0).to(torch.float64)
    if x.uniform:
        s0, e0, a0 = s_local[..., 0], eps0[..., 0], active[..., 0]
        return _Local(eps[..., 0], delta, ((e0 <= 1) | ~a0) & sound[..., 0], (s0 == 0) & a0, s0, rate)
    s_min = torch.where(active, s_local, torch.full_like(s_local, math.inf)).amin(-1)
    return _Local(eps.amax(-1), delta, (((eps0 <= 1) | ~active) & sound).all(-1),
                  ((s_local == 0) & active).any(-1), s_min, rate)


def _finish(x: RoundInputs, *, local, quantile, s_central, eps0_c, hoeffding_undefined, classic: bool) -> RoundBound:
    """Amplify the central step, set reasons and +inf where undefined, broadcast to the grid."""
    eps_l, delta_loc, valid_l, no_local_noise, s_local, rate_l = local
    dp = x.delta_prime
    dp_bad = dp >= 1
    reason = dp_bad.long() * REASON_DELTA_PRIME
    reason = reason + (hoeffding_undefined & ~dp_bad).long() * REASON_HOEFFDING
    reason = reason + ((s_central == 0) & (reason == 0)).long() * REASON_NO_CENTRAL_NOISE
    central_bad = reason != 0
    reason = reason + no_local_noise.long() * REASON_NO_LOCAL_NOISE
    # Conditioned on the concentration event (probability >= 1 - delta'), user k takes
    # part with probability at most p_k / (1 - delta').
    q = torch.clamp(x.max_participation_prob / (1.0 - torch.where(dp_bad, torch.zeros_like(dp), dp)), max=1.0)
    eps_c, q_delta = amplify_by_sampling(epsilon=eps0_c, delta=x.delta_l, sampling_rate=q)
    eps_c = torch.where(central_bad, torch.full_like(eps_c, math.inf), eps_c)
    delta_c = torch.clamp(q_delta + dp, max=1.0)
    s_central = torch.where(central_bad, torch.zeros_like(s_central), s_central)
    if classic:
        valid_c = (eps0_c <= 1.0) & ~central_bad
    else:
        valid_c = torch.ones((), dtype=torch.bool, device=dp.device)
        valid_l = valid_c
    b = x.batch

    def grid(t: Tensor) -> Tensor:
        return torch.broadcast_to(t, b)

    return RoundBound(
        epsilon_local=grid(eps_l), delta_local=grid(delta_loc), epsilon_central=grid(eps_c),
        delta_central=grid(delta_c), users=grid(x.users), mean_participants=grid(x.mean_participants),
        delta_prime=grid(dp), quantile=grid(quantile), central_noise_std=grid(s_central),
        central_sampling_rate=grid(q), local_noise_std=grid(s_local),
        local_sampling_rate=grid(rate_l), sensitivity=grid(x.sensitivity),
        classic_valid=grid(valid_c), classic_valid_local=grid(valid_l), reason=grid(reason))


GRID_CHUNK = 1 << 16
"""Grid points per chunk in :func:`evaluate_in_chunks` (small temporaries stay in cache)."""

_ROUND_ARGS = ("participation_prob", "noise_var", "alignment_gain", "n0", "sensitivity", "delta_l",
               "delta_prime", "users", "dim")


def evaluate_in_chunks(round_bound: Callable[..., RoundBound], *, chunk_size: int = GRID_CHUNK,
                       **kwargs) -> RoundBound:
    """Evaluate an accountant's ``round_bound`` slice by slice along the grid's first dimension.

    Elementwise math on 10^6-point tensors spends most of its time allocating and
    faulting in fresh 8 MB buffers; slices of ~``chunk_size`` points keep the
    temporaries small and the result identical. Inputs that do not vary along the
    first grid dimension (fewer dimensions, or size 1 there) are passed whole; the
    per-user arguments keep their trailing users dimension. When every input is at
    most ``chunk_size`` elements (a product grid built by broadcasting small axes), the
    grid is evaluated in one call: each quantity is then computed only on the broadcast
    shape of the inputs it depends on.
    """
    per_user = kwargs.get("users") is None

    def grid_shape(name, value):
        if not isinstance(value, torch.Tensor):
            return torch.Size([])
        if per_user and name in ("participation_prob", "noise_var"):
            return value.shape[:-1]
        return value.shape

    shapes = {name: grid_shape(name, v) for name, v in kwargs.items()}
    batch = torch.broadcast_shapes(*shapes.values())
    total = math.prod(batch)
    largest_input = max(math.prod(shape) for shape in shapes.values())
    if len(batch) == 0 or largest_input <= chunk_size or batch[0] == 1:
        # Small inputs (a product grid built by broadcasting): every quantity is computed
        # on the broadcast shape of what it depends on, which is cheaper than chunking.
        return round_bound(**kwargs)
    rows = max(1, chunk_size // max(1, total // batch[0]))
    parts = []
    for start in range(0, batch[0], rows):
        part = {}
        for name, value in kwargs.items():
            shape = shapes[name]
            if len(shape) == len(batch) and shape[0] > 1:
                value = value[start:start + rows]
            part[name] = value
        parts.append(round_bound(**part))
    return RoundBound(**{f: None if getattr(parts[0], f) is None else torch.cat([getattr(pt, f) for pt in parts])
                         for f in RoundBound.__dataclass_fields__})


def paper_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                delta_prime="auto", users=None, dim=None) -> RoundBound:
    """The paper's per-round LDP and central DP (spec: Accountant ``paper``).

    LDP (per user, worst user reported), delta_l,k = p_k delta_l:

        eps_l,k,t = log(1 + p_k (exp(eps_G(Delta, sqrt(sigma_k^2 + N0/c_t^2), delta_l)) - 1))

    Central, with m_t = mu_t - K beta_t (Hoeffding), s_c^2 = m_t sigma_min^2 (channel
    noise left out, which only makes the bound larger), q = min(1, p_max / (1 - delta')):

        eps_c,t = log(1 + q (exp(eps_G(Delta, s_c, delta_l)) - 1)),   delta_c,t = q delta_l + delta'.

    eps_G is the classic Gaussian formula. With uniform p and equal sigma this is the
    paper's form  log(1 + p/(1-delta') (exp(c / sqrt(K (p - beta))) - 1)),
    c = Delta sqrt(2 ln(1.25/delta_l)) / sigma. Undefined (+inf, reason) where
    mu_t <= K beta_t or delta' >= 1. See the module docstring for the arguments.
    """
    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var, alignment_gain=alignment_gain,
                      n0=n0, sensitivity=sensitivity, delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    local = _local_dp(x, classic_gaussian_epsilon, amplify=True)
    dp = torch.clamp(x.delta_prime, max=1.0 - 1e-16)
    m = hoeffding_lower_quantile(mean_participants=x.mean_participants, users=x.users, delta_prime=dp)
    undefined = m <= 0
    s_central = torch.sqrt(torch.clamp(m, min=0.0) * x.min_noise_var)
    eps0_c = classic_gaussian_epsilon(sensitivity=x.sensitivity, noise_std=s_central, delta=x.delta_l)
    return _finish(x, local=local, quantile=m, s_central=s_central, eps0_c=eps0_c, hoeffding_undefined=undefined,
                   classic=True)


def tight_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                delta_prime="auto", users=None, dim=None) -> RoundBound:
    """``paper``'s argument with sharper pieces (spec: Accountant ``tight``).

    - m_t = the largest integer m with P(|K_t| < m) <= delta' under the exact
      Poisson-binomial law of |K_t| (binomial for uniform p); always >= ``paper``'s
      Hoeffding m_t, and defined for every delta' in (0, 1);
    - eps_G = the analytic Gaussian mechanism (Balle & Wang 2018), for LDP and central;
    - central noise s_c^2 = m_t sigma_min^2 + N0/c_t^2 (the channel noise counts).

    LDP: eps_G(Delta, sqrt(sigma_k^2 + N0/c_t^2), delta_l) without amplification, delta
    p_k delta_l (:func:`_local_dp`). Where ``paper``'s classic step is valid (eps_0 <= 1)
    the central eps never exceeds ``paper``'s. See the module docstring for the arguments.
    """
    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var, alignment_gain=alignment_gain,
                      n0=n0, sensitivity=sensitivity, delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    local = _local_dp(x, analytic_gaussian_epsilon, amplify=False)
    dp = torch.clamp(x.delta_prime, max=1.0 - 1e-16)
    if x.uniform:
        m = binomial_lower_quantile(users=x.users, p=x.participation_prob[..., 0], delta_prime=dp)
    else:
        m = poisson_binomial_lower_quantile(p=x.participation_prob, delta_prime=dp)
    s_central = torch.sqrt(m * x.min_noise_var + x.channel_noise_var)
    eps0_c = analytic_gaussian_epsilon(sensitivity=x.sensitivity, noise_std=s_central, delta=x.delta_l)
    return _finish(x, local=local, quantile=m, s_central=s_central, eps0_c=eps0_c,
                   hoeffding_undefined=torch.zeros((), dtype=torch.bool, device=m.device), classic=False)


def lazy_round_bound(target: str) -> Callable[..., RoundBound]:
    """A ``round_bound`` that imports ``"package.module:function"`` on first call.

    Lets an accountant's own module import this one (RoundBound, prepare_round) while
    its registry line lives here, without an import cycle.
    """
    module_name, _, attr = target.partition(":")
    cache: list[Callable[..., RoundBound]] = []

    def round_bound(**kwargs) -> RoundBound:
        if not cache:
            import importlib

            cache.append(getattr(importlib.import_module(module_name), attr))
        return cache[0](**kwargs)

    round_bound.__name__ = attr
    round_bound.__qualname__ = target
    round_bound.__doc__ = f"{target} (imported on first use)."
    return round_bound


@dataclass(frozen=True)
class Accountant:
    """A registered accountant: a name, its per-round function and a one-line summary."""

    name: str
    round_bound: Callable[..., RoundBound]
    summary: str

    def bound(self, **kwargs) -> RoundBound:
        """``round_bound(**kwargs)`` evaluated in grid chunks (:func:`evaluate_in_chunks`)."""
        return evaluate_in_chunks(self.round_bound, **kwargs)


ACCOUNTANTS: dict[str, Accountant] = {
    "paper": Accountant("paper", paper_round, "the paper's closed forms: Hoeffding quantile, classic Gaussian"),
    "tight": Accountant("tight", tight_round,
                        "exact Poisson-binomial quantile, analytic Gaussian, channel noise included, unamplified LDP"),
    "exact": Accountant("exact", lazy_round_bound("otafl.privacy.exact:round_bound"),
                        "numerical hockey-stick bound of the over-the-air round (counts revealed, dimension-aware)"),
}
"""Accountants by name (``click.Choice(sorted(ACCOUNTANTS))``)."""


def get_accountant(name: str) -> Accountant:
    """The registered accountant ``name``; OtaflInputError naming the choices otherwise."""
    if name not in ACCOUNTANTS:
        raise OtaflInputError(f"accountant = {name!r} is outside the allowed range {{{', '.join(sorted(ACCOUNTANTS))}}}")
    return ACCOUNTANTS[name]


def compose_round_bounds(bound: RoundBound, *, delta_target=None, delta_slack, rdp_resolution: float = 1e-2
                         ) -> dict[str, Tensor]:
    """Totals over the last dimension (rounds) of a RoundBound with fields [..., T].

    Local and central each take the smallest of basic, advanced and RDP composition
    (:func:`otafl.privacy.compose.compose_best`) at one total delta: ``delta_target``
    or, by default, the basic composition's delta plus ``delta_slack``. RDP uses the
    round's sampled-Gaussian view (rate, noise std / Delta); the central total adds
    sum_t delta'_t for the concentration events.

    Returns
    -------
    dict of [...] tensors: ``epsilon_local_total``, ``delta_local_total``,
    ``composition_local`` (index into COMPOSITIONS), ``epsilon_central_total``,
    ``delta_central_total``, ``composition_central``.
    """
    def rdp_view(rate, std):
        if rate is None or std is None:
            return None, None
        return rate, std / bound.sensitivity

    q_l, z_l = rdp_view(bound.local_sampling_rate, bound.local_noise_std)
    local = compose_best(epsilon=bound.epsilon_local, delta=bound.delta_local, delta_target=delta_target,
                         delta_slack=delta_slack, sampling_rate=q_l, noise_multiplier=z_l,
                         rdp_resolution=rdp_resolution)
    q_c, z_c = rdp_view(bound.central_sampling_rate, bound.central_noise_std)
    central = compose_best(epsilon=bound.epsilon_central, delta=bound.delta_central, delta_target=delta_target,
                           delta_slack=delta_slack, sampling_rate=q_c, noise_multiplier=z_c,
                           event_delta=bound.delta_prime, rdp_resolution=rdp_resolution)
    return {
        "epsilon_local_total": local["epsilon"], "delta_local_total": local["delta"],
        "composition_local": local["composition"],
        "epsilon_central_total": central["epsilon"], "delta_central_total": central["delta"],
        "composition_central": central["composition"],
    }


def composition_name(index: int) -> str:
    """Name of a composition index from :func:`compose_round_bounds` ('none' for -1)."""
    return COMPOSITIONS[index] if index >= 0 else "none"


def account_run(facts: list[RoundFacts], *, accountants: Sequence[str], delta_l: float,
                delta_prime: float | str = "auto", delta_target: float | None = None,
                rdp_resolution: float = 1e-2) -> dict:
    """Per-round and whole-run privacy of a training run, for each named accountant.

    Parameters
    ----------
    facts : one :class:`RoundFacts` per round (T >= 1, same K every round).
    accountants : names in :data:`ACCOUNTANTS`.
    delta_l : delta of the Gaussian step, in (0, 1).
    delta_prime : number in (0, 1) or "auto" (2 exp(-2 mu_t^2/K) + 1e-5 per round).
    delta_target : total delta of the run for the composed totals; default: the basic
        composition's total delta plus delta_l.
    rdp_resolution : conservative grid for the Opacus calls (see otafl.privacy.compose).

    Returns
    -------
    A flat dict of JSON-able values; for every accountant name A:
    ``A_epsilon_local_max`` (worst user, worst round), ``A_delta_local``,
    ``A_epsilon_central`` (worst round), ``A_delta_central``, ``A_epsilon_local_total``,
    ``A_delta_local_total``, ``A_epsilon_central_total``, ``A_delta_central_total``,
    ``A_composition`` (basic|advanced|rdp|none, for the central total),
    ``A_composition_local``, ``A_defined`` (bool, every round defined), ``A_reason``
    (str, '' when defined), ``A_classic_valid`` (bool, every round), and the per-round
    lists ``A_epsilon_central_per_round`` and ``A_epsilon_local_max_per_round``.
    Non-finite epsilons are ``float('inf')`` (``json.dumps`` writes ``Infinity``).
    """
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if delta_target is not None:
        check_range("delta_target", delta_target, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    x = stack_facts(facts)
    out: dict = {}
    for name in accountants:
        acc = get_accountant(name)
        bound = acc.bound(participation_prob=x["participation_prob"], noise_var=x["noise_var"],
                                alignment_gain=x["alignment_gain"], n0=x["n0"], sensitivity=x["sensitivity"],
                                delta_l=delta_l, delta_prime=delta_prime, dim=x["dim"])
        totals = compose_round_bounds(bound, delta_target=delta_target, delta_slack=delta_l,
                                      rdp_resolution=rdp_resolution)
        reason = 0
        for code in bound.reason.tolist():
            reason |= int(code)
        out.update({
            f"{name}_epsilon_local_max": float(bound.epsilon_local.max()),
            f"{name}_delta_local": float(bound.delta_local.max()),
            f"{name}_epsilon_central": float(bound.epsilon_central.max()),
            f"{name}_delta_central": float(bound.delta_central.max()),
            f"{name}_epsilon_local_total": float(totals["epsilon_local_total"]),
            f"{name}_delta_local_total": float(totals["delta_local_total"]),
            f"{name}_epsilon_central_total": float(totals["epsilon_central_total"]),
            f"{name}_delta_central_total": float(totals["delta_central_total"]),
            f"{name}_composition": composition_name(int(totals["composition_central"])),
            f"{name}_composition_local": composition_name(int(totals["composition_local"])),
            f"{name}_defined": bool(reason == 0),
            f"{name}_reason": reason_text(reason),
            f"{name}_classic_valid": bool((bound.classic_valid & bound.classic_valid_local).all()),
            f"{name}_epsilon_central_per_round": [float(v) for v in bound.epsilon_central.tolist()],
            f"{name}_epsilon_local_max_per_round": [float(v) for v in bound.epsilon_local.tolist()],
        })
    return out
