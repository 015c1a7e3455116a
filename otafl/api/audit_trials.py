r"""The trials of ``otafl audit-run``: whole runs of the simulator's own code on two neighbours.

A trial is what :func:`otafl.fl.loop.run_experiment` does for ``audit.rounds`` rounds (SCAFFOLD's
warm start first when the spec asks for it): the coins of :func:`otafl.sampling.draw_participants`,
the participants' transmit vectors (FedSGD's clipped gradient, or the local DP-SGD steps of
:func:`otafl.fl.local.local_updates` through :class:`otafl.fl.local.LocalSteps`), the
aggregation's round (:mod:`otafl.fl.aggregations`), the estimator, and the server's step, with
the state the loop carries between rounds: the model, SCAFFOLD's server c and users' c_k.
Trials are batched: the users of ``b`` trials are the ``b K`` rows of one :class:`TrialLocalSteps`
(trial-major), each trial with its own model and c. The channel (h_t, p_t) is the same in every
trial (``train.seed``), as the accountants condition on it.

What a trial returns is the adversary's view, one d-vector per transmission: ``central`` the
released estimate (warm start: the estimate of c; rounds: g_hat), ``local`` what the server
receives from the target alone (rounds in which only the target transmits).

FedSGD's audit records have model-independent gradients (the canary is always clipped to L,
null records have none), so its trials carry no model: every round's vectors are the same.
docs/privacy/auditing.md#auditing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from otafl.config import AuditSpec, Spec
from otafl.estimate import ESTIMATORS
from otafl.fl.grads import StackedGradients
from otafl.fl.least_squares import AuditRecords, least_squares_model, least_squares_sums, user_gradients
from otafl.fl.local import LocalSteps, local_updates
from otafl.fl.round import Aggregate
from otafl.progress import Tally
from otafl.sampling import draw_participants

__all__ = ["BLOCK_ROWS", "TrialLocalSteps", "Transcripts", "run_trials"]

BLOCK_ROWS = 4096
"""Users' local steps computed together (trials x users rows of one batched call)."""


class TrialLocalSteps(LocalSteps):
    """:class:`~otafl.fl.local.LocalSteps` over ``trials`` independent runs at once: its users are the
    ``trials x K`` rows (trial-major), each trial with its own global model ``w [trials, d]`` and,
    for SCAFFOLD, its own server c ``[trials, d]`` (the users' c_k are rows already). The local
    steps are :func:`~otafl.fl.local.local_updates` from each row's own trial model; the server
    steps are :meth:`LocalSteps.apply`'s, per trial."""

    def __init__(self, *, trials: int, users: int, **kwargs):
        super().__init__(**kwargs)
        self.trials, self.users = int(trials), int(users)
        ref = self.params[0]
        self.w = ref.new_zeros(self.trials, self.dim)
        self.c_trials = ref.new_zeros(self.trials, self.dim) if self.c is not None else None

    def gradients(self, active: Tensor) -> tuple[StackedGradients, float, float]:
        """As :meth:`LocalSteps.gradients`, each active row stepping from its own trial's model and
        with its own trial's correction c - c_k."""
        rows = active.nonzero().view(-1)
        trial = torch.div(rows, self.users, rounding_mode="floor")
        c = None if self.c_users is None else self.c_trials.index_select(0, trial)
        u, losses = self._local_rows(rows, self.w.index_select(0, trial), c)
        grads = StackedGradients(u * self.scale, losses)
        return grads, float(losses.mean()) if losses.numel() else float("nan"), \
            float((grads.norms > self.L).float().mean()) if losses.numel() else 0.0

    def apply_trial(self, i: int, estimate: Tensor, *, participants: int, mu: float, unknown: bool) -> None:
        """:meth:`LocalSteps.apply` for trial ``i``."""
        update = estimate / self.scale
        self.w[i] += self.server_lr * update
        if self.c_trials is not None:
            rho = min(1.0, (mu if unknown else participants) / self.users)
            self.c_trials[i] += rho * (-update / (self.lr * self.S) - self.c_trials[i])

    def warm_start_rows(self) -> Tensor:
        """:meth:`LocalSteps.warm_start_gradients` for every row (one full-batch DP step at its
        trial's model); sets the rows' c_k and returns their transmit vectors [trials K, d]."""
        rows = torch.arange(self.index.shape[0], device=self.index.device)
        trial = torch.div(rows, self.users, rounding_mode="floor")
        u, _ = local_updates(self.model, self.w.index_select(0, trial), self.x_train, self.y_train, self.index,
                             self.counts, self._draws(rows, 1, 1.0), local_lr=1.0, record_sampling=1.0,
                             record_clip=self.C, step_noise=self.sigma, method=self.method,
                             gradient_sums=self.gradient_sums)
        self.c_users.copy_(-u)
        return -u * self.warm_scale

    def apply_warm_start_trial(self, i: int, estimate: Tensor) -> None:
        """:meth:`LocalSteps.apply_warm_start` for trial ``i``."""
        self.c_trials[i] = estimate / self.warm_scale


@dataclass
class Transcripts:
    """outputs [N, T, d] (float64; T transmissions: the warm start first when there is one),
    warm: whether transmission 0 is the warm start, aggs: trial 0's Aggregate of each transmission
    (the facts the accountants read), within: users whose update stayed within its bound / all."""

    outputs: Tensor
    warm: bool
    aggs: list
    within: tuple[int, int]


