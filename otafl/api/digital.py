"""Digital baselines without training: a mechanism's privacy for given noise, the noise that
meets a target epsilon (a small bisection: this is the library search ``experiments/ota-vs-digital.toml``
documents), and the fewest bits per coordinate each mechanism needs (docs/model.md#digital).

Every function builds the mechanism exactly as a run would (:func:`otafl.fl.digital.build_digital`
from a spec with the given ``[digital]`` keys), with uniform participation p and no outage.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from otafl.config import load_spec
from otafl.errors import OtaflInputError, check_range

__all__ = ["digital_mechanism", "digital_privacy", "calibrate_sigma2", "minimal_bits", "communication_curves",
           "ROUNDING_OVERHEAD", "DISCRETE_MECHANISMS"]

DISCRETE_MECHANISMS = ("skellam", "ddg", "pbm")
"""The mechanisms with a finite field (bits matter), in the order of the comparison's curves."""

ROUNDING_OVERHEAD = 0.05
"""Skellam's (and DDG's) quantisation budget in :func:`minimal_bits`: the rounded vectors' norm bound may exceed
the clipped norm by 5 %, and the rounding variance may be 5 % of the noise variance."""


def _spec(mechanism: str, *, sigma2: float, users: int, bits: int, clip: float, overrides: Sequence[str]):
    return load_spec(None, [f"digital.mechanism='{mechanism}'", f"digital.sigma2={sigma2!r}", f"data.users={users}",
                            f"digital.bits={bits}", f"transmit.clip={clip!r}", *overrides])


def digital_mechanism(mechanism: str, *, sigma2: float, users: int, dim: int, bits: int = 16, clip: float = 1.0,
                      overrides: Sequence[str] = ()):
    """The :class:`~otafl.privacy.facts.DigitalMechanism` a run of these settings uses."""
    from otafl.fl.digital import build_digital

    spec = _spec(mechanism, sigma2=sigma2, users=users, bits=bits, clip=clip, overrides=overrides)
    return build_digital(spec, dim=dim, power=torch.ones(users, dtype=torch.float64), n0=1.0).facts()


def digital_privacy(mechanism: str, *, sigma2: float, users: int, dim: int, p: float = 1.0, rounds: int = 1,
                    bits: int = 16, clip: float = 1.0, delta_l: float = 1e-5, delta_total: float | None = None,
                    overrides: Sequence[str] = ()) -> dict:
    """Per-round and composed central and local epsilon of ``rounds`` identical rounds.

    Returns ``{"epsilon_central", "epsilon_central_total", "epsilon_local", "epsilon_local_total",
    "delta_total", "mechanism"}`` (the DigitalMechanism).
    """
    from otafl.privacy.accountants.digital_run import account_digital_run
    from otafl.privacy.facts import RoundFacts

    check_range("p", p, 0.0, 1.0, lo_open=True)
    mech = digital_mechanism(mechanism, sigma2=sigma2, users=users, dim=dim, bits=bits, clip=clip, overrides=overrides)
    f = RoundFacts(participation_prob=torch.full((users,), float(p), dtype=torch.float64),
                   noise_var=torch.full((users,), float(sigma2), dtype=torch.float64), alignment_gain=math.inf,
                   n0=0.0, sensitivity=2.0 * clip, dim=dim, participants=round(p * users), digital=mech)
    res = account_digital_run([f] * int(rounds), delta_l=delta_l, delta_total=delta_total)
    return {"epsilon_central": res.epsilon_central, "epsilon_central_total": res.epsilon_central_total,
            "epsilon_local": res.epsilon_local_max, "epsilon_local_total": res.epsilon_local_total,
            "delta_total": res.delta_central_total, "mechanism": mech}


