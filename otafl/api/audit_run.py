r"""``otafl audit-run``: an end-to-end privacy audit of the simulator's own round.

The round is the one :func:`otafl.fl.loop.run_experiment` runs: the channel of
:func:`otafl.setup.build_channel` (train.seed), the participation coins of
:func:`otafl.sampling.draw_participants`, the local DP-SGD steps of
:class:`otafl.fl.local.LocalSteps` (fedavg, scaffold), the aggregator of
:mod:`otafl.fl.aggregations` strategy (``ota``, ``ideal`` or ``digital``) and the estimator of :data:`otafl.estimate.ESTIMATORS`.
Only the data differ: the least-squares records of :func:`otafl.fl.least_squares.audit_records`
(a canary along one coordinate, or its neighbour record), and the seeds of the trials'
randomness (``audit.seed``: coins, noise, record sampling; the channel is fixed by
``train.seed`` and is the same in every trial, as the accountants condition on it).

The adversary's statistic is the canary coordinate of what it sees: ``central`` the released
update (the estimate g_hat, of which the model is a post-processing), ``local`` what the server
receives from the target (the aligned sum of a round in which only the target transmits: the
colluding co-users' contributions are known and subtracted). The test and its interval are
:func:`otafl.privacy.empirical.empirical_epsilon`; the upper bounds are the accountants' of
the same round, from the facts the loop records (the aggregation's ``facts``), each at its
own delta, and the audit's lower bound is computed at each accountant's delta too.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from otafl.config import AuditSpec, Spec
from otafl.device import resolve_device
from otafl.errors import OtaflInputError
from otafl.estimate import ESTIMATORS
from otafl.fl.grads import StackedGradients
from otafl.fl.least_squares import audit_records, least_squares_model, least_squares_sums, user_gradients
from otafl.fl.accounting import account_facts
from otafl.fl.aggregations import build_aggregation
from otafl.fl.local import LocalSteps
from otafl.fl.strategies import ALGORITHMS
from otafl.privacy.accountants import ACCOUNTANTS
from otafl.privacy.empirical import CONFIDENCE, empirical_epsilon
from otafl.progress import Progress, Tally
from otafl.sampling import draw_participants
from otafl.setup import build_channel, make_generators

__all__ = ["BLOCK_ROWS", "SUMDOM", "audit_run"]

BLOCK_ROWS = 4096
"""Users' local steps computed together (trials x users rows of one batched call)."""
SUMDOM = "steps-sumdom"
"""The sum-dominated ``steps`` accountant, shown beside ``steps`` for local-steps runs when registered."""


def _main_accountant(spec: Spec, names: list[str]) -> str:
    for name in ("steps" if spec.train.algorithm != "fedsgd" else None,
                 "digital" if spec.train.aggregation == "digital" else None, "exact"):
        if name in names:
            return name
    return names[0]


def _local_steps(spec: Spec, audit: AuditSpec, x, y, index, counts, gens) -> LocalSteps:
    tr, tx = spec.train, spec.transmit
    return LocalSteps(algorithm=tr.algorithm, model=least_squares_model(audit.dim, device=x.device), x_train=x,
                      y_train=y, index=index, counts=counts, local_steps=tr.local_steps, local_lr=tr.local_lr,
                      server_lr=1.0 if tr.server_lr is None else tr.server_lr,
                      record_sampling=tr.record_sampling, record_clip=tx.record_clip, step_noise=tx.step_noise,
                      transmit_clip=tx.clip, warm_start=False, mask_generator=gens["data"],
                      noise_generator=gens["local"], gradient_sums=least_squares_sums)