def _local_steps(spec: Spec, audit: AuditSpec, recs: AuditRecords, present: bool, trials: int, gens,
                 dev) -> TrialLocalSteps:
    tr, tx = spec.train, spec.transmit
    index, counts = recs.users(present)
    return TrialLocalSteps(trials=trials, users=spec.data.users, algorithm=tr.algorithm,
                           model=least_squares_model(audit.dim, device=dev), x_train=recs.x, y_train=recs.y,
                           index=index.repeat(trials, 1), counts=counts.repeat(trials), local_steps=tr.local_steps,
                           local_lr=tr.local_lr, server_lr=1.0 if tr.server_lr is None else tr.server_lr,
                           record_sampling=tr.record_sampling, record_clip=tx.record_clip, step_noise=tx.step_noise,
                           transmit_clip=tx.clip, warm_start=tr.scaffold_warm_start, mask_generator=gens["data"],
                           noise_generator=gens["local"], gradient_sums=least_squares_sums,
                           update_scaling=tx.update_scaling)


def facts_steps(spec: Spec, audit: AuditSpec, recs: AuditRecords, gens, dev) -> TrialLocalSteps:
    """A one-trial :class:`TrialLocalSteps` whose :meth:`~LocalSteps.step_facts` the accountants read."""
    return _local_steps(spec, audit, recs, True, 1, gens, dev)


def run_trials(spec: Spec, audit: AuditSpec, *, recs: AuditRecords, present: bool, trials: int, rounds: int,
               plan, aggregation, target: int, gens: dict, tally: Tally | None = None) -> Transcripts:
    """``trials`` runs of ``rounds`` rounds on the data set with the canary (``present``) or its
    neighbour (module docstring)."""
    tr, K = spec.train, spec.data.users
    dev = recs.x.device
    d = audit.dim
    local = tr.algorithm != "fedsgd"
    warm = local and tr.scaffold_warm_start
    estimate, unknown = ESTIMATORS[spec.estimator.kind], spec.estimator.kind == "unknown"
    only_target = torch.zeros(K, dtype=torch.bool, device=dev)
    only_target[target] = True
    everyone = torch.ones(K, dtype=torch.bool, device=dev)
    scope_local = audit.scope == "local"
    T = rounds + int(warm)
    out = torch.zeros(trials, T, d, dtype=torch.float64, device=dev)
    aggs: list[Aggregate | None] = [None] * T
    within = [0, 0]
    fedsgd = None
    if not local:
        index, counts = recs.users(present)
        fedsgd = user_gradients(torch.zeros(d, dtype=torch.float64, device=dev), recs.x, recs.y, index, counts).grads
    block = max(1, BLOCK_ROWS // K)
    done = 0
    while done < trials:
        b = min(block, trials - done)
        steps = _local_steps(spec, audit, recs, present, b, gens, dev) if local else None
        col = 0
        if warm:  # SCAFFOLD-warm: every user's c_k, one transmission on round 0's channel (the loop's warm_start)
            sent = steps.warm_start_rows()
            mask = only_target if scope_local else everyone
            for i in range(b):
                g = StackedGradients(sent[i * K:(i + 1) * K][mask])
                agg = aggregation.round(g, plan.h[0], mask, gens["noise"])
                c_hat = estimate(agg.aligned_sum, participants=agg.participants, mu=float(agg.eligible.sum()))
                if c_hat is not None and agg.participants > 0:
                    steps.apply_warm_start_trial(i, c_hat)
                    out[done + i, 0] = agg.aligned_sum if scope_local else c_hat
                aggs[0] = aggs[0] or agg
            col = 1
        for t in range(rounds):
            h, p = plan.h[t], plan.p[t]
            actives = []
            for _ in range(b):
                active = draw_participants(p.cpu(), gens["coins"]).to(dev)
                actives.append(active & only_target if scope_local else active)
            if local:
                sent, _, clipped = steps.gradients(torch.cat(actives))
                rows = sent.grads
                within[0] += int((sent.norms <= spec.transmit.clip * (1 + 1e-12)).sum())
                within[1] += rows.shape[0]
            offset = 0
            for i, active in enumerate(actives):
                n_act = int(active.sum())
                if local:
                    grads = StackedGradients(rows[offset:offset + n_act])
                    offset += n_act
                else:
                    grads = StackedGradients(fedsgd[active])
                agg = aggregation.round(grads, h, active, gens["noise"])
                aggs[col + t] = aggs[col + t] or agg
                mu = float((p * agg.eligible.to(p.dtype)).sum())
                g_hat = estimate(agg.aligned_sum, participants=agg.participants, mu=mu)
                if g_hat is None or agg.skip or agg.participants == 0:
                    continue  # nothing released, the model stays (the loop's rule)
                out[done + i, col + t] = agg.aligned_sum if scope_local else g_hat
                if local:
                    steps.apply_trial(i, g_hat, participants=agg.participants, mu=mu, unknown=unknown)
        done += b
        if tally is not None:
            tally.advance(b)
    return Transcripts(outputs=out, warm=warm, aggs=aggs, within=(within[0], within[1]))
