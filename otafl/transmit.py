"""Transmitter side of over-the-air aggregation: clipping, power budget, alignment, noise.

Every transmitting user k sends (docs/model.md#transmitter)

    x_{k,t} = alpha_{k,t} (g_k + n_{k,t}),       n_{k,t} ~ N(0, sigma_k^2 I_d),

with g_k its gradient clipped to ||g_k||_2 <= L and alpha_{k,t} = c_t / h_{k,t}, so that the
server, dividing the MAC output by c_t, sees the aligned sum

    y_t / c_t = sum_{k in K_t} g_k + sum_{k in K_t} n_{k,t} + m_t / c_t.

Power: E||x||^2 = alpha^2 (||g||^2 + d sigma^2) <= alpha^2 (L^2 + d sigma^2) <= P_k, which holds
for every user iff c_t <= h_k sqrt(P_k / (L^2 + d sigma_k^2)) (the *alignment bound*).
The transmit SNR is SNR_k = P_k / (d N0).

Units: P_k is the energy of one d-dimensional block (sum over coordinates), N0 and sigma^2
are variances per real coordinate, h is an amplitude gain.

All randomness comes from the ``generator`` argument; tensors are computed in the dtype of
the gradients (float64 for exact checks, float32 is fine for training).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range, out_of_range

__all__ = [
    "ALIGNMENT_POLICIES",
    "ChannelSetup",
    "max_power",
    "clip_factors",
    "alignment_bound",
    "alignment_gain",
    "power_scale",
    "transmit_signals",
    "transmit_power",
    "effective_noise_var",
    "resolve_noise_var",
    "resolve_per_user",
    "assign_groups",
]

#: Policies for the alignment gain c_t (see :func:`alignment_gain`).
from otafl.names import ALIGNMENT_POLICIES  # noqa: E402 (the names, torch-free)

#: Noise variance used to turn an SNR into a power when the channel is noiseless (N0 = 0).
REFERENCE_N0 = 1.0


def max_power(snr_db: Tensor, dim: int, n0: float) -> Tensor:
    """Per-user energy budget from the transmit SNR.

    P_k = 10^(SNR_k / 10) d N0,  from SNR_k = P_k / (d N0).

    Parameters
    ----------
    snr_db : [K], float
        Transmit SNR of each user in dB.
    dim : int
        Model dimension d >= 1 (coordinates sent per block).
    n0 : float
        Channel noise variance N0 >= 0 per coordinate. With N0 = 0 the SNR has no noise to
        refer to; a unit reference noise (:data:`REFERENCE_N0` = 1) is used instead, so
        P_k = 10^(SNR_k/10) d. The budget still scales c_t, hence the artificial-noise
        power, exactly as it would on a channel with N0 = 1.

    Returns
    -------
    P : [K], float64, energy per block (same units as ||x||^2)
    """
    dim = int(dim)
    if dim < 1:
        raise out_of_range("model.dim", dim, "[1, inf)")
    n0 = check_range("channel.n0", n0, lo=0.0)
    ref = n0 if n0 > 0.0 else REFERENCE_N0
    snr = torch.as_tensor(snr_db, dtype=torch.float64)
    if not bool(torch.isfinite(snr).all()):
        bad = float(snr[~torch.isfinite(snr)][0])
        raise out_of_range("channel.snr_db", bad, "(-inf, inf) (finite)")
    return torch.pow(10.0, snr / 10.0) * dim * ref


def clip_factors(norms: Tensor, clip: float) -> Tensor:
    """Scale factors min(1, L / ||g_k||) that bring each gradient into the L-ball.

    Parameters
    ----------
    norms : [K], float
        l2 norms ||g_k|| >= 0.
    clip : float
        Clipping norm L > 0.

    Returns
    -------
    factor : [K], dtype of ``norms``; 1 for norms <= L (a zero gradient keeps factor 1),
    0 for an infinite norm, NaN for a NaN norm (a diverged gradient stays visible).
    """
    clip = check_range("clip", clip, lo=0.0, lo_open=True)
    return clip / norms.clamp(min=clip)  # L / L = 1 exactly where ||g_k|| <= L


def alignment_bound(h: Tensor, power: Tensor, clip: float, noise_var: Tensor, dim: int) -> Tensor:
    """Largest c_t user k can support: b_k = h_k sqrt(P_k / (L^2 + d sigma_k^2)).

    With alpha_k = c_t / h_k, alpha_k^2 (L^2 + d sigma_k^2) <= P_k  <=>  c_t <= b_k.

    Parameters
    ----------
    h : [K] amplitude gains >= 0;  power : [K] budgets P_k;  clip : L > 0;
    noise_var : [K] artificial-noise variances sigma_k^2 >= 0;  dim : d >= 1.

    Returns
    -------
    b : [K], float64
    """
    clip = check_range("clip", clip, lo=0.0, lo_open=True)
    h = torch.as_tensor(h, dtype=torch.float64)
    power = torch.as_tensor(power, dtype=torch.float64, device=h.device)
    noise_var = torch.as_tensor(noise_var, dtype=torch.float64, device=h.device)
    return h * torch.sqrt(power / (clip * clip + int(dim) * noise_var))


def alignment_gain(h: Tensor, power: Tensor, clip: float, noise_var: Tensor, dim: int, *,
                   policy: str = "min", threshold: float | None = None,
                   bound: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Alignment gain c_t and which users may transmit.

    c_t = min_{k eligible} h_k sqrt(P_k / (L^2 + d sigma_k^2))   (see :func:`alignment_bound`).

    Policies (:data:`ALIGNMENT_POLICIES`):

    ``"min"`` (default, the paper's)
        Every user is eligible and the min runs over all K users. The server computes c_t
        from its CSI and broadcasts it; it needs no knowledge of K_t, and whichever users
        participate, none exceeds its budget. One deep fade drags c_t (hence the SNR of
        the aggregate) down for everybody.
    ``"truncate"``
        Users with h_k < ``threshold`` stay silent this round (eligible False) and the
        min runs over the rest; if nobody is eligible, c_t = 0 and nobody transmits
        (the round carries no update and must be skipped). Truncation multiplies each
        user's effective participation probability by 1[h_k >= threshold]:
        p_eff_{k,t} = p_{k,t} 1[h_{k,t} >= threshold].
        Use p_eff for mu_t (the ``unknown`` estimator) and in the privacy accounting.

    Parameters
    ----------
    h : [K], float — amplitude gains h_{k,t} >= 0 of this round.
    power : [K], float — energy budgets P_k (:func:`max_power`).
    clip : float — clipping norm L > 0.
    noise_var : [K], float — artificial-noise variances sigma_{k,t}^2 >= 0.
    dim : int — model dimension d.
    policy : str — one of :data:`ALIGNMENT_POLICIES`.
    threshold : float | None — truncation threshold >= 0 (required by ``"truncate"``).
    bound : [K] float64, optional — :func:`alignment_bound` of these arguments, when the
        caller has it already (:class:`ChannelSetup` precomputes its per-run
        factor); not checked against them.

    Returns
    -------
    c_t : [], float64, >= 0
    eligible : [K], bool
    """
    if policy not in ALIGNMENT_POLICIES:
        raise OtaflInputError(
            f"alignment policy {policy!r} is unknown; choose one of: {', '.join(ALIGNMENT_POLICIES)}")
    if bound is None:
        bound = alignment_bound(h, power, clip, noise_var, dim)
    if policy == "min":  # everybody is eligible
        return bound.min(), torch.ones_like(bound, dtype=torch.bool)
    if threshold is None:
        raise OtaflInputError("alignment policy 'truncate' needs a threshold (h_k below it stay silent)")
    th = check_range("alignment.threshold", threshold, lo=0.0)
    eligible = torch.as_tensor(h, dtype=torch.float64, device=bound.device) >= th
    if not bool(eligible.any()):
        return torch.zeros((), dtype=torch.float64, device=bound.device), eligible
    inf = torch.full((), math.inf, dtype=torch.float64, device=bound.device)
    return torch.where(eligible, bound, inf).min(), eligible


