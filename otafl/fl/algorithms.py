"""Algorithms as strategies: what a participant transmits and how the server applies the estimate.

An :class:`Algorithm` (registry: :data:`otafl.fl.strategies.ALGORITHMS`) owns how each
round's transmit vectors are made from the model and the users' data, how the server steps
from the aggregation's estimate, its warm start (SCAFFOLD's), the facts the ``steps``
accountant reads, and its run-summary fields. The loop (:mod:`otafl.fl.loop`) never asks
which one it has.

* :class:`FedSGD` -- one clipped minibatch gradient per participant, a server optimizer step
  (the paper; ghost norms and one backward for MLPs, :mod:`otafl.fl.grads`).
* :class:`LocalStepsAlgorithm` -- DP-FedAvg and DP-SCAFFOLD: S local DP-SGD steps per
  participant, the normalised model update is sent (:class:`otafl.fl.local.LocalSteps`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from otafl.data import RowBuffer, sample_minibatches
from otafl.fl.grads import StackedGradients, UserGradients, supports_ghost, user_gradients
from otafl.fl.local import build_local_steps
from otafl.fl.optim import bind_flat_grad, make_optimizer
from otafl.fl.round import Aggregate
from otafl.fl.sketch import InputSketch

if TYPE_CHECKING:
    from otafl.config import Spec
    from otafl.fl.aggregations import Aggregation
    from otafl.setup import RunSetup

__all__ = ["Algorithm", "FedSGD", "LocalStepsAlgorithm", "build_algorithm"]

Transmit = tuple[UserGradients, float, float]  # (the active users' vectors, mean train loss, clipped fraction)


class Algorithm:
    """The strategy interface: built once per run from the spec, the run setup and the training data."""

    def __init__(self, spec: Spec, run: RunSetup, x_train: Tensor, y_train: Tensor):
        self.spec, self.run = spec, run
        self.x_train, self.y_train = x_train, y_train
        self.dim = run.dim

    def warm_start(self, aggregation: Aggregation, h: Tensor, estimate: Callable, generator: torch.Generator, *,
                   train: bool) -> Aggregate | None:
        """A transmission before the first round (its Aggregate), or ``None`` (the default)."""
        return None

    def transmit(self, active: Tensor, *, train: bool) -> Transmit:
        """The active users' transmit vectors of one round (nothing is computed when not ``train``)."""
        raise NotImplementedError

    def apply(self, estimate: Tensor, *, participants: int, mu: float, unknown: bool) -> None:
        """The server's step from the aggregation's estimate of the mean transmit vector."""
        raise NotImplementedError

    def step_facts(self, aggregation: Aggregation, *, warm: bool = False) -> dict:
        """The local-steps fields of :class:`~otafl.privacy.facts.RoundFacts` for rounds delivered
        by ``aggregation`` (none: FedSGD's defaults)."""
        return {}

    def summary(self, warm: Aggregate | None) -> dict:
        """Run-summary fields of the algorithm."""
        return {}

    def _nothing(self) -> Transmit:
        return StackedGradients(self.x_train.new_zeros(0, self.dim)), math.nan, math.nan


