"""How the central leakage scales with the number of users K (the paper's O(1/K^{3/4})).

With uniform p = a K^{-1/2} (a above sqrt(ln(2/delta')/2)) the ``paper`` bound falls as
K^{-3/4}; with a fixed p as K^{-1/2} (docs/privacy.md#scaling). Sketch:
m_t = K(p - beta) grows as K (fixed p) or as sqrt(K) (p = a/sqrt(K)), the central noise
std as its square root, so eps_0 ~ K^{-1/2} or K^{-1/4}; amplification multiplies by
q ~ p, constant or K^{-1/2}.

:func:`scaling_curves` evaluates both on given K values and fits log-log slopes;
:func:`scaling_grid` does so on a log grid of K and adds one row per (K, accountant,
scheme). The figure is drawn by :func:`otafl.report.scaling.plot_scaling`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from otafl.api.defaults import JSON_NON_FINITE, check_accountants
from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants import get_accountant

__all__ = ["SCHEMES", "THEORY_SLOPES", "fit_loglog_slope", "log_users", "scaling_curves", "scaling_grid"]

SCHEMES = ("fixed_p", "sqrt_p")
"""fixed_p: p constant; sqrt_p: p = a K^{-1/2}."""

THEORY_SLOPES = {"fixed_p": -0.5, "sqrt_p": -0.75}
"""The asymptotic exponents: fixed p -> K^{-1/2}, p = a K^{-1/2} -> K^{-3/4}."""


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


def log_users(k_min: float, k_max: float, points: int) -> list[int]:
    """``points`` log-spaced K values from ``k_min`` to ``k_max``, rounded, repeats dropped."""
    check_range("k_min", k_min, lo=1)
    check_range("k_max", k_max, lo=k_min, lo_open=True)
    check_range("points", points, lo=2)
    return [int(k) for k in np.unique(np.round(np.logspace(math.log10(k_min), math.log10(k_max), points)))]


def scaling_curves(*, users: Sequence[float], p: float = 0.5, a: float = 5.0, sigma2: float = 10.0,
                   clip: float = 1.0, delta_l: float = 1e-5, delta_prime: float | str = "auto",
                   accountants: Sequence[str] = ("paper",), device: str | torch.device = "cpu") -> dict:
    """Central epsilon vs K for a fixed p and for p = a / sqrt(K), with fitted slopes.

    The channel noise is left out (N0 = 0) and the alignment gain is 1, as in the paper's
    central bound.

    Parameters
    ----------
    users : the K values (integers >= 1; a log grid such as 10^2 ... 10^6).
    p : the fixed participation probability, in (0, 1].
    a : the coefficient of p = a K^{-1/2}; a / sqrt(min K) must be <= 1.
    sigma2 : artificial-noise variance per coordinate (> 0, gradient units).
    clip : clipping norm L > 0 (sensitivity 2L).
    delta_l, delta_prime : as in the accountants.
    accountants : registry names, at least one.

    Returns
    -------
    dict with ``users`` (list of int) and per accountant A: ``curves[A]["fixed_p"]`` and
    ``curves[A]["sqrt_p"]`` (lists of epsilon over ``users``, +inf where undefined) and
    ``slopes[A]["fixed_p"|"sqrt_p"]`` = {"slope", "intercept", "points"} (log-log fit over
    the finite points); plus the inputs ``p a sigma2 clip delta_l delta_prime``.
    """
    accountants = check_accountants(accountants)
    check_range("p", p, lo=0.0, hi=1.0, lo_open=True)
    check_range("a", a, lo=0.0, lo_open=True)
    check_range("sigma2", sigma2, lo=0.0, lo_open=True)
    check_range("clip", clip, lo=0.0, lo_open=True)
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    K = torch.as_tensor(np.round(np.asarray(users, dtype=float)), dtype=torch.float64, device=torch.device(device))
    if K.numel() < 2:
        raise OtaflInputError(f"users has {K.numel()} value(s); the slope needs at least 2")
    if a / math.sqrt(float(K.min())) > 1:
        raise OtaflInputError(f"a = {a!r} gives p = a/sqrt(K) > 1 at K = {int(K.min())}; "
                              f"allowed range: a <= sqrt(min K) = {math.sqrt(float(K.min())):.4g}")
    out = {"users": [int(k) for k in K.tolist()], "p": p, "a": a, "sigma2": sigma2, "clip": clip,
           "delta_l": delta_l, "delta_prime": delta_prime, "curves": {}, "slopes": {}}
    for name in accountants:
        acc = get_accountant(name)
        kw = dict(users=K, noise_var=sigma2, sensitivity=2 * clip, alignment_gain=1.0, n0=0.0, delta_l=delta_l,
                  delta_prime=delta_prime)
        curves = {"fixed_p": acc.bound(participation_prob=torch.full_like(K, p), **kw).epsilon_central,
                  "sqrt_p": acc.bound(participation_prob=a / torch.sqrt(K), **kw).epsilon_central}
        out["curves"][name] = {k: v.tolist() for k, v in curves.items()}
        out["slopes"][name] = {}
        for scheme, eps in out["curves"][name].items():
            slope, intercept, used = fit_loglog_slope(out["users"], eps)
            out["slopes"][name][scheme] = {"slope": slope, "intercept": intercept, "points": used}
    return out


def scaling_grid(*, k_min: float = 1e2, k_max: float = 1e6, points: int = 41, p: float = 0.5, a: float = 5.0,
                 sigma2: float = 10.0, clip: float = 1.0, delta_l: float = 1e-5, delta_prime: float | str = "auto",
                 accountants: Sequence[str] = ("paper",), device: str | torch.device = "cpu") -> dict[str, Any]:
    """:func:`scaling_curves` on ``points`` log-spaced K in [k_min, k_max] (:func:`log_users`).

    Returns
    -------
    ``{"rows": [...], "meta": {...}, "curves": ...}``: one row per accountant, scheme
    (``fixed_p``, ``sqrt_p``) and K with ``users accountant scheme p epsilon_central``
    (``p`` the participation probability used at that K); ``meta`` holds the inputs
    (``p a sigma2 clip delta_l delta_prime``), the fitted ``slopes``, the ``theory`` slopes,
    ``accountants`` and ``figure`` (None; the command fills in the image it writes);
    ``curves`` is the dict of :func:`scaling_curves` (what the figure draws).
    """
    accountants = check_accountants(accountants)
    curves = scaling_curves(users=log_users(k_min, k_max, points), p=p, a=a, sigma2=sigma2, clip=clip,
                            delta_l=delta_l, delta_prime=delta_prime, accountants=accountants, device=device)
    rows = [{"users": k, "accountant": n, "scheme": s, "p": p if s == "fixed_p" else a / math.sqrt(k),
             "epsilon_central": curves["curves"][n][s][i]}
            for n in accountants for s in SCHEMES for i, k in enumerate(curves["users"])]
    meta = {k: v for k, v in curves.items() if k not in ("curves", "users")}
    meta.update({"command": "scaling", "theory": dict(THEORY_SLOPES), "figure": None, "accountants": accountants,
                 "non_finite": JSON_NON_FINITE})
    return {"rows": rows, "meta": meta, "curves": curves}
