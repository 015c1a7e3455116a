"""How the central leakage scales with the number of users K (the paper's O(1/K^{3/4})).

With uniform p = a K^{-1/2} (a above sqrt(ln(2/delta')/2)) the ``paper`` bound falls as
K^{-3/4}; with a fixed p as K^{-1/2} (docs/privacy/paper-tight.md#scaling). Sketch:
m_t = K(p - beta) grows as K (fixed p) or as sqrt(K) (p = a/sqrt(K)), the central noise
std as its square root, so eps_0 ~ K^{-1/2} or K^{-1/4}; amplification multiplies by
q ~ p, constant or K^{-1/2}. Those exponents describe the ``paper`` bound; ``exact``
(the numerically integrated leakage of the round, dimension-aware) shows how the true
per-round leakage scales on the same grid.

:func:`scaling_curves` evaluates both schemes on given K values and fits log-log slopes
(over the whole range and over its lower and upper half); :func:`scaling_grid` does so
on a log grid of K and adds one row per (K, accountant, scheme). The figure is drawn by
:func:`otafl.report.scaling.plot_scaling`.

Channel: h = 1 and the ``min`` alignment policy for identical users, as ``otafl bound``,
c = sqrt(P / (L^2 + d sigma^2)) with P = 10^(SNR/10) d N0 (docs/model.md#alignment); the
channel adds N0 / c^2 per coordinate (gradient units), about sigma^2 / SNR. ``paper``
leaves it out of its central bound; ``tight`` and ``exact`` include it. ``n0 = 0``: no
channel noise.

Cost: ``paper`` and ``tight`` are one batched call per scheme. ``exact`` is evaluated one
K at a time (a progress step each): about 0.2-10 s a point on one CPU thread, most at
large K with p = a K^{-1/2} (K = 10^6: ~0.3 s fixed p, ~8 s sqrt p), so by default it
gets a coarser grid (``exact_points``). A small ``delta_l`` makes ``exact`` much slower
(1e-10: minutes a point).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch

from otafl.device import default_threads
from otafl.api.defaults import JSON_NON_FINITE, PAPER_DIM, SCALING_SCHEMES
from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants import get_accountant

__all__ = ["SCHEMES", "THEORY_SLOPES", "SLOW_ACCOUNTANTS", "fit_loglog_slope", "log_users", "scaling_curves",
           "scaling_grid"]

SCHEMES = SCALING_SCHEMES
"""fixed_p: p constant; sqrt_p: p = a K^{-1/2}."""

THEORY_SLOPES = {"fixed_p": -0.5, "sqrt_p": -0.75}
"""The asymptotic exponents: fixed p -> K^{-1/2}, p = a K^{-1/2} -> K^{-3/4}."""

SLOW_ACCOUNTANTS = ("exact",)
"""Accountants evaluated one K at a time on the coarser ``exact_points`` grid."""

Progress = Callable[[int, int, str], None]
"""progress(steps_done_now, total_steps, label): called with 0 first, then after each evaluation."""


def fit_loglog_slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, int]:
    """Least-squares line through (log x, log y) over the finite, positive points.

    Returns
    -------
    (slope, intercept, points used); slope and intercept are nan with fewer than 2 points.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(y) & (y > 0) & (x > 0)
    if ok.sum() < 2:
        return math.nan, math.nan, int(ok.sum())
    slope, intercept = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)
    return float(slope), float(intercept), int(ok.sum())


def _fit(users: Sequence[int], eps: Sequence[float]) -> dict:
    """The whole-range fit plus the fits over the lower and upper half of log K (split at
    the geometric midpoint, which both halves include)."""
    slope, intercept, used = fit_loglog_slope(users, eps)
    x = np.asarray(users, dtype=float)
    y = np.asarray(eps, dtype=float)
    mid = math.sqrt(x.min() * x.max())
    low = fit_loglog_slope(x[x <= mid * (1 + 1e-9)], y[x <= mid * (1 + 1e-9)])[0]
    high = fit_loglog_slope(x[x >= mid * (1 - 1e-9)], y[x >= mid * (1 - 1e-9)])[0]
    return {"slope": slope, "intercept": intercept, "points": used, "slope_low": low, "slope_high": high,
            "k_mid": mid}


from otafl.api.checks import check_log_users, check_scaling_grid, check_scaling_inputs  # noqa: E402 (torch-free)


def log_users(k_min: float, k_max: float, points: int) -> list[int]:
    """``points`` log-spaced K values from ``k_min`` to ``k_max``, rounded, repeats dropped."""
    check_log_users(k_min, k_max, points)
    return [int(k) for k in np.unique(np.round(np.logspace(math.log10(k_min), math.log10(k_max), points)))]