def audit_run(spec: Spec, audit: AuditSpec, *, device: str | torch.device = "cpu",
              progress: Progress | None = None) -> dict[str, Any]:
    """Run ``audit.trials`` rounds on each of the two neighbouring data sets and compare the
    empirical lower bound on epsilon with every accountant's upper bound (module docstring).

    Returns a JSON-able dict: ``epsilon_lower`` (the 95% lower bound at ``delta``, the main
    accountant's delta), ``epsilon_lower_ci``, ``delta``, ``trials``, ``upper`` {accountant:
    epsilon}, ``accountants`` {accountant: {epsilon, delta, epsilon_lower, epsilon_lower_ci}},
    ``main``, ``scope``, ``test`` and ``meta``.
    """
    t0 = time.perf_counter()
    dev = resolve_device(str(device))
    tr, tx, K = spec.train, spec.transmit, spec.data.users
    d, c, N = audit.dim, audit.canary, audit.trials
    local = ALGORITHMS[tr.algorithm].local
    plan = build_channel(spec, dim=d, device=dev, generators=make_generators(tr.seed, dev))
    h, p, setup = plan.h[0], plan.p[0], plan.setup
    aggregation = build_aggregation(spec, dim=d, setup=setup)  # the loop's own strategy
    digital = aggregation.digital
    estimate = ESTIMATORS[spec.estimator.kind]
    target = int(torch.argmax(p))  # the most likely participant: its record is used most
    recs = audit_records(users=K, records=audit.records if local else 1, dim=d, canary=c, target=target,
                         co_users=audit.co_users, neighbour="null" if local else "mirror",
                         local_lr=tr.local_lr, device=dev)
    gens = make_generators(audit.seed, dev)
    only_target = torch.zeros(K, dtype=torch.bool, device=dev)
    only_target[target] = True

    step_facts = {}
    fedsgd_grads = {}
    if local:
        facts_steps = _local_steps(spec, audit, recs.x, recs.y, recs.index_present, recs.counts, gens)
        step_facts = facts_steps.step_facts(credit_transmit_noise=aggregation.credits_transmit_noise,
                                                credit_co_users=aggregation.sums_linearly)  # as the loop
    else:
        w0 = torch.zeros(d, dtype=torch.float64, device=dev)
        for present in (True, False):
            index, counts = recs.users(present)
            fedsgd_grads[present] = user_gradients(w0, recs.x, recs.y, index, counts).grads

    stats = {True: [], False: []}
    first_agg = None
    block = max(1, BLOCK_ROWS // K)
    tally = Tally(progress, 2 * N)
    unclipped = [0, 0]  # local steps: users whose update stayed within the power bound B, of all
    for present in (True, False):
        index, counts = recs.users(present)
        done = 0
        while done < N:
            b = min(block, N - done)
            actives = []
            for _ in range(b):
                active = draw_participants(p.cpu(), gens["coins"]).to(dev)
                actives.append(active & only_target if audit.scope == "local" else active)
            if local:
                steps = _local_steps(spec, audit, recs.x, recs.y, index.repeat(b, 1), counts.repeat(b), gens)
                sent, _, clipped = steps.gradients(torch.cat(actives))
                rows = sent.grads
                n_rows = rows.shape[0]
                unclipped[0] += int(round((1.0 - clipped) * n_rows)) if n_rows else 0
                unclipped[1] += n_rows
            offset = 0
            for active in actives:
                n_act = int(active.sum())
                if local:
                    grads = StackedGradients(rows[offset:offset + n_act])
                    offset += n_act
                else:
                    grads = StackedGradients(fedsgd_grads[present][active])
                agg = aggregation.round(grads, h, active, gens["noise"])
                if first_agg is None:
                    first_agg = agg
                if audit.scope == "local":
                    value = float(agg.aligned_sum[c]) if agg.participants else 0.0
                else:
                    mu = float((p * agg.eligible.to(p.dtype)).sum())
                    g_hat = estimate(agg.aligned_sum, participants=agg.participants, mu=mu)
                    value = 0.0 if g_hat is None or agg.skip else float(g_hat[c])
                stats[present].append(value)
            done += b
            tally.advance(b)
    tally.finish()

    sensitivity = 2.0 * tx.clip
    facts = aggregation.facts(first_agg, p * first_agg.eligible.to(p.dtype), sensitivity=sensitivity,
                              step_facts=step_facts)
    extra = (SUMDOM,) if local and SUMDOM in ACCOUNTANTS else ()
    privacy, note = account_facts(spec, [facts], digital, extra=extra)
    names = list(privacy)
    if not names:
        raise OtaflInputError("privacy.accountants is empty: audit-run compares the audit with an accountant")
    present_arr, absent_arr = np.asarray(stats[True]), np.asarray(stats[False])
    cache: dict[float, Any] = {}
    rows: dict[str, dict] = {}
    for name in names:
        res = privacy[name]
        if audit.scope == "central":
            eps, delta = float(res.epsilon_central_per_round[0]), float(res.delta_central)
        else:
            eps, delta = float(res.epsilon_local_per_round[0]), float(res.delta_local)
        if delta not in cache and 0.0 <= delta < 1.0:
            cache[delta] = empirical_epsilon(present_arr, absent_arr, delta=delta)
        emp = cache.get(delta)
        rows[name] = {"epsilon": eps, "delta": delta,
                      "epsilon_lower": None if emp is None else emp.epsilon_lower,
                      "epsilon_lower_ci": None if emp is None else list(emp.ci),
                      "exceeded": bool(emp is not None and emp.epsilon_lower > eps),
                      "guaranteed": ACCOUNTANTS[name].guaranteed}
    main = _main_accountant(spec, names)
    main_emp = cache.get(rows[main]["delta"])
    out = {
        "epsilon_lower": rows[main]["epsilon_lower"],
        "epsilon_lower_ci": rows[main]["epsilon_lower_ci"],
        "delta": rows[main]["delta"],
        "trials": N,
        "upper": {name: row["epsilon"] for name, row in rows.items()},
        "accountants": rows,
        "main": main,
        "scope": audit.scope,
        "test": None if main_emp is None else main_emp.test,
        "meta": {
            "command": "audit-run", "algorithm": tr.algorithm, "aggregation": tr.aggregation,
            "mechanism": digital.mechanism if digital is not None else None, "scheme": spec.sampling.scheme,
            "users": K, "dim": d, "canary": c, "target": target, "target_p": float(p[target]),
            "co_users": audit.co_users, "records": audit.records if local else 1,
            "neighbours": "add/remove (canary or null record)" if local else "replace-one (canary or mirrored canary)",
            "seed": audit.seed, "channel_seed": tr.seed, "confidence": 2 * CONFIDENCE - 1,
            "statistic": "canary coordinate of the released update g_hat" if audit.scope == "central"
            else "canary coordinate of what the server receives from the target alone",
            "mean_present": float(present_arr.mean()), "mean_absent": float(absent_arr.mean()),
            "var_present": float(present_arr.var()), "var_absent": float(absent_arr.var()),
            "updates_within_bound": None if not local else f"{unclipped[0]}/{unclipped[1]}",
            "privacy_note": note, "wall_seconds": time.perf_counter() - t0,
        },
    }
    if not all(math.isfinite(v) or v == math.inf for v in out["upper"].values()):
        out["meta"]["warning"] = "an accountant returned a non-finite epsilon"
    return out
