"""The FedSGD training loop: spec -> channel and sampling -> rounds -> records -> privacy.

``run_experiment(spec)`` is the library entry point behind ``otafl run`` and every sweep
point. Randomness comes from independent child generators derived from ``train.seed``
(data/minibatches, model init, fading, coins, transmit/receiver noise), so that changing
the aggregation strategy or the noise level does not change which samples or coins a
round sees, and the same seed gives the same results.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from otafl.config import Spec
from otafl.data import gather_rows, sample_minibatches
from otafl.estimate import ESTIMATORS
from otafl.fl.optim import bind_flat_grad, make_optimizer
from otafl.fl.grads import StackedGradients, supports_ghost, user_gradients
from otafl.fl.sketch import InputSketch
from otafl.fl.local import build_local_steps
from otafl.fl.round import AGGREGATORS, channel_only
from otafl.privacy.accountants import PrivacyResult, account_run
from otafl.privacy.accountants.registry import STEPS_ACCOUNTANTS
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
    t0 = time.perf_counter()
    run = build_run(spec, device=device)
    dev, gens, data, split, model, dim = run.device, run.generators, run.data, run.split, run.model, run.dim
    setup, h_all, p_all = run.channel.setup, run.channel.h, run.channel.p
    ds, ch, sm, tx, tr = spec.data, spec.channel, spec.sampling, spec.transmit, spec.train
    K, T = ds.users, tr.rounds
    x_train, y_train = data.x_train.to(dev), data.y_train.to(dev)
    x_test, y_test = data.x_test.to(dev), data.y_test.to(dev)

    aggregate, estimate = AGGREGATORS[tr.aggregation], ESTIMATORS[spec.estimator.kind]
    digital = None
    if tr.aggregation == "digital":  # orthogonal access + secure aggregation (otafl/fl/digital.py)
        from otafl.fl.digital import build_digital

        digital = build_digital(spec, dim=dim, power=setup.power, n0=ch.n0)
        aggregate = functools.partial(aggregate, digital=digital)
    params = list(model.parameters())
    opt = make_optimizer(tr.optimizer, params, tr.lr)
    flat_grad = bind_flat_grad(params)
    sensitivity = 2.0 * tx.clip  # minibatch clipping: one record moves g_k anywhere in the L-ball
    local = build_local_steps(spec, run, x_train, y_train)  # None for fedsgd
    ota = tr.aggregation == "ota"  # only there do artificial and channel noise reach the release
    step_facts = {} if local is None else local.step_facts(credit_transmit_noise=ota)  # docs/privacy.md#steps

    records: list[dict] = []
    facts: list[RoundFacts] = []
    test_acc = math.nan
    warm = None
    if local is not None and local.warm_start:  # SCAFFOLD-warm: one extra transmission of every user's c_k
        everyone = torch.ones(K, dtype=torch.bool, device=dev)
        if train:
            warm_grads, _ = local.warm_start_gradients()
            warm = aggregate(warm_grads, h_all[0], everyone, setup, gens["noise"], superposition=tr.superposition)
        else:
            warm = channel_only(h_all[0], everyone, setup, tr.aggregation)
        c_hat = estimate(warm.aligned_sum, participants=warm.participants, mu=float(warm.eligible.sum()))
        if train and c_hat is not None and warm.participants > 0:
            local.apply_warm_start(c_hat)
        facts.append(RoundFacts(
            participation_prob=warm.eligible.to(torch.float64).cpu(),
            noise_var=setup.noise_var.to(torch.float64).cpu() if tr.aggregation == "ota"
            else torch.zeros(K, dtype=torch.float64),
            alignment_gain=warm.alignment_gain if tr.aggregation == "ota" else math.inf,
            n0=ch.n0 if tr.aggregation == "ota" else 0.0, sensitivity=sensitivity, dim=dim,
            participants=warm.participants, **local.step_facts(credit_transmit_noise=ota, warm=True)))
    for t in range(T):
        h, p = h_all[t], p_all[t]
        active = draw_participants(p.cpu(), gens["coins"]).to(dev)
        if local is None:
            idx, weight = sample_minibatches(split, ds.batch_size, gens["data"])
            if t == 0:  # once per run: the users' feature sketches, for the first layer's norms
                input_sketch = InputSketch.build(x_train, split) if train and supports_ghost(model) else None
                if input_sketch is not None and not input_sketch.pays_off(model[0], ds.batch_size):
                    input_sketch = None
            idx, weight = idx.to(dev)[active], weight.to(dev)[active]
            carries = (weight > 0).any(dim=0)  # drop columns that are padding (weight 0) for every user:
            if not bool(carries.all()):  # they add nothing (e.g. b = 32 > D_k = 20 on embedded MNIST)
                idx, weight = idx[:, carries], weight[:, carries]
        n_active = int(active.sum()) if train else 0
        if n_active and local is not None:
            # S local DP-SGD steps of every participant at once; the transmit vectors (L / B) u_k
            grads, train_loss, clipped_fraction = local.gradients(active)
        elif n_active:
            # ghost norms + one backward for nn.Sequential MLPs, torch.func vmap otherwise
            grads = user_gradients(model, gather_rows(x_train, idx), gather_rows(y_train, idx), weight,
                                   weight_decay=tr.weight_decay,
                                   input_sketch=input_sketch.minibatch(idx) if input_sketch else None)
            train_loss = float(grads.losses.mean())
            clipped_fraction = float((grads.norms > tx.clip).float().mean())
        else:
            grads = StackedGradients(x_train.new_zeros(0, dim))
            train_loss, clipped_fraction = math.nan, math.nan
        if train:
            agg = aggregate(grads, h, active, setup, gens["noise"], superposition=tr.superposition)
        elif digital is not None:
            agg = _digital_channel_only(h, active, digital)
        else:
            agg = channel_only(h, active, setup, tr.aggregation)
        p_eff = p * agg.eligible.to(p.dtype)
        mu = float(p_eff.sum())
        n_tx = agg.participants
        g_hat = estimate(agg.aligned_sum, participants=n_tx, mu=mu)
        if train and g_hat is not None and n_tx > 0 and not agg.skip and local is not None:
            local.apply(g_hat, participants=n_tx, mu=mu, unknown=spec.estimator.kind == "unknown")
        elif train and g_hat is not None and n_tx > 0 and not agg.skip:
            flat_grad.copy_(g_hat)
            opt.step()
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
        records.append(rec)
        facts.append(RoundFacts(
            participation_prob=p_eff.to(torch.float64).cpu(),
            noise_var=setup.noise_var.to(torch.float64).cpu() if tr.aggregation == "ota"
            else torch.full((K,), digital.noise_var if digital is not None else 0.0, dtype=torch.float64),
            alignment_gain=agg.alignment_gain if tr.aggregation == "ota" else math.inf,
            n0=ch.n0 if tr.aggregation == "ota" else 0.0,
            sensitivity=sensitivity, dim=dim, participants=n_tx, **step_facts,
            digital=digital.facts() if digital is not None else None))
        if on_round is not None:
            on_round(rec)

    privacy, privacy_note = _account(spec, facts, digital, delta_target)
    offset = 0 if warm is None else 1  # the warm-start transmission comes first in the facts
    for t, rec in enumerate(records):
        rec.update(privacy.round_fields(t + offset))
    summary = {
        "final_test_accuracy": test_acc,
        "rounds": T,
        "users": K,
        "dim": dim,
        "mean_participants": float(np.mean([r["participants"] for r in records])),
        "scheme": sm.scheme,
        "aggregation": tr.aggregation,
        **({"algorithm": tr.algorithm, "local_steps": local.S, "update_norm_bound": local.bound,
            "warm_start_participants": None if warm is None else warm.participants,
            "warm_start_power_ratio": None if warm is None else warm.max_power_ratio} if local is not None else {}),
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
        **_cost_summary(records, digital),
        **({"privacy_note": privacy_note} if privacy_note else {}),
        **privacy.summary_fields(),
        "wall_seconds": time.perf_counter() - t0,
    }
    return RunResult(summary=summary, rounds=records, privacy=privacy, facts=facts)


def _digital_channel_only(h, active, digital):
    """Bounds-only digital round: who is in outage and what the uplink costs (no gradients)."""
    from otafl.fl.digital import digital_cost_only
    from otafl.fl.round import Aggregate

    eligible, transmitting, cost = digital_cost_only(h, active, digital)
    extras = {"channel_uses": cost.channel_uses, "energy": cost.energy, "outages": cost.outages,
              "bits": cost.bits, "overflow": 0, "clipped": 0}
    return Aggregate(h.new_zeros(0), transmitting, eligible, math.nan, math.nan, 1.0, extras=extras)


def _account(spec: Spec, facts: list[RoundFacts], digital, delta_target: float | None
             ) -> tuple[PrivacyResult, str]:
    """The run's privacy, per accountant of the spec, by :func:`account_run` (``steps`` and
    ``digital`` first; ``digital`` always for a digital round). The over-the-air accountants
    never reach a digital run (spec validation refuses them there: they model hidden
    participation and channel noise); the note below only guards direct callers."""
    listed = list(spec.privacy.accountants)
    own = [a for a in (*STEPS_ACCOUNTANTS, "digital") if a in listed or (a == "digital" and digital is not None)]
    others = [a for a in listed if a not in own]
    note = ""
    if digital is not None and digital.mechanism != "gaussian" and others:
        note = f"{', '.join(others)} not run: they model Gaussian noise, not the {digital.mechanism} mechanism"
        others = []
    names = own + others  # the run-level composers first, as before
    dg = spec.digital
    target = spec.privacy.delta_total if delta_target is None else delta_target
    result = account_run(facts, accountants=names, delta_l=spec.privacy.delta_l,
                         delta_prime=spec.privacy.delta_prime, delta_target=target,
                         digital_delta_total=target if dg.delta_total == "auto" else float(dg.delta_total))
    return result, note


def _cost_summary(records: list[dict], digital) -> dict:
    """Means per round of the uplink's channel uses, energy and outages (and the digital extras)."""
    def mean(key):
        vals = [float(r[key]) for r in records if key in r and not math.isnan(float(r[key]))]
        return float(np.mean(vals)) if vals else math.nan

    out = {"channel_uses_per_round": mean("channel_uses"), "energy_per_round": mean("energy"),
           "outages_per_round": mean("outages")}
    if digital is not None:
        out.update({"bits_per_round": mean("bits"), "digital_mechanism": digital.mechanism,
                    "digital_bits": digital.bits, "digital_coordinates": digital.coordinates,
                    "overflow_rounds": int(sum(1 for r in records if r.get("overflow", 0))),
                    "clipped_coordinates": int(sum(r.get("clipped", 0) for r in records))})
    return out