def alignment_gain(*, snr_db: float, n0: float, clip: float, sigma2: float, dim: int) -> float:
    """c = sqrt(P / (L^2 + d sigma^2)), P = 10^(SNR/10) d N0 (h = 1, ``min`` policy, as
    ``otafl bound``; N0 = 0 takes the unit reference noise of :func:`otafl.transmit.max_power`)."""
    from otafl.transmit import max_power

    power = float(max_power(torch.tensor([float(snr_db)], dtype=torch.float64), int(dim), n0)[0])
    return math.sqrt(power / (clip * clip + dim * sigma2))


def scaling_curves(*, users: Sequence[float] | dict[str, Sequence[float]], p: float = 0.5, a: float = 5.0,
                   sigma2: float = 10.0, clip: float = 1.0, delta_l: float = 1e-5,
                   delta_prime: float | str = "auto", accountants: Sequence[str] = ("paper",),
                   dim: int = PAPER_DIM, n0: float = 1.0, snr_db: float = 10.0,
                   progress: Progress | None = None, device: str | torch.device = "cpu") -> dict:
    """Central epsilon vs K for a fixed p and for p = a / sqrt(K), with fitted slopes.

    Parameters
    ----------
    users : the K values (integers >= 1; a log grid such as 10^2 ... 10^6), or a dict
        accountant -> its K values (each accountant listed in ``accountants`` present).
    p : the fixed participation probability, in (0, 1].
    a : the coefficient of p = a K^{-1/2}; a / sqrt(min K) must be <= 1.
    sigma2 : artificial-noise variance per coordinate (> 0, gradient units).
    clip : clipping norm L > 0 (sensitivity 2L).
    delta_l, delta_prime : as in the accountants.
    accountants : registry names, at least one.
    dim : model dimension d (``exact`` depends on it), default :data:`PAPER_DIM`.
    n0 : receiver noise variance N0 >= 0 (0: no channel noise).
    snr_db : transmit SNR (sets the power budget, hence c; module docstring).
    progress : called as ``progress(steps, total, label)`` once before the first evaluation
        (steps 0) and after each (one step per K and scheme).

    Returns
    -------
    dict with ``users`` (the union of the K values, sorted), ``users_of[A]`` (accountant A's
    K values) and per accountant A: ``curves[A]["fixed_p"]`` and ``curves[A]["sqrt_p"]``
    (lists of epsilon over ``users_of[A]``, +inf where undefined) and
    ``slopes[A]["fixed_p"|"sqrt_p"]`` = {"slope", "intercept", "points", "slope_low",
    "slope_high", "k_mid"} (log-log fit over the finite points; the two halves split at
    ``k_mid``); plus the inputs ``p a sigma2 clip delta_l delta_prime dim n0 snr_db`` and
    the derived ``alignment_gain`` and ``channel_noise_var`` (N0 / c^2).
    """
    accountants = check_scaling_inputs(p=p, a=a, sigma2=sigma2, clip=clip, delta_l=delta_l, accountants=accountants,
                                       dim=dim, n0=n0, snr_db=snr_db)
    device = torch.device(device)
    by_name = users if isinstance(users, dict) else {name: users for name in accountants}
    missing = [name for name in accountants if name not in by_name]
    if missing:
        raise OtaflInputError(f"users has no K values for accountant {missing[0]!r}")
    grids = {}
    for name in accountants:
        K = np.round(np.asarray(by_name[name], dtype=float))
        if K.size < 2:
            raise OtaflInputError(f"users has {K.size} value(s); the slope needs at least 2")
        if (K < 1).any():
            check_range("users", float(K[K < 1][0]), lo=1)
        if a / math.sqrt(float(K.min())) > 1:
            raise OtaflInputError(f"a = {a!r} gives p = a/sqrt(K) > 1 at K = {int(K.min())}; "
                                  f"allowed range: a <= sqrt(min K) = {math.sqrt(float(K.min())):.4g}")
        grids[name] = [int(k) for k in K]
    c = alignment_gain(snr_db=snr_db, n0=n0, clip=clip, sigma2=sigma2, dim=dim)
    out = {"users": sorted({k for g in grids.values() for k in g}), "users_of": grids, "p": p, "a": a,
           "sigma2": sigma2, "clip": clip, "delta_l": delta_l, "delta_prime": delta_prime, "dim": int(dim),
           "n0": n0, "snr_db": snr_db, "alignment_gain": c, "channel_noise_var": 0.0 if n0 == 0 else n0 / (c * c),
           "curves": {}, "slopes": {}}
    total = sum(2 * len(g) for g in grids.values())
    done = 0
    kw = dict(noise_var=sigma2, sensitivity=2 * clip, alignment_gain=c, n0=n0, delta_l=delta_l,
              delta_prime=delta_prime, dim=int(dim))
    f64 = dict(dtype=torch.float64, device=device)

    if progress is not None:
        progress(0, total, "start")

    def prob(scheme: str, K: torch.Tensor) -> torch.Tensor:
        return torch.full_like(K, p) if scheme == "fixed_p" else a / torch.sqrt(K)

    for name in accountants:
        acc = get_accountant(name)
        K_all = torch.tensor([float(k) for k in grids[name]], **f64)
        curves = {}
        for scheme in SCHEMES:
            if name in SLOW_ACCOUNTANTS:  # one K at a time: a progress step each, and small batches
                eps = []
                for K in K_all.split(1):
                    eps.append(float(acc.bound(participation_prob=prob(scheme, K), users=K, **kw).epsilon_central))
                    done += 1
                    if progress is not None:
                        progress(done, total, f"{name} {scheme} K={int(K)}")
            else:
                eps = acc.bound(participation_prob=prob(scheme, K_all), users=K_all, **kw).epsilon_central.tolist()
                done += len(grids[name])
                if progress is not None:
                    progress(done, total, f"{name} {scheme}")
            curves[scheme] = eps
        out["curves"][name] = curves
        out["slopes"][name] = {scheme: _fit(grids[name], eps) for scheme, eps in curves.items()}
    return out


