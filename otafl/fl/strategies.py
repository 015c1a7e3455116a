"""The registries of aggregations and algorithms: the single source of the names that
``train.aggregation`` and ``train.algorithm`` accept.

Pure data: each entry names the class that implements it ("module:Class", imported on first
use by :meth:`Strategy.load`), so spec validation reads the names without importing the
training code. A new aggregation (an :class:`~otafl.fl.aggregations.Aggregation`) or a new
algorithm (an :class:`~otafl.fl.algorithms.Algorithm`) is one module plus one entry here;
the loop (:mod:`otafl.fl.loop`) only talks to the two interfaces.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["AGGREGATIONS", "ALGORITHMS", "MECHANISMS", "POWER_CONTROLS", "SCALED_MECHANISMS", "SUPERPOSITIONS",
           "Strategy", "UPDATE_SCALINGS"]


@dataclass(frozen=True)
class Strategy:
    """A registered aggregation or algorithm.

    name : the spec's value.   target : "module:Class" (or the class itself) implementing it.
    summary : one line for help texts.
    local : algorithms only, several local DP-SGD steps per round (model updates are sent).
    control_variates : algorithms only, SCAFFOLD's drift correction.
    needs : power controls only, the spec keys that must be set (not None) for this entry.
    """

    name: str
    target: str | type
    summary: str
    local: bool = False
    control_variates: bool = False
    needs: tuple[str, ...] = ()  # power controls only: the spec keys ("section.key") that must be set

    def load(self) -> type:
        """The implementing class (imported on first use)."""
        if not isinstance(self.target, str):
            return self.target
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


#: Aggregations by name (``train.aggregation``; docs/model.md#mac, #ideal, #digital).
AGGREGATIONS: dict[str, Strategy] = {
    "ota": Strategy("ota", "otafl.fl.aggregations:OverTheAir",
                    "the fading MAC: alignment, artificial and receiver noise (the paper)"),
    "ideal": Strategy("ideal", "otafl.fl.aggregations:Ideal",
                      "noiseless: every sampled clipped gradient received exactly"),
    "digital": Strategy("digital", "otafl.fl.aggregations:Digital",
                        "orthogonal access + secure aggregation with distributed noise"),
}

#: Algorithms by name (``train.algorithm``; docs/model.md#local-steps).
ALGORITHMS: dict[str, Strategy] = {
    "fedsgd": Strategy("fedsgd", "otafl.fl.algorithms:FedSGD",
                       "one clipped minibatch gradient per user and round (the paper)"),
    "fedavg": Strategy("fedavg", "otafl.fl.algorithms:LocalStepsAlgorithm",
                       "DP-FedAvg: S local DP-SGD steps, the model update is sent", local=True),
    "scaffold": Strategy("scaffold", "otafl.fl.algorithms:LocalStepsAlgorithm",
                         "DP-SCAFFOLD: local steps with control variates (option II)", local=True,
                         control_variates=True),
}

#: Power-control policies by name (``transmit.power_control``; docs/model.md#power-control): how far
#: below its alignment bound each round transmits (:class:`~otafl.fl.power.PowerControl`). Every one
#: depends on public facts only (the channel gains, the spec's schedule and target), never on the data.
POWER_CONTROLS: dict[str, Strategy] = {
    "full": Strategy("full", "otafl.fl.power:FullPower",
                     "full power: c_t is the alignment bound (the paper)"),
    "privacy-budget": Strategy("privacy-budget", "otafl.fl.power:PrivacyBudget",
                               "c_t lowered so that exact's central epsilon meets privacy.target_epsilon "
                               "(Liu & Simeone 2021)", needs=("privacy.target_epsilon",)),
    "cotaf": Strategy("cotaf", "otafl.fl.power:Cotaf",
                      "COTAF's precoder: a fixed gain from the public update-norm bound, users below "
                      "transmit.threshold silent (Sery et al. 2021)", needs=("transmit.threshold",)),
    "schedule": Strategy("schedule", "otafl.fl.power:Schedule",
                         "c_t = s_t times the alignment bound, s_t from transmit.power_schedule or a "
                         "geometric ramp power_start -> power_end"),
}

UPDATE_SCALINGS = {
    "bound": "the update is scaled by L / B with the public norm bound B (linear; record-level steps credits)",
    "clip": "the update is clipped to norm L (user-level DP-FedAvg, McMahan et al. 2018; no linear credits)",
}
"""How fedavg and scaffold fit a model update into the power budget (``transmit.update_scaling``;
docs/model.md#local-steps)."""

SUPERPOSITIONS = ("aggregate", "per-user")
"""How the MAC's superposition is simulated (``train.superposition``; docs/model.md#superposition)."""

MECHANISMS = {
    "gaussian": "continuous Gaussian shares (reference; no quantisation)",
    "skellam": "rotation, stochastic rounding, Skellam shares, modular sum",
    "ddg": "rotation, stochastic rounding, discrete Gaussian shares, modular sum",
    "pbm": "rotation, box, Poisson-binomial encoding, modular sum",
}
"""The digital aggregation's mechanisms by name (``digital.mechanism``; :mod:`otafl.fl.digital`)."""

SCALED_MECHANISMS = ("skellam", "ddg")
"""The mechanisms that scale and round to integers summed modulo 2^bits (``digital.scale``)."""
