"""Aggregations as strategies: how the participants' vectors reach the server.

An :class:`Aggregation` owns everything that differs between the ways of delivering a round
(registry: :data:`otafl.fl.strategies.AGGREGATIONS`): its setup, one round (the active users'
gradients in, an :class:`~otafl.fl.round.Aggregate` with the aligned sum and what it cost
out), the bounds-only round (the same channel facts without gradients), the
:class:`~otafl.privacy.facts.RoundFacts` the round reveals to the accountants, and the
run-level cost summary. The loop (:mod:`otafl.fl.loop`) never asks which one it has.

* :class:`OverTheAir` -- the paper's fading MAC (:func:`otafl.fl.round.ota_aggregate`).
* :class:`Ideal` -- noiseless orthogonal reception (:func:`otafl.fl.round.ideal_aggregate`).
* :class:`Digital` -- orthogonal access + secure aggregation (:mod:`otafl.fl.digital`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from otafl.fl.grads import UserGradients
from otafl.fl.round import Aggregate, channel_only, ideal_aggregate, ota_aggregate
from otafl.privacy.facts import RoundFacts
from otafl.transmit import ChannelSetup

if TYPE_CHECKING:
    from otafl.config import Spec

__all__ = ["Aggregation", "Digital", "Ideal", "OverTheAir", "build_aggregation"]


class Aggregation:
    """The strategy interface (and the parts the three share).

    credits_transmit_noise : the artificial and receiver noise reach the release (the
        ``steps`` accountant may credit them; docs/privacy/steps.md#steps).
    sums_linearly : the release is a function of the *sum* of the participants' transmit
        vectors (each clipped to L), so another participant's last-step noise, which enters its
        vector linearly, may be credited to the target (FedAvg's co-user credit,
        docs/privacy/steps.md#steps-last-step-credit). False where each user's vector is encoded
        non-linearly before the sum (stochastic rounding, binomial encoding).
    digital : the digital mechanism's setup (``None`` unless the aggregation is digital).
    """

    credits_transmit_noise = False
    sums_linearly = True
    digital = None

    def __init__(self, spec: Spec, *, dim: int, setup: ChannelSetup):
        self.spec, self.dim, self.setup = spec, int(dim), setup
        self.users = int(spec.data.users)
        self.superposition = spec.train.superposition

    def round(self, grads: UserGradients, h: Tensor, active: Tensor, generator: torch.Generator) -> Aggregate:
        """One round: the active users' gradients (clipped here) delivered to the server."""
        raise NotImplementedError

    def channel_only(self, h: Tensor, active: Tensor) -> Aggregate:
        """The same round's channel facts without gradients (bounds-only runs)."""
        raise NotImplementedError

    def facts(self, agg: Aggregate, participation: Tensor, *, sensitivity: float, step_facts: dict,
              warm: bool = False) -> RoundFacts:
        """What the round reveals to the accountants: participation probabilities [K] (after the
        alignment policy), the noise, gain and N0 this aggregation adds, and the algorithm's
        ``step_facts``. ``warm``: SCAFFOLD's warm-start transmission."""
        return RoundFacts(participation_prob=participation.to(torch.float64).cpu(),
                          noise_var=torch.zeros(self.users, dtype=torch.float64), alignment_gain=math.inf, n0=0.0,
                          sensitivity=sensitivity, dim=self.dim, participants=agg.participants, **step_facts)

    def summary(self, records: list[dict]) -> dict:
        """Means per round of the uplink's channel uses, energy and outages."""
        return {"channel_uses_per_round": _mean(records, "channel_uses"), "energy_per_round": _mean(records, "energy"),
                "outages_per_round": _mean(records, "outages")}


def _mean(records: list[dict], key: str) -> float:
    vals = [float(r[key]) for r in records if key in r and not math.isnan(float(r[key]))]
    return float(np.mean(vals)) if vals else math.nan


class OverTheAir(Aggregation):
    """The paper's scheme (docs/model.md#mac): alignment to c_t, artificial and receiver noise."""

    credits_transmit_noise = True

    def round(self, grads, h, active, generator):
        return ota_aggregate(grads, h, active, self.setup, generator, superposition=self.superposition)

    def channel_only(self, h, active):
        return channel_only(h, active, self.setup)

    def summary(self, records):
        policy = self.setup.power_control  # docs/model.md#power-control (None: full power)
        return {**super().summary(records), **(policy.summary() if policy is not None else {})}

    def facts(self, agg, participation, *, sensitivity, step_facts, warm=False):
        return RoundFacts(participation_prob=participation.to(torch.float64).cpu(),
                          noise_var=self.setup.noise_var.to(torch.float64).cpu(), alignment_gain=agg.alignment_gain,
                          n0=self.spec.channel.n0, sensitivity=sensitivity, dim=self.dim,
                          participants=agg.participants, **step_facts, **_csi_facts(agg))


def _csi_facts(agg: Aggregate) -> dict:
    """The gain mismatch of estimated CSI (the round's extremes of h_k / h_hat_k) as RoundFacts fields;
    none with perfect CSI (docs/privacy/csi.md#csi)."""
    if "csi_ratio_min" not in agg.extras:
        return {}
    return {"csi_ratio_min": agg.extras["csi_ratio_min"], "csi_ratio_max": agg.extras["csi_ratio_max"]}


class Ideal(Aggregation):
    """Noiseless orthogonal reception (docs/model.md#ideal): no receiver noise (gain +inf)."""

    def round(self, grads, h, active, generator):
        return ideal_aggregate(grads, h, active, self.setup, generator, superposition=self.superposition)

    def channel_only(self, h, active):
        """Everyone sampled arrives; nothing is formed or received."""
        return Aggregate(h.new_zeros(0), active.clone(), torch.ones_like(active), math.nan, 0.0, 0.0)


class Digital(Aggregation):
    """Orthogonal access + secure aggregation (docs/model.md#digital), participation revealed."""

    def __init__(self, spec, *, dim, setup):
        super().__init__(spec, dim=dim, setup=setup)
        from otafl.fl.digital import build_digital

        self.digital = build_digital(spec, dim=dim, power=setup.power, n0=spec.channel.n0)
        # only the continuous Gaussian reference sums the clipped vectors as they are; skellam and
        # ddg round each user's scaled vector stochastically, pbm encodes it in binomial counts
        self.sums_linearly = self.digital.mechanism == "gaussian"

    def round(self, grads, h, active, generator):
        from otafl.fl.digital import digital_aggregate

        return digital_aggregate(grads, h, active, self.setup, generator, superposition=self.superposition,
                                 digital=self.digital)

    def channel_only(self, h, active):
        """Who is in outage and what the uplink costs (no gradients)."""
        from otafl.fl.digital import digital_cost_only

        eligible, transmitting, cost = digital_cost_only(h, active, self.digital)
        extras = {"channel_uses": cost.channel_uses, "energy": cost.energy, "outages": cost.outages,
                  "bits": cost.bits, "overflow": 0, "clipped": 0}
        return Aggregate(h.new_zeros(0), transmitting, eligible, math.nan, math.nan, 1.0, extras=extras)

    def facts(self, agg, participation, *, sensitivity, step_facts, warm=False):
        if warm:  # the warm start's facts carry no mechanism (as before the strategies)
            return super().facts(agg, participation, sensitivity=sensitivity, step_facts=step_facts)
        return RoundFacts(participation_prob=participation.to(torch.float64).cpu(),
                          noise_var=torch.full((self.users,), self.digital.noise_var, dtype=torch.float64),
                          alignment_gain=math.inf, n0=0.0, sensitivity=sensitivity, dim=self.dim,
                          participants=agg.participants, **step_facts, digital=self.digital.facts())

    def summary(self, records):
        d = self.digital
        return {**super().summary(records), "bits_per_round": _mean(records, "bits"), "digital_mechanism": d.mechanism,
                "digital_bits": d.bits, "digital_coordinates": d.coordinates,
                "overflow_rounds": int(sum(1 for r in records if r.get("overflow", 0))),
                "clipped_coordinates": int(sum(r.get("clipped", 0) for r in records))}


def build_aggregation(spec: Spec, *, dim: int, setup: ChannelSetup) -> Aggregation:
    """The registered aggregation of ``spec.train.aggregation`` (:data:`~otafl.fl.strategies.AGGREGATIONS`)."""
    from otafl.fl.strategies import AGGREGATIONS

    return AGGREGATIONS[spec.train.aggregation].load()(spec, dim=dim, setup=setup)
