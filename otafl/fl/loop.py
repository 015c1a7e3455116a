"""The training loop: Algorithm 1 of the paper, over a pluggable aggregation and algorithm.

``run_experiment(spec)`` is the library entry point behind ``otafl run`` and every sweep
point. Each round draws the participants, lets the algorithm (:mod:`otafl.fl.algorithms`)
make their transmit vectors, lets the aggregation (:mod:`otafl.fl.aggregations`) deliver
them and say what the round revealed, estimates the mean, steps the server and records the
round; the accountants then read the facts (:mod:`otafl.fl.accounting`). Neither strategy is
named here: both come from their registries (:mod:`otafl.fl.strategies`).

Randomness comes from independent child generators derived from ``train.seed``
(data/minibatches, model init, fading, coins, transmit/receiver noise, local steps), so that
changing the aggregation strategy or the noise level does not change which samples or coins
a round sees, and the same seed gives the same results.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from otafl.config import Spec
from otafl.device import default_threads
from otafl.estimate import ESTIMATORS
from otafl.fl.accounting import account_facts
from otafl.fl.aggregations import build_aggregation
from otafl.fl.algorithms import build_algorithm
from otafl.privacy.accountants import PrivacyResult
from otafl.privacy.facts import RoundFacts
from otafl.sampling import draw_participants
from otafl.setup import build_run

@dataclass
class RunResult:
    """A run: its JSON-able summary, one record per round, the typed privacy result
    (per accountant: per-round and composed local/central epsilons, flags) and the facts
    every round revealed to the accountants (the warm-start transmission first, if any)."""

    summary: dict
    rounds: list[dict] = field(default_factory=list)
    privacy: PrivacyResult | None = None
    facts: list[RoundFacts] = field(default_factory=list)


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: Tensor, y: Tensor, batch: int = 4096) -> float:
    correct = 0
    for i in range(0, x.shape[0], batch):
        correct += int((model(x[i : i + batch]).argmax(dim=1) == y[i : i + batch]).sum())
    return correct / max(1, x.shape[0])


def run_experiment(spec: Spec, *, device: str | None = None, train: bool = True,
                   on_round: Callable[[dict], None] | None = None,
                   delta_target: float | None = None) -> RunResult:
    """Train FedSGD (or, with ``train.algorithm``, DP-FedAvg / DP-SCAFFOLD with local steps,
    :mod:`otafl.fl.local`) over the simulated channel described by ``spec``.

    ``train=False`` draws the same channel, coins and alignment gains but computes no
    gradients and leaves the model untouched: the privacy accounting of the run, fast
    (sweeps with ``train = false``). Accuracy and loss are then NaN.
    ``on_round`` is called with each round's record (progress bars, live logs).
    ``delta_target`` overrides ``privacy.delta_total``, the one delta at which every
    accountant states its totals over the run (:func:`otafl.privacy.accountants.account_run`).
    Returns the run summary (JSON-able) and one record per round.
    """
    default_threads()  # the CLI's thread policy (otafl/device.py)
    t0 = time.perf_counter()
    run = build_run(spec, device=device)
    dev, gens, data, model, dim = run.device, run.generators, run.data, run.model, run.dim
    h_all, p_all = run.channel.h, run.channel.p
    tr = spec.train
    K, T = spec.data.users, tr.rounds
    x_train, y_train = data.x_train.to(dev), data.y_train.to(dev)
    x_test, y_test = data.x_test.to(dev), data.y_test.to(dev)

    aggregation = build_aggregation(spec, dim=dim, setup=run.channel.setup)  # how vectors reach the server
    algorithm = build_algorithm(spec, run, x_train, y_train)  # what users send, how the server steps
    estimate, unknown = ESTIMATORS[spec.estimator.kind], spec.estimator.kind == "unknown"
    sensitivity = 2.0 * spec.transmit.clip  # minibatch clipping: one record moves g_k anywhere in the L-ball
    step_facts = algorithm.step_facts(aggregation)

    records: list[dict] = []
    facts: list[RoundFacts] = []
    test_acc = math.nan
    diverged_at = None  # the first round whose loss or model is NaN/inf: training stops there
    warm = algorithm.warm_start(aggregation, h_all[0], estimate, gens["noise"], train=train)
    if warm is not None:  # a transmission before round 1 (SCAFFOLD's warm start), accounted as a round
        warm_facts = algorithm.step_facts(aggregation, warm=True)
        facts.append(aggregation.facts(warm, warm.eligible, sensitivity=sensitivity, step_facts=warm_facts, warm=True))
    for t in range(T):
        h, p = h_all[t], p_all[t]
        active = draw_participants(p.cpu(), gens["coins"]).to(dev)  # who takes part
        grads, train_loss, clipped_fraction = algorithm.transmit(active, train=train)  # what they send
        agg = aggregation.round(grads, h, active, gens["noise"]) if train else aggregation.channel_only(h, active)
        p_eff = p * agg.eligible.to(p.dtype)
        mu = float(p_eff.sum())
        n_tx = agg.participants
        g_hat = estimate(agg.aligned_sum, participants=n_tx, mu=mu)  # the server's estimate of the mean
        if train and g_hat is not None and n_tx > 0 and not agg.skip:
            algorithm.apply(g_hat, participants=n_tx, mu=mu, unknown=unknown)
        if train and ((t + 1) % tr.eval_every == 0 or t == T - 1):
            test_acc = evaluate(model, x_test, y_test)
            evaluated = test_acc
        else:
            evaluated = math.nan
        rec = {
            "round": t + 1,
            "participants": n_tx,
            "expected_participants": mu,
            "alignment_gain": agg.alignment_gain,
            "effective_noise_var": agg.effective_noise_var,
            "max_power_ratio": agg.max_power_ratio,
            "clipped_fraction": clipped_fraction,
            "train_loss": train_loss,
            "test_accuracy": evaluated,
            "mean_gain": float(h.mean()),
            "mean_p": float(p.mean()),
            **agg.extras,
        }
        if train and n_tx > 0 and not (math.isfinite(train_loss) and _finite(model)):
            diverged_at = t + 1
        records.append(rec)
        facts.append(aggregation.facts(agg, p_eff, sensitivity=sensitivity, step_facts=step_facts))
        if on_round is not None:
            on_round(rec)
        if diverged_at is not None:
            break

    privacy, privacy_note = account_facts(spec, facts, aggregation.digital, delta_target)
    offset = len(facts) - len(records)  # the warm-start transmission comes first in the facts
    for t, rec in enumerate(records):
        rec.update(privacy.round_fields(t + offset))
    summary = {
        "final_test_accuracy": test_acc,
        "rounds": len(records),
        **({"diverged_at_round": diverged_at, "rounds_planned": T} if diverged_at is not None else {}),
        "users": K,
        "dim": dim,
        "mean_participants": float(np.mean([r["participants"] for r in records])),
        "scheme": spec.sampling.scheme,
        "aggregation": tr.aggregation,
        **algorithm.summary(warm),
        "estimator": spec.estimator.kind,
        "model": spec.model.name,
        "dataset": data.name,
        "seed": tr.seed,
        "device": str(dev),
        "final_train_loss": next((r["train_loss"] for r in reversed(records)
                                  if not math.isnan(r["train_loss"])), math.nan),
        "max_power_ratio": max([r["max_power_ratio"] for r in records] + ([warm.max_power_ratio] if warm else [])),
        "delta_l": spec.privacy.delta_l,
        "delta_total": spec.privacy.delta_total if delta_target is None else delta_target,
        **aggregation.summary(records),
        **({"privacy_note": privacy_note} if privacy_note else {}),
        **privacy.summary_fields(),
        "wall_seconds": time.perf_counter() - t0,
    }
    return RunResult(summary=summary, rounds=records, privacy=privacy, facts=facts)


def _finite(model) -> bool:
    """Whether every model parameter is finite (no NaN or inf)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())
