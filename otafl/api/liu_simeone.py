"""Liu & Simeone's closed-form epsilon beside ``exact``'s, on the same rounds of a spec's channel
(docs/guides/power-control.md#liu-simeone; ``python experiments/liu_simeone.py``).

For each power-control policy asked for (full power, and ``privacy-budget`` at each target epsilon) the
run's rounds are built as a run builds them (:func:`otafl.setup.build_channel`: the policy's c_t,
the eligible users, p_t), without training, and accounted twice at ``privacy.delta_total``: by ``exact``
(:func:`otafl.privacy.accountants.run.exact_total`) and by the closed form
(:func:`otafl.privacy.analysis.liu_simeone.closed_form_epsilon`) with x_t = N0 / c_t^2 + min_k sigma_k^2.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import torch

from otafl.config import Spec
from otafl.errors import OtaflInputError
from otafl.privacy.accountants.run import exact_total
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon
from otafl.privacy.analysis.liu_simeone import closed_form_budget, closed_form_epsilon
from otafl.privacy.facts import RoundFacts
from otafl.setup import build_channel

__all__ = ["LIU_SIMEONE_DIM", "closed_form_rows"]

LIU_SIMEONE_DIM = 10
"""d of their synthetic setting (so that P = 10^(SNR/10) d N0 = 1e4 at the preset's 30 dB)."""


def _rounds(spec: Spec, dim: int) -> tuple[list[RoundFacts], list[float], Any]:
    plan = build_channel(spec, dim=dim)
    setup, facts, gains = plan.setup, [], []
    if setup.csi is not None:  # the rows below align to h and carry no gain mismatch
        raise OtaflInputError(f"channel.csi = {spec.channel.csi!r} is outside the allowed range {{'perfect'}} for "
                              "Liu & Simeone's closed form (it reads perfect-CSI rounds)")
    for t in range(spec.train.rounds):
        c, eligible = setup.gain(plan.h[t])
        gains.append(float(c))
        facts.append(RoundFacts(participation_prob=(plan.p[t] * eligible.to(plan.p.dtype)).cpu(),
                                noise_var=setup.noise_var.cpu(), alignment_gain=float(c), n0=setup.n0,
                                sensitivity=2.0 * setup.clip, dim=dim, participants=0))
    return facts, gains, setup


def closed_form_rows(spec: Spec, *, targets: Sequence[float] = (), dim: int = LIU_SIMEONE_DIM) -> list[dict]:
    """One row per policy: full power, then ``privacy-budget`` at each of ``targets``.

    Each row: ``policy``, ``target`` (None at full power), ``gain`` (the rounds' mean c_t),
    ``noise_var`` (mean x_t = N0 / c_t^2 + min sigma^2), ``exact`` (exact's central total), ``closed_form``
    (the closed form on the same rounds), ``gaussian`` (the analytic Gaussian mechanism's epsilon of the
    composed rounds, mu^2 = sum_t Delta^2 / x_t: the mechanism's own epsilon where every user takes part
    and nobody adds noise, Liu & Simeone's setting), ``ratio`` (closed_form / exact), ``counts_others`` (False: x_t
    leaves the other users' noise out, so the closed form is a bound), and, for a target, ``noise_ratio``:
    the flat channel-noise variance the closed form's rule needs for that target over the one exact needs
    (how much more power exact allows).
    """
    pv, T = spec.privacy, spec.train.rounds
    rows = []
    for target in (None, *targets):
        s = spec if target is None else dataclasses.replace(
            spec, transmit=dataclasses.replace(spec.transmit, power_control="privacy-budget"),
            privacy=dataclasses.replace(pv, target_epsilon=float(target)))
        facts, gains, setup = _rounds(s, dim)
        own = float(torch.as_tensor(setup.noise_var).min())
        x = [(setup.n0 / (c * c) if c > 0 else math.inf) + own if setup.n0 > 0 else own for c in gains]
        delta_sens = 2.0 * setup.clip
        exact = float(exact_total(facts, "central", delta_l=pv.delta_l, delta_target=pv.delta_total)["epsilon"])
        closed = closed_form_epsilon(x, delta_sens, pv.delta_total)
        mu = math.sqrt(sum(delta_sens ** 2 / v for v in x))  # the rounds' Gaussians composed: one of mu
        gaussian = float(analytic_gaussian_epsilon(sensitivity=mu, noise_std=1.0, delta=pv.delta_total))
        row = {"policy": s.transmit.power_control, "target": target, "gain": sum(gains) / T,
               "noise_var": sum(x) / T, "exact": exact, "closed_form": closed, "gaussian": gaussian,
               "ratio": closed / exact if exact > 0 else math.inf, "counts_others": False}
        if target is not None:
            needed = T * delta_sens ** 2 / (2.0 * closed_form_budget(float(target), pv.delta_total))
            row["noise_ratio"] = needed / (sum(x) / T)
        rows.append(row)
    return rows
