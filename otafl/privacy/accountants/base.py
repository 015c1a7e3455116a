"""What every accountant shares: validated round inputs, the RoundBound result, reasons, chunking.

An accountant is a pure batched function (keyword-only arguments) that reads one round's
privacy facts and returns a :class:`RoundBound`:

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

Adding an accountant: write ``otafl/privacy/accountants/<name>.py`` with a function of
the signature above (:func:`prepare_round` does the validation, the uniform/per-user
handling and delta'; return a :class:`RoundBound`), then add one line to
:data:`otafl.privacy.accountants.registry.ACCOUNTANTS`; the contract test in
tests/test_privacy_accountants.py then runs on it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.analysis.concentration import AutoShare, auto_delta_prime
from otafl.privacy.analysis.gaussian import as_float64, broadcast_shapes

__all__ = [
    "REASON_HOEFFDING",
    "REASON_DELTA_PRIME",
    "REASON_NO_CENTRAL_NOISE",
    "REASON_NO_LOCAL_NOISE",
    "REASON_BEYOND_RANGE",
    "REASON_NO_STEP_NOISE",
    "REASONS",
    "CENTRAL_REASONS",
    "reason_text",
    "RoundInputs",
    "prepare_round",
    "RoundBound",
    "GRID_CHUNK",
    "evaluate_in_chunks",
]

REASON_HOEFFDING = 1
REASON_DELTA_PRIME = 2
REASON_NO_CENTRAL_NOISE = 4
REASON_NO_LOCAL_NOISE = 8
REASON_BEYOND_RANGE = 16
REASON_NO_STEP_NOISE = 32

REASONS: dict[int, str] = {
    REASON_HOEFFDING: "Hoeffding quantile undefined: mu_t <= K beta_t (too few expected participants for delta')",
    REASON_DELTA_PRIME: "delta' >= 1: too few expected participants for the concentration step",
    REASON_NO_CENTRAL_NOISE: "no central noise: zero participant quantile or zero artificial noise, and no channel noise",
    REASON_NO_LOCAL_NOISE: "no local noise: sigma_k^2 = 0 and no channel noise",
    REASON_BEYOND_RANGE: "epsilon beyond the accountant's numerical range: the noise is tiny against the "
                         "sensitivity (exact solves up to eps = 1e7; tight states a finite, looser value)",
    REASON_NO_STEP_NOISE: "no step noise: the local DP-SGD steps add none (transmit.step_noise = 0), and the "
                          "record-level steps accountant credits nothing else to the target's own steps",
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
        finite, per coordinate, gradient units.
    alignment_gain : [...], float -- c_t >= 0 (0: a silent round, nothing reaches the
        server; +inf: no receiver noise in the sum, as ``ideal`` and ``digital`` rounds
        record); N0 / c_t^2 must be finite.
    n0 : [...], float -- receiver noise variance N0 >= 0, finite (0: no channel noise).
    sensitivity : [...], float -- Delta > 0, finite.
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
    # Infinite facts are refused, not read as "no signal": an overflowed L^2 or N0 would
    # otherwise give epsilon 0 (or nan) for a round that leaks.
    _check_tensor("noise_var", var, 0.0, math.inf, hi_open=True)
    _check_tensor("alignment_gain", c, 0.0)  # +inf: no receiver noise reaches the sum (ideal, digital)
    _check_tensor("n0", n0, 0.0, math.inf, hi_open=True)
    _check_tensor("sensitivity", delta_s, 0.0, math.inf, lo_open=True, hi_open=True)
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
    batch = broadcast_shapes(p.shape[:-1], var.shape[:-1], K.shape, c.shape, n0.shape, delta_s.shape,
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
    if isinstance(delta_prime, AutoShare):  # "auto" with a run's share of delta_total per round
        dp = auto_delta_prime(mean_participants=mu, users=K, slack=delta_prime.slack)
    elif isinstance(delta_prime, str):
        if delta_prime != "auto":
            raise OtaflInputError(f"delta_prime = {delta_prime!r} is outside the allowed range (0, 1) or 'auto'")
        dp = auto_delta_prime(mean_participants=mu, users=K)
    else:
        dp = as_float64(delta_prime, device=p.device)[0]
        _check_tensor("delta_prime", dp, 0.0, 1.0, lo_open=True, hi_open=True)
        batch = broadcast_shapes(batch, dp.shape)
    channel = torch.where(n0 == 0, torch.zeros_like(c), n0 / (c * c))
    over = torch.isinf(channel) & (c > 0)
    if bool(over.any()):  # c_t^2 underflows: N0 / c_t^2 is not representable (c_t = 0 is a silent round)
        bad_c, bad_n0 = (torch.broadcast_to(t, channel.shape)[over][0].item() for t in (c, n0))
        raise OtaflInputError(f"alignment_gain = {bad_c!r} with n0 = {bad_n0!r} is outside the allowed range: "
                              "N0 / c_t^2 overflows float64 (c_t^2 >= N0 / 1.8e308)")
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
        :func:`~otafl.privacy.accountants.closed_form.local_dp`). Always True for the other
        accountants.
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


CENTRAL_REASONS = REASON_HOEFFDING | REASON_DELTA_PRIME | REASON_NO_CENTRAL_NOISE | REASON_NO_STEP_NOISE
"""The reason bits that make the central bound +inf."""


GRID_CHUNK = 1 << 16
"""Grid points per chunk in :func:`evaluate_in_chunks` (small temporaries stay in cache)."""


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
    batch = broadcast_shapes(*shapes.values())
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