def power_scale(h: Tensor, c_t) -> Tensor:
    """Power-control factor alpha_k = c_t / h_k that aligns every user at the receiver.

    Parameters
    ----------
    h : [K], float — amplitude gains >= 0.
    c_t : float or [] tensor — alignment gain from :func:`alignment_gain`.

    Returns
    -------
    alpha : [K], float64. Users with h_k = 0 cannot be aligned; they get alpha = 0 (they
    are never eligible for c_t > 0, and with c_t = 0 everybody gets 0).
    """
    h = torch.as_tensor(h, dtype=torch.float64)
    c = torch.as_tensor(c_t, dtype=torch.float64, device=h.device)
    zero = torch.zeros((), dtype=torch.float64, device=h.device)
    return torch.where(h > 0, c / torch.where(h > 0, h, torch.ones_like(h)), zero)


def transmit_signals(grads: Tensor, alpha: Tensor, noise_var: Tensor, generator: torch.Generator,
                     *, return_noise: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Build every user's channel input x_k = alpha_k (g_k + n_k), n_k ~ N(0, sigma_k^2 I_d).

    Parameters
    ----------
    grads : [K, d], float — gradients, already clipped to ||g_k|| <= L.
    alpha : [K], float — power-control factors (:func:`power_scale`).
    noise_var : [K], float — artificial-noise variances sigma_k^2 >= 0.
    generator : torch.Generator
        Exactly one draw, ``torch.randn(K, d, dtype=grads.dtype)``, for *every* row
        (users with sigma^2 = 0 or who stay silent included), so the stream does not depend
        on who participates; n = sqrt(sigma^2)[:, None] * that draw.
    return_noise : bool, keyword-only — also return n.

    Returns
    -------
    x : [K, d], dtype and device of ``grads``; ``(x, n)`` when ``return_noise``.
    """
    if grads.ndim != 2:
        raise OtaflInputError(f"grads has shape {tuple(grads.shape)}; expected [K, d]")
    K, d = grads.shape
    var = torch.as_tensor(noise_var, dtype=grads.dtype).to(grads.device)
    if var.shape != (K,):
        raise OtaflInputError(f"noise_var has shape {tuple(var.shape)}; expected [{K}]")
    bad = ~(var >= 0)
    if bool(bad.any()):
        raise out_of_range("transmit.sigma2", float(var[bad][0]), "[0, inf)")
    z = torch.randn(K, d, generator=generator, dtype=grads.dtype, device=generator.device)
    n = torch.sqrt(var)[:, None] * z.to(grads.device)
    a = torch.as_tensor(alpha, dtype=grads.dtype).to(grads.device)
    x = a[:, None] * (grads + n)
    return (x, n) if return_noise else x


def transmit_power(grad_norms: Tensor, alpha, noise_var, dim: int) -> Tensor:
    """Expected energy of each transmission: E||x_k||^2 = alpha_k^2 (||g_k||^2 + d sigma_k^2).

    Parameters
    ----------
    grad_norms : [K] — norms of the gradients actually sent (after clipping).
    alpha : [K] — power-control factors.  noise_var : [K] — sigma_k^2.  dim : d.

    Returns
    -------
    energy : [K], float64 (compare with :func:`max_power`).
    """
    g = torch.as_tensor(grad_norms, dtype=torch.float64)
    a = torch.as_tensor(alpha, dtype=torch.float64, device=g.device)
    v = torch.as_tensor(noise_var, dtype=torch.float64, device=g.device)
    return a * a * (g * g + int(dim) * v)


def effective_noise_var(noise_var: Tensor, active: Tensor, n0: float, c_t) -> Tensor:
    """Noise per coordinate of the aligned sum y_t / c_t, in gradient units.

    sigma_z,t^2 = sum_{k in K_t} sigma_k^2 + N0 / c_t^2.

    Parameters
    ----------
    noise_var : [K] — sigma_k^2.  active : [K] bool — who transmitted.
    n0 : float — N0 >= 0.  c_t : alignment gain >= 0.

    Returns
    -------
    var : [], float64. N0 = 0 contributes 0 even when c_t = 0; c_t = 0 with N0 > 0 gives +inf
    (nothing was sent, the round is pure noise).
    """
    n0 = check_range("channel.n0", n0, lo=0.0)
    v = torch.as_tensor(noise_var, dtype=torch.float64)
    mask = torch.as_tensor(active, dtype=torch.bool, device=v.device)
    c = torch.as_tensor(c_t, dtype=torch.float64, device=v.device)
    artificial = torch.where(mask, v, torch.zeros((), dtype=v.dtype, device=v.device)).sum()
    if n0 == 0.0:
        return artificial
    return artificial + n0 / (c * c)


def resolve_noise_var(sigma2: float | Sequence[float] | Tensor, group_of_user: Tensor, users: int,
                      *, n_groups: int | None = None) -> Tensor:
    """Artificial-noise variance sigma_k^2 of every user from a scalar, per-group or per-user spec
    (:func:`resolve_per_user` with the name ``transmit.sigma2``)."""
    return resolve_per_user(sigma2, group_of_user, users, name="transmit.sigma2", n_groups=n_groups)


def resolve_per_user(values: float | Sequence[float] | Tensor, group_of_user: Tensor, users: int, *,
                     name: str, n_groups: int | None = None) -> Tensor:
    """One finite value >= 0 per user from a scalar, per-group or per-user spec.

    Parameters
    ----------
    values : float | sequence of float | tensor
        A scalar (or a length-1 list) applies to all users; a list of length ``n_groups``
        gives one value per group; a list of length K one per user. When n_groups == K the
        per-group reading is used (it equals the per-user one when user k is group k).
    group_of_user : [K], int64 — group index of each user (:func:`assign_groups`).
    users : int — K.
    name : str — the spec key, quoted in errors (e.g. ``transmit.sigma2``).
    n_groups : int, optional — number of groups; default ``group_of_user.max() + 1``.

    Returns
    -------
    [K], float64, >= 0

    Raises
    ------
    OtaflInputError : a negative, infinite or NaN value (the message quotes it), or a list of
    a length that is neither 1, n_groups nor K (the message names the allowed lengths).
    """
    users = int(users)
    groups = torch.as_tensor(group_of_user, dtype=torch.int64)
    if groups.shape != (users,):
        raise OtaflInputError(f"group_of_user has shape {tuple(groups.shape)}; expected [{users}]")
    if n_groups is None:
        n_groups = int(groups.max()) + 1 if users > 0 else 0
    flat = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    for v in flat.tolist():
        check_range(name, v, lo=0.0)
        if math.isinf(v):
            raise out_of_range(name, v, "[0, inf)")
    n = flat.numel()
    if n == 1:
        return flat.expand(users).clone()
    if n == n_groups:
        return flat[groups]
    if n == users:
        return flat.clone()
    raise OtaflInputError(
        f"{name} has {n} values; allowed lengths are 1 (all users), "
        f"{n_groups} (one per group) or {users} (one per user)")


def assign_groups(users: int, group_sizes: Sequence[int] | None, n_groups: int) -> Tensor:
    """Group index of every user (users are numbered consecutively, group by group).

    - ``group_sizes`` summing to K (e.g. the paper's [68, 66, 66] for K = 200): used as is;
      its length must equal ``n_groups``.
    - ``group_sizes`` with another sum: read as weights; K is split over the groups in
      proportion to them by the largest-remainder (Hamilton) method: each group gets
      floor(K w_j / sum w), and the users left over go one each to the groups with the largest
      fractional parts, ties to the lower index. Exact arithmetic (fractions).
    - ``None``: an even split, i.e. equal weights: the first K mod n_groups groups get one
      user more.

    Parameters
    ----------
    users : int — K >= 1.  group_sizes : list of int >= 0 or None.  n_groups : int >= 1.

    Returns
    -------
    group_of_user : [K], int64, non-decreasing, values in [0, n_groups). A group can be empty
    only when its weight is (relatively) tiny.
    """
    users = int(users)
    n_groups = int(n_groups)
    if users < 1:
        raise out_of_range("users", users, "[1, inf)")
    if n_groups < 1:
        raise out_of_range("channel.n_groups", n_groups, "[1, inf)")
    if group_sizes is None:
        weights = [1] * n_groups
    else:
        weights = [int(w) for w in group_sizes]
        if len(weights) != n_groups:
            raise OtaflInputError(
                f"channel.group_sizes has {len(weights)} entries but n_groups = {n_groups}")
        for w in weights:
            if w < 0:
                raise out_of_range("channel.group_sizes", w, "[0, inf)")
        if sum(weights) == 0:
            raise OtaflInputError(f"channel.group_sizes = {weights} sums to 0")
    total = sum(weights)
    if total == users:
        sizes = weights
    else:
        quotas = [Fraction(users * w, total) for w in weights]
        sizes = [q.numerator // q.denominator for q in quotas]
        left = users - sum(sizes)
        order = sorted(range(n_groups), key=lambda j: (-(quotas[j] - sizes[j]), j))
        for j in order[:left]:
            sizes[j] += 1
    return torch.repeat_interleave(torch.arange(n_groups, dtype=torch.int64),
                                   torch.tensor(sizes, dtype=torch.int64))


@dataclass(frozen=True)
class ChannelSetup:
    """What stays fixed over a run: budgets, noise levels and the alignment policy.

    power : [K] float64, P_k = SNR_k d N0 (transmit power budget, signal units)
    noise_var : [K] float64, sigma_k^2 (artificial noise, gradient units)
    csi : None (perfect CSI: alignment inverts h) or the run's known gains
        (:class:`otafl.channel.csi.KnownGains`: alignment inverts h_hat, docs/model.md#channel-state-information)

    power_control : the run's power-control policy (:class:`otafl.fl.power.PowerControl`), which
    decides c_t from the alignment bound (:meth:`full_gain`); None: full power, c_t = the bound.

    Derived once (not an argument): ``bound_scale`` [K] = sqrt(P_k / (L^2 + d sigma_k^2)), so
    that user k's alignment bound in a round is h_k * bound_scale_k
    (:func:`alignment_bound`).
    """

    power: Tensor
    noise_var: Tensor
    n0: float
    clip: float
    dim: int
    alignment: str = "min"
    threshold: float | None = None
    power_control: object | None = field(default=None, repr=False, compare=False)
    csi: object | None = field(default=None, repr=False, compare=False)  # KnownGains (estimated CSI) or None (perfect)
    bound_scale: Tensor = field(init=False, repr=False)

    def __post_init__(self):
        ones = torch.ones_like(self.power, dtype=torch.float64)
        object.__setattr__(self, "bound_scale",
                           alignment_bound(ones, self.power, self.clip, self.noise_var, self.dim))

    @property
    def may_silence(self) -> bool:
        """Whether a round may leave some active users ineligible (truncation, or a policy's)."""
        return self.alignment != "min" or bool(getattr(self.power_control, "silences", False))

    def gain(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """c_t and the eligible users for gains h [K]: the power-control policy's, or
        :meth:`full_gain` without one."""
        if self.power_control is not None:
            return self.power_control.gain(self, h)
        return self.full_gain(h)

    def full_gain(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """c_t at full power and the eligible users for gains h [K]: :func:`alignment_gain`
        with the per-run factor precomputed."""
        return alignment_gain(h, self.power, self.clip, self.noise_var, self.dim, policy=self.alignment,
                              threshold=self.threshold, bound=h * self.bound_scale)