class FedSGD(Algorithm):
    """One clipped minibatch gradient per participant (docs/model.md#round); the server
    optimizer (``train.optimizer``, ``train.lr``) steps on the estimate."""

    def __init__(self, spec, run, x_train, y_train):
        super().__init__(spec, run, x_train, y_train)
        tr = spec.train
        params = list(run.model.parameters())
        self.opt = make_optimizer(tr.optimizer, params, tr.lr)
        self.flat_grad = bind_flat_grad(params)
        self.batch_size, self.weight_decay, self.clip = spec.data.batch_size, tr.weight_decay, spec.transmit.clip
        self.input_sketch: InputSketch | None = None
        self.rounds = 0
        # the minibatch (and its sketched features), copied into the same memory every round
        self.x_rows, self.y_rows, self.sketch_rows = RowBuffer(), RowBuffer(), RowBuffer()

    def transmit(self, active, *, train):
        run, dev = self.run, self.x_train.device
        idx, weight = sample_minibatches(run.split, self.batch_size, run.generators["data"])
        if self.rounds == 0:  # once per run: the users' feature sketches, for the first layer's norms
            model = run.model
            sketch = InputSketch.build(self.x_train, run.split) if train and supports_ghost(model) else None
            self.input_sketch = sketch if sketch is not None and sketch.pays_off(model[0], self.batch_size) else None
        self.rounds += 1
        idx, weight = idx.to(dev)[active], weight.to(dev)[active]
        carries = (weight > 0).any(dim=0)  # drop columns that are padding (weight 0) for every user:
        if not bool(carries.all()):  # they add nothing (e.g. b = 32 > D_k = 20 on embedded MNIST)
            idx, weight = idx[:, carries], weight[:, carries]
        if not (train and int(active.sum())):
            return self._nothing()
        sketch = self.input_sketch
        grads = user_gradients(self.run.model, self.x_rows.gather(self.x_train, idx), self.y_rows.gather(self.y_train, idx), weight,
                               weight_decay=self.weight_decay, clip=self.clip,
                               input_sketch=sketch.minibatch(idx, self.sketch_rows) if sketch else None)
        return grads, float(grads.losses.mean()), float((grads.norms > self.clip).float().mean())

    def apply(self, estimate, *, participants, mu, unknown):
        self.flat_grad.copy_(estimate)
        self.opt.step()


class LocalStepsAlgorithm(Algorithm):
    """DP-FedAvg and DP-SCAFFOLD (docs/model.md#local-steps): the participants' S local DP-SGD
    steps at once, their updates sent normalised by the public bound B."""

    def __init__(self, spec, run, x_train, y_train):
        super().__init__(spec, run, x_train, y_train)
        self.local = build_local_steps(spec, run, x_train, y_train)

    def warm_start(self, aggregation, h, estimate, generator, *, train):
        """SCAFFOLD-warm: one extra transmission of every user's c_k (all users, round 0's channel)."""
        local = self.local
        if not local.warm_start:
            return None
        everyone = torch.ones(self.spec.data.users, dtype=torch.bool, device=self.x_train.device)
        if train:
            warm_grads, _ = local.warm_start_gradients()
            warm = aggregation.round(warm_grads, h, everyone, generator)
        else:
            warm = aggregation.channel_only(h, everyone)
        c_hat = estimate(warm.aligned_sum, participants=warm.participants, mu=float(warm.eligible.sum()))
        if train and c_hat is not None and warm.participants > 0:
            local.apply_warm_start(c_hat)
        return warm

    def transmit(self, active, *, train):
        if not (train and int(active.sum())):
            return self._nothing()
        return self.local.gradients(active)  # the transmit vectors (L / B) u_k

    def apply(self, estimate, *, participants, mu, unknown):
        self.local.apply(estimate, participants=participants, mu=mu, unknown=unknown)

    def step_facts(self, aggregation, *, warm=False):
        return self.local.step_facts(credit_transmit_noise=aggregation.credits_transmit_noise,
                                     credit_co_users=aggregation.sums_linearly, warm=warm)

    def summary(self, warm):
        local = self.local
        return {"algorithm": self.spec.train.algorithm, "local_steps": local.S, "update_norm_bound": local.bound,
                "warm_start_participants": None if warm is None else warm.participants,
                "warm_start_power_ratio": None if warm is None else warm.max_power_ratio}


def build_algorithm(spec: Spec, run: RunSetup, x_train: Tensor, y_train: Tensor) -> Algorithm:
    """The registered algorithm of ``spec.train.algorithm`` (:data:`~otafl.fl.strategies.ALGORITHMS`)."""
    from otafl.fl.strategies import ALGORITHMS

    return ALGORITHMS[spec.train.algorithm].load()(spec, run, x_train, y_train)
