"""Renyi-DP composition of Poisson-subsampled Gaussian rounds, through Opacus' RDP analysis.

Each round is a sampled Gaussian mechanism (rate q_t, noise multiplier z_t = s_t / Delta),
composed in RDP by ``opacus.accountants.analysis.rdp`` (Mironov, Talwar & Zhang 2019) and
converted to (eps, delta) by its ``get_privacy_spent`` (Balle et al. 2020, Thm 21).

Adjacency: Opacus' sampled Gaussian is for add/remove adjacency, N(0, z^2) vs
(1 - q) N(0, z^2) + q N(1, z^2). Our neighbours differ in one record of one user k
(replace-one): user k's clipped gradient moves by at most Delta = 2L and k takes part
with probability q, i.e. P = (1 - q) W + q N(g, s^2 I), Q = (1 - q) W + q N(g', s^2 I),
||g - g'|| <= Delta, charged as an add/remove of norm Delta. Two assumptions: (1) the
noise s^2 is present whether or not user k takes part (W = N(mean, s^2 I); inherited
from the paper and shared with ``paper``/``tight``; the ``exact`` accountant does not
assume it); (2) the replace-one pair's Renyi divergence is at most the add/remove
pair's at every order: equal at q = 1, checked numerically for q < 1
(tests/test_privacy_compose.py), not proven. See docs/privacy/composition.md#composition.

Conservative grid: with ``rdp_resolution = r > 0`` each q is rounded up and each z
down to a geometric grid of ratio 1 + r before calling Opacus (one Python evaluation per
distinct (q, z), memoised). RDP grows with q and falls with z, so this only loosens the
bound (by about 2 r relatively) and never breaks it. Opacus is imported on first use.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from otafl.privacy.analysis.gaussian import as_float64, broadcast_shapes

__all__ = ["RDP_ORDERS", "rdp_epsilon"]

RDP_ORDERS: tuple[float, ...] = (*map(float, range(2, 65)), 80.0, 96.0, 128.0, 256.0)
"""Renyi orders handed to Opacus. Integer orders only: Opacus' fractional-order series is
much slower, and orders below 2 only help when the per-round leakage is so large that
basic composition wins anyway."""


def _grid_down(x: float, resolution: float) -> float:
    if resolution <= 0 or x <= 0 or not math.isfinite(x):
        return x
    step = math.log1p(resolution)
    return math.exp(math.floor(math.log(x) / step) * step)


def _grid_up(x: float, resolution: float) -> float:
    if resolution <= 0 or x <= 0:
        return x
    step = math.log1p(resolution)
    return min(1.0, math.exp(math.ceil(math.log(x) / step) * step))


@functools.lru_cache(maxsize=1)
def _opacus_rdp():
    """Opacus' ``opacus.accountants.analysis.rdp`` module.

    ``import opacus.accountants.analysis.rdp`` runs ``opacus/__init__`` first, which
    imports the whole privacy engine although that module only needs numpy and scipy.
    Unless opacus is already imported, load that one file of the installed package on
    its own (same code, private module name).
    """
    name = "opacus.accountants.analysis.rdp"
    if name in sys.modules:
        return sys.modules[name]
    try:
        package = importlib.util.find_spec("opacus")
        path = Path(package.submodule_search_locations[0]) / "accountants" / "analysis" / "rdp.py"
        spec = importlib.util.spec_from_file_location("_otafl_opacus_rdp", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception:  # unusual install layout: fall back to the regular import
        return importlib.import_module(name)


def sgm_rdp_integer_orders(q: float, z: float, orders) -> np.ndarray:
    """RDP of one sampled-Gaussian step at integer orders >= 2: Opacus' ``_compute_rdp``
    (log A_alpha = log sum_i C(alpha, i) q^i (1 - q)^(alpha - i) exp((i^2 - i) / (2 z^2)),
    Mironov, Talwar & Zhang 2019, Sec. 3.3, divided by alpha - 1; alpha / (2 z^2) at q = 1)
    with the sums of all orders as one array, instead of Opacus' Python loop over i (the
    same terms; the log-sum differs from its pairwise one by rounding only)."""
    a = np.asarray(orders, dtype=np.float64)
    if q >= 1.0:
        return a / (2.0 * z * z)
    log_binom, i = _log_binomials(tuple(orders))
    A = a[:, None]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        terms = log_binom + i * math.log(q) + (A - i) * math.log1p(-q) + (i * i - i) / (2.0 * z * z)
        top = terms.max(axis=1, keepdims=True)
        out = (np.log(np.exp(terms - top).sum(axis=1)) + top[:, 0]) / (a - 1.0)
    return np.where(np.isposinf(top[:, 0]) | np.isnan(out), np.inf, out)  # no noise to speak of: +inf


@functools.lru_cache(maxsize=8)
def _log_binomials(orders: tuple) -> tuple[np.ndarray, np.ndarray]:
    """log C(alpha, i) for every order (rows) and i = 0..max order (-inf beyond alpha), and i."""
    from scipy import special

    a = np.asarray(orders, dtype=np.float64)[:, None]
    i = np.arange(int(a.max()) + 1, dtype=np.float64)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(i <= a, np.log(special.binom(a, i)), -np.inf)
    out.setflags(write=False)
    return out, i


@functools.lru_cache(maxsize=1 << 16)
def _rdp_per_step(q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of one sampled-Gaussian step at every order (Opacus), memoised across calls."""
    if q == 0.0 or z == math.inf:
        out = np.zeros(len(orders))
    elif z == 0.0 or math.isnan(z):
        out = np.full(len(orders), np.inf)
    elif all(float(a).is_integer() and a >= 2 for a in orders):
        out = sgm_rdp_integer_orders(q, z, orders)
    else:
        out = np.asarray(_opacus_rdp().compute_rdp(q=q, noise_multiplier=z, steps=1, orders=list(orders)), dtype=np.float64)
    out.setflags(write=False)
    return out