def scaling_grid(*, k_min: float = 1e2, k_max: float = 1e6, points: int = 41, exact_points: int = 21,
                 p: float = 0.5, a: float = 5.0, sigma2: float = 10.0, clip: float = 1.0, delta_l: float = 1e-5,
                 delta_prime: float | str = "auto", accountants: Sequence[str] = ("paper",), dim: int = PAPER_DIM,
                 n0: float = 1.0, snr_db: float = 10.0, progress: Progress | None = None,
                 device: str | torch.device = "cpu") -> dict[str, Any]:
    """:func:`scaling_curves` on ``points`` log-spaced K in [k_min, k_max] (:func:`log_users`);
    the accountants of :data:`SLOW_ACCOUNTANTS` (``exact``) on ``min(points, exact_points)``
    of them (with the defaults 41 and 21: every other K, 5 per decade).

    Returns
    -------
    ``{"rows": [...], "meta": {...}, "curves": ...}``: one row per accountant, scheme
    (``fixed_p``, ``sqrt_p``) and K with ``users accountant scheme p epsilon_central``
    (``p`` the participation probability used at that K); ``meta`` holds the inputs
    (``p a sigma2 clip delta_l delta_prime dim n0 snr_db points exact_points``), the
    derived ``alignment_gain`` and ``channel_noise_var``, the fitted ``slopes``, the
    ``theory`` slopes, ``accountants``, ``users_of`` and ``figure`` (None; the command
    fills in the image it writes); ``curves`` is the dict of :func:`scaling_curves`
    (what the figure draws).
    """
    accountants = check_scaling_grid(k_min=k_min, k_max=k_max, points=points, exact_points=exact_points, p=p, a=a,
                                     sigma2=sigma2, clip=clip, delta_l=delta_l, accountants=accountants, dim=dim,
                                     n0=n0, snr_db=snr_db)
    default_threads()  # the CLI's thread policy (otafl/device.py)
    grid = log_users(k_min, k_max, points)
    slow = log_users(k_min, k_max, min(points, exact_points))
    users = {name: slow if name in SLOW_ACCOUNTANTS else grid for name in accountants}
    curves = scaling_curves(users=users, p=p, a=a, sigma2=sigma2, clip=clip, delta_l=delta_l,
                            delta_prime=delta_prime, accountants=accountants, dim=dim, n0=n0, snr_db=snr_db,
                            progress=progress, device=device)
    rows = [{"users": k, "accountant": n, "scheme": s, "p": p if s == "fixed_p" else a / math.sqrt(k),
             "epsilon_central": curves["curves"][n][s][i]}
            for n in accountants for s in SCHEMES for i, k in enumerate(curves["users_of"][n])]
    meta = {k: v for k, v in curves.items() if k not in ("curves", "users")}
    meta.update({"command": "scaling", "points": points, "exact_points": min(points, exact_points),
                 "theory": dict(THEORY_SLOPES), "figure": None, "accountants": accountants,
                 "non_finite": JSON_NON_FINITE})
    return {"rows": rows, "meta": meta, "curves": curves}
