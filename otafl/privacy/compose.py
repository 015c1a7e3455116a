"""Composition of per-round (eps, delta) guarantees over T rounds.

Three compositions, all reported at the same total delta so their epsilons compare:

- ``basic``: (sum_t eps_t, sum_t delta_t).
- ``advanced``: heterogeneous advanced composition (Kairouz, Oh & Viswanath 2015, Thm 3.5).
- ``rdp``: each round as a Poisson-subsampled Gaussian mechanism (rate q_t, noise
  multiplier z_t = s_t / Delta), composed in Renyi DP by Opacus' RDP analysis
  (``opacus.accountants.analysis.rdp``; Mironov, Talwar & Zhang 2019), converted to
  (eps, delta) by Opacus' ``get_privacy_spent`` (Balle et al. 2020, Thm 21), plus the
  sum of the concentration events' probabilities delta'_t.

Adjacency for the RDP step
--------------------------
Opacus' RDP of the sampled Gaussian is for *add/remove* adjacency: it compares
N(0, z^2) with (1 - q) N(0, z^2) + q N(1, z^2) (sensitivity 1 after dividing by Delta).
Our neighbours differ in *one record of one user k* (replace-one); user k's clipped
minibatch gradient moves by at most Delta = 2L, and user k takes part with
probability q independently of the data. The round is therefore the pair

    P = (1 - q) W + q N(g, s^2 I),   Q = (1 - q) W + q N(g', s^2 I),   ||g - g'|| <= Delta,

where W is the output without user k. We map it to Opacus' add/remove sampled
Gaussian with the same rate q and noise multiplier z = s / Delta, i.e. the replace-one
change is charged as an add/remove of a contribution of norm Delta. Two assumptions:

1. (fixed noise; inherited from the paper's argument and shared with the per-round
   ``paper``/``tight`` bounds) the Gaussian noise s^2 that protects the change is
   taken as present whether or not user k participates, so W = N(mean, s^2 I). In the
   real system user k's own sigma_k^2 is only added when it participates; an
   adversary could in principle detect that from the residual's norm (more so in high
   dimension d and with little other noise). The ``exact`` accountant of the spec is
   the one that models this; ``paper``/``tight`` and this RDP total are bounds under
   assumption 1.
2. (replace-one vs add/remove) for the Poisson-subsampled Gaussian the replace-one
   pair above, worst case g = -g' with ||g|| = Delta/2, has Renyi divergence at most
   that of the add/remove pair with sensitivity Delta, at every order. At q = 1 the two
   are equal (alpha Delta^2 / (2 s^2)); for q < 1 we checked it by numerical
   integration over a grid of (q, s/Delta, alpha) (tests/test_privacy_compose.py) rather
   than proving it.

Conservative grid for speed: Opacus' RDP is a Python loop (~10 ms per distinct
(q, z)); with ``rdp_resolution = r > 0`` each q is rounded *up* and each z *down* to a
geometric grid of ratio 1 + r before the call. RDP grows with q and falls with z, so
this only loosens the bound (by about 2 r relatively in the RDP) and never breaks it.
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

from otafl.privacy.gaussian import as_float64

__all__ = [
    "COMPOSITIONS",
    "RDP_ORDERS",
    "compose_basic",
    "compose_advanced",
    "rdp_epsilon",
    "compose_best",
]

COMPOSITIONS = ("basic", "advanced", "rdp")
"""Composition names; :func:`compose_best` returns an index into this tuple (-1: none finite)."""

RDP_ORDERS: tuple[float, ...] = (*map(float, range(2, 65)), 80.0, 96.0, 128.0, 256.0)
"""Renyi orders handed to Opacus. Integer orders only: Opacus' fractional-order series is
~10x slower, and orders below 2 only help when the per-round leakage is so large that
basic composition wins anyway."""


def compose_basic(*, epsilon, delta) -> tuple[Tensor, Tensor]:
    """Basic composition: (sum_t eps_t, sum_t delta_t) (Dwork & Roth 2014, Thm 3.16).

    Parameters
    ----------
    epsilon, delta : [..., T], float -- per-round guarantees.

    Returns
    -------
    (eps, delta) : ([...], [...]) float64; delta is capped at 1.
    """
    epsilon, delta = as_float64(epsilon, delta)
    return epsilon.sum(-1), delta.sum(-1).clamp(max=1.0)


def compose_advanced(*, epsilon, delta, delta_slack) -> tuple[Tensor, Tensor]:
    """Heterogeneous advanced composition (Kairouz, Oh & Viswanath 2015, Thm 3.5).

    For delta~ in (0, 1], T mechanisms that are (eps_t, delta_t)-DP compose to
    (eps~, 1 - (1 - delta~) prod_t (1 - delta_t))-DP with

        eps~ = sum_t eps_t (e^eps_t - 1)/(e^eps_t + 1)
               + sqrt(2 sum_t eps_t^2 * min(ln(1/delta~), ln(e + sqrt(sum_t eps_t^2)/delta~))),

    the smaller of the theorem's two sqrt terms ((e^x - 1)/(e^x + 1) = tanh(x/2)).
    The theorem's third option, sum_t eps_t, is :func:`compose_basic`.

    Parameters
    ----------
    epsilon, delta : [..., T], float; delta_slack : [...], float in (0, 1] (delta~).

    Returns
    -------
    (eps, delta) : ([...], [...]) float64. eps = +inf where delta~ <= 0.
    """
    epsilon, delta, slack = as_float64(epsilon, delta, delta_slack)
    sum_sq = (epsilon * epsilon).sum(-1)
    drift = (epsilon * torch.tanh(epsilon / 2)).sum(-1)
    safe = slack.clamp(min=1e-300)
    log_term = torch.minimum(-torch.log(safe), torch.log(math.e + torch.sqrt(sum_sq) / safe))
    eps = drift + torch.sqrt(2.0 * sum_sq * log_term)
    eps = torch.where(slack > 0, eps, torch.full_like(eps, math.inf))
    total_delta = 1.0 - (1.0 - slack) * torch.prod(1.0 - delta, dim=-1)
    return eps, total_delta


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
    """Opacus' ``accountants/analysis/rdp.py`` module.

    ``import opacus.accountants.analysis.rdp`` runs ``opacus/__init__`` first, which
    imports the whole privacy engine (10+ s on a busy machine) although rdp.py only
    needs numpy and scipy. Unless opacus is already imported, load that one file of the
    installed package on its own (same code, private module name).
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