def calibrate_sigma2(mechanism: str, *, target: float, key: str = "epsilon_central_total", lo: float = 1e-4,
                     hi: float = 1e4, steps: int = 30, **kw) -> float:
    """The smallest per-user noise variance sigma^2 (to ~1 %) whose ``key`` epsilon is <= target.

    Bisection on log sigma^2 (epsilon falls as sigma^2 grows); keyword arguments go to
    :func:`digital_privacy`. Raises if even ``hi`` misses the target.
    """
    def eps(s2):
        return digital_privacy(mechanism, sigma2=s2, **kw)[key]

    if eps(hi) > target:
        raise OtaflInputError(f"target = {target!r} is outside the reach of {mechanism} (sigma2 <= {hi:g})")
    if eps(lo) <= target:
        return lo
    a, b = math.log(lo), math.log(hi)
    for _ in range(steps):
        mid = 0.5 * (a + b)
        if eps(math.exp(mid)) <= target:
            b = mid
        else:
            a = mid
        if b - a < 0.01:
            break
    return math.exp(b)


def minimal_bits(mechanism: str, *, sigma2: float, users: int, dim: int, clip: float = 1.0,
                 max_bits: int = 48, overrides: Sequence[str] = ()) -> int:
    """The fewest bits per coordinate for ``mechanism`` at noise ``sigma2``.

    pbm: the fewest bits whose m = floor((2^bits - 1) / K) reaches the noise sigma^2 with
    theta <= 1/4 (m >= 4 c^2 / sigma^2): fewer bits leave theta = 1/4 and more noise.
    skellam, ddg: the fewest bits whose automatic scale keeps the rounded norm within 5 % of the
    clipped norm and the rounding variance within 5 % of sigma^2 (:data:`ROUNDING_OVERHEAD`),
    with the sum inside the field (overflow margin of ``OVERFLOW_SIGMAS``).
    gaussian: continuous (no field); returns 0.
    """
    from otafl.privacy.analysis.skellam import rounded_norm_bound

    if mechanism == "gaussian":
        return 0
    for bits in range(max(2, users.bit_length()), max_bits + 1):
        try:
            mech = digital_mechanism(mechanism, sigma2=sigma2, users=users, dim=dim, bits=bits, clip=clip,
                                     overrides=overrides)
        except OtaflInputError:
            continue
        if mechanism == "pbm":
            if mech.trials * sigma2 >= 4 * mech.box ** 2 - 1e-12:
                return bits
        else:
            sl = mech.scale * clip
            norm_ok = rounded_norm_bound(norm=sl, dim=mech.coordinates, beta=1e-100) <= (1 + ROUNDING_OVERHEAD) * sl
            var_ok = 1.0 / (4 * mech.scale ** 2) <= ROUNDING_OVERHEAD * sigma2
            if norm_ok and var_ok:
                return bits
    raise OtaflInputError(f"no bits <= {max_bits} meet the rounding budget of {mechanism} at sigma2 = {sigma2!r}")


def communication_curves(*, users: int, dim: int, p: float, rounds: int, delta_l: float = 1e-5,
                         delta_total: float | None = None, clip: float = 1.0,
                         sigma2: Sequence[float] = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)) -> dict:
    """Bits per coordinate each discrete mechanism needs as its noise (hence epsilon) changes.

    For every sigma^2 of the grid and mechanism (:data:`DISCRETE_MECHANISMS`: skellam, ddg, pbm):
    :func:`minimal_bits` and the
    composed central epsilon of ``rounds`` rounds at those bits (:func:`digital_privacy`).
    Returns ``{"rows": [{mechanism, sigma2, bits, epsilon_central_total, delta_total}], "meta": {...}}``
    (``delta_total``: the delta of that epsilon).
    """
    rows = []
    for mech in DISCRETE_MECHANISMS:
        for s2 in sigma2:
            bits = minimal_bits(mech, sigma2=s2, users=users, dim=dim, clip=clip)
            res = digital_privacy(mech, sigma2=s2, users=users, dim=dim, p=p, rounds=rounds, bits=bits, clip=clip,
                                  delta_l=delta_l, delta_total=delta_total)
            rows.append({"mechanism": mech, "sigma2": float(s2), "bits": int(bits),
                         "epsilon_central_total": res["epsilon_central_total"], "delta_total": res["delta_total"]})
    return {"rows": rows, "meta": {"users": users, "dim": dim, "p": p, "rounds": rounds, "delta_l": delta_l,
                                   "delta_total": delta_total, "clip": clip}}