def rdp_epsilon(*, sampling_rate, noise_multiplier, delta, orders: tuple[float, ...] = RDP_ORDERS,
                rdp_resolution: float = 1e-2) -> tuple[Tensor, Tensor]:
    """Compose T Poisson-subsampled Gaussian rounds in RDP with Opacus; convert at ``delta``.

        RDP_alpha(total) = sum_t RDP_alpha(q_t, z_t)          (Mironov 2017, Prop. 1)
        eps = min_alpha  RDP_alpha - (ln delta + ln alpha)/(alpha - 1) + ln((alpha - 1)/alpha)

    (``opacus.accountants.analysis.rdp.compute_rdp`` and ``get_privacy_spent``).
    Not batched inside Opacus: one call per distinct (q, z) (see the module notes on
    ``rdp_resolution``), then a sum per row.

    Parameters
    ----------
    sampling_rate : [..., T], float -- q_t in [0, 1].
    noise_multiplier : [..., T], float -- z_t = s_t / Delta >= 0 (0: no noise -> +inf).
    delta : [...], float -- target delta of the RDP conversion; eps = +inf where <= 0.
    orders : Renyi orders.  rdp_resolution : relative grid step (0: exact inputs).

    Returns
    -------
    (eps, order) : ([...], [...]) float64 -- epsilon (>= 0) and the optimal order (nan
    where eps is +inf).
    """
    q, z, delta = as_float64(sampling_rate, noise_multiplier, delta)
    q, z = torch.broadcast_tensors(q, z)
    batch = broadcast_shapes(q.shape[:-1], delta.shape)
    device = q.device
    T = q.shape[-1]
    q_rows = q.expand(*batch, T).reshape(-1, T).cpu().tolist()
    z_rows = z.expand(*batch, T).reshape(-1, T).cpu().tolist()
    d_rows = delta.expand(batch).reshape(-1).cpu().tolist()
    eps_out, order_out = [], []
    for q_row, z_row, d in zip(q_rows, z_rows, d_rows):
        rdp = np.zeros(len(orders))
        counts: dict[tuple[float, float], int] = {}
        for qt, zt in zip(q_row, z_row):
            key = (_grid_up(qt, rdp_resolution), _grid_down(zt, rdp_resolution))
            counts[key] = counts.get(key, 0) + 1
        for (qt, zt), n in counts.items():
            rdp = rdp + n * _rdp_per_step(qt, zt, tuple(orders))
        if not d > 0 or not np.isfinite(rdp).any():
            eps_out.append(math.inf)
            order_out.append(math.nan)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "optimal order is the largest alpha": still a valid bound
            eps, order = _opacus_rdp().get_privacy_spent(orders=list(orders), rdp=rdp, delta=min(d, 1.0))
        eps = float(eps)
        eps_out.append(max(eps, 0.0) if math.isfinite(eps) else math.inf)
        order_out.append(float(order) if math.isfinite(eps) else math.nan)
    shape = tuple(batch)
    return (torch.tensor(eps_out, dtype=torch.float64, device=device).reshape(shape),
            torch.tensor(order_out, dtype=torch.float64, device=device).reshape(shape))