@functools.lru_cache(maxsize=1 << 16)
def _rdp_per_step(q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of one sampled-Gaussian step at every order (Opacus), memoised across calls."""
    if q == 0.0 or z == math.inf:
        out = np.zeros(len(orders))
    elif z == 0.0 or math.isnan(z):
        out = np.full(len(orders), np.inf)
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
    batch = torch.broadcast_shapes(q.shape[:-1], delta.shape)
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


def compose_best(*, epsilon, delta, delta_target=None, delta_slack: float = 1e-5,
                 sampling_rate=None, noise_multiplier=None, event_delta=None,
                 rdp_resolution: float = 1e-2) -> dict[str, Tensor]:
    """Smallest epsilon over basic, advanced and RDP composition at one total delta.

    The total delta of the run is ``delta_target``; by default it is the basic
    composition's sum_t delta_t plus ``delta_slack`` (delta_l in the accountants), so
    that advanced and RDP composition have a slack to spend. Each composition is
    stated at a total delta <= the target:

    - basic: (sum eps_t, sum delta_t), usable when sum delta_t <= target;
    - advanced: delta~ = 1 - (1 - target) / prod_t (1 - delta_t) (needs delta~ > 0);
    - rdp (when ``sampling_rate`` and ``noise_multiplier`` are given): converted at
      target - sum_t event_delta_t (the concentration events delta'_t), needs > 0.

    Parameters
    ----------
    epsilon, delta : [..., T], float -- per-round guarantees (for the basic/advanced rules).
    delta_target : [...], float or None.
    sampling_rate, noise_multiplier : [..., T], float or None -- the sampled-Gaussian view
        of each round for RDP (q_t and s_t / Delta).
    event_delta : [..., T], float or None -- delta'_t added outside RDP (0 if None).

    Returns
    -------
    dict of [...] tensors: ``epsilon``, ``delta`` (float64), ``composition`` (int64 index
    into :data:`COMPOSITIONS`, -1 where every composition gives +inf), and the three
    candidates ``epsilon_basic``, ``epsilon_advanced``, ``epsilon_rdp``.
    """
    epsilon, delta = as_float64(epsilon, delta)
    eps_b, delta_b = compose_basic(epsilon=epsilon, delta=delta)
    target = delta_b + delta_slack if delta_target is None else as_float64(delta_target, device=epsilon.device)[0]
    target = torch.broadcast_to(target, eps_b.shape).clamp(max=1.0)
    eps_b = torch.where(delta_b <= target, eps_b, torch.full_like(eps_b, math.inf))
    slack = 1.0 - (1.0 - target) / torch.prod(1.0 - delta, dim=-1).clamp(min=1e-300)
    eps_a, _ = compose_advanced(epsilon=epsilon, delta=delta, delta_slack=slack)
    eps_a = torch.where(torch.isfinite(epsilon).all(-1), eps_a, torch.full_like(eps_a, math.inf))
    if sampling_rate is not None and noise_multiplier is not None:
        extra = torch.zeros_like(epsilon) if event_delta is None else as_float64(event_delta, device=epsilon.device)[0]
        rdp_delta = target - torch.broadcast_to(extra, epsilon.shape).sum(-1)
        eps_r, _ = rdp_epsilon(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                               delta=rdp_delta, rdp_resolution=rdp_resolution)
    else:
        eps_r = torch.full_like(eps_b, math.inf)
    candidates = torch.stack([eps_b, eps_a, eps_r], dim=-1)
    best, which = candidates.min(dim=-1)  # ties go to the first: basic, then advanced
    which = torch.where(torch.isfinite(best), which, torch.full_like(which, -1))
    total_delta = torch.where(which == 0, delta_b, target)
    return {"epsilon": best, "delta": total_delta, "composition": which,
            "epsilon_basic": eps_b, "epsilon_advanced": eps_a, "epsilon_rdp": eps_r}
