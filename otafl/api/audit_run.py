r"""``otafl audit-run``: an end-to-end privacy audit of the simulator's own runs.

The trials (:mod:`otafl.api.audit_trials`) are runs of ``train.rounds`` rounds of the code
:func:`otafl.fl.loop.run_experiment` runs (the channel of :func:`otafl.setup.build_channel`
from ``train.seed``, the coins of :func:`otafl.sampling.draw_participants`, the local DP-SGD steps of
:class:`otafl.fl.local.LocalSteps`, the aggregation's round, the estimator, the server step, the
model and SCAFFOLD's c and c_k carried between rounds, the warm start when asked), on two
neighbouring data sets that differ in one crafted record (:func:`otafl.fl.least_squares.audit_records`).

The distinguisher is a score of the whole transcript: a linear discriminant of the transmissions'
canary coordinates (and, where the target's participation is hidden, their noise-normalised
values), fitted on the first :data:`CALIBRATION` share of each data set's trials. When each
transmission is linear in Gaussian noise (p = 1 for the target, q = 1, the update scaled by its
bound, a Gaussian aggregation) the transcripts are Gaussian with one covariance, and the
discriminant is their log-likelihood ratio. On the other trials:

* ``epsilon_lower`` with ``fit = "gdp"`` (Gaussian transcripts): the 95% lower bound mu_lower on
  the Gaussian-DP parameter from every threshold at once (:func:`otafl.privacy.empirical.gaussian_fit`),
  converted to epsilon at each accountant's delta; exact when the trade-off curve is Gaussian,
  which it is for such transcripts.
* ``epsilon_lower_threshold``: the assumption-free threshold test
  (:func:`otafl.privacy.empirical.empirical_epsilon`); ``epsilon_lower`` where ``fit = "none"``
  (hidden participation, record sampling, clipped updates, quantised mechanisms).

The upper bounds are the accountants', from the facts the loop records (the aggregation's
``facts`` of trial 0's transmissions): the per-round value for a one-transmission run, else the
run's total at ``privacy.delta_total``; the lower bounds are computed at each one's delta.
docs/privacy/auditing.md#auditing.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from otafl.api.audit_trials import facts_steps, run_trials
from otafl.config import AuditSpec, Spec
from otafl.device import default_threads, resolve_device
from otafl.errors import OtaflInputError
from otafl.fl.accounting import account_facts
from otafl.fl.aggregations import build_aggregation
from otafl.fl.least_squares import audit_records
from otafl.fl.strategies import ALGORITHMS
from otafl.privacy.accountants import ACCOUNTANTS
from otafl.privacy.empirical import (CONFIDENCE, GDP_FIT, SAMPLED_FIT, empirical_epsilon, gaussian_fit, gdp_epsilon,
                                    sampled_epsilon,
                                    sampled_fit)
from otafl.privacy.units import UNIT_LABELS
from otafl.progress import Progress, Tally
from otafl.setup import build_channel, make_generators

__all__ = ["CALIBRATION", "SUMDOM", "audit_run", "discriminant", "transcript_features"]

SUMDOM = "steps-sumdom"
"""The sum-dominated ``steps`` accountant, shown beside ``steps`` for local-steps runs when registered."""
CALIBRATION = 0.25
"""Share of each data set's trials that fits the discriminant (the rest evaluates it)."""
RIDGE = 1e-9
"""Added to the standardised features' covariance before it is inverted."""


def _main_accountant(spec: Spec, names: list[str]) -> str:
    for name in ("steps" if spec.train.algorithm != "fedsgd" else None,
                 "digital" if spec.train.aggregation == "digital" else None, "exact"):
        if name in names:
            return name
    return names[0]


def transcript_features(outputs: np.ndarray, canary: int, *, hidden: bool) -> np.ndarray:
    """[N, T, d] transcripts -> [N, F] features: each transmission's canary coordinate, and where
    participation is hidden (and d > 1) also its value over the root mean square of the other
    coordinates (the noise level, which moves with the hidden count of participants)."""
    u = outputs[:, :, canary]
    if not hidden or outputs.shape[2] < 2:
        return u
    rest = np.delete(outputs, canary, axis=2)
    rms = np.sqrt(np.mean(rest * rest, axis=2))
    with np.errstate(divide="ignore", invalid="ignore"):
        snr = np.where(rms > 0, u / rms, 0.0)
    return np.concatenate([u, snr], axis=1)


def discriminant(present: np.ndarray, absent: np.ndarray) -> np.ndarray:
    """Fisher's linear discriminant w (score x . w, larger under D): the pooled covariance's inverse
    times the difference of the means, on standardised features (constant features weigh 0). For
    two Gaussians of one covariance it is their log-likelihood ratio up to an affine map."""
    scale = np.sqrt(0.5 * (present.var(axis=0) + absent.var(axis=0)))
    keep = scale > 0
    w = np.zeros(present.shape[1])
    if not keep.any():
        diff = present.mean(axis=0) - absent.mean(axis=0)
        return np.sign(diff)
    zp, za = present[:, keep] / scale[keep], absent[:, keep] / scale[keep]
    cov = 0.5 * (np.atleast_2d(np.cov(zp, rowvar=False)) + np.atleast_2d(np.cov(za, rowvar=False)))
    cov = cov + RIDGE * np.eye(cov.shape[0])
    w[keep] = np.linalg.solve(cov, zp.mean(axis=0) - za.mean(axis=0)) / scale[keep]
    return w


def _fit_kind(spec: Spec, audit: AuditSpec, p_target: list[float], local: bool, digital,
              transmissions: int) -> tuple[str, str]:
    """Which family the trade-off curve is fitted in: ``gdp`` when every transmission is linear in
    Gaussian noise, ``sampled-gaussian`` when it is so but for the target's one hidden coin, and
    ``none`` (with the reason) otherwise."""
    tr, tx = spec.train, spec.transmit
    fit = GDP_FIT
    if any(p < 1.0 for p in p_target):
        if audit.scope != "central" or transmissions != 1:
            return "none", ("the target's participation is hidden (p < 1) over several transmissions or seen "
                            "by the local adversary: no fitted family")
        fit = SAMPLED_FIT
    if local and tr.record_sampling < 1.0:
        return "none", "record sampling q < 1: the trade-off curve is a mixture"
    if local and tx.update_scaling == "clip":
        return "none", "updates clipped to L: not linear in the noise"
    if digital is not None and digital.mechanism != "gaussian":
        return "none", f"the {digital.mechanism} mechanism is not Gaussian"
    return fit, ""


def audit_run(spec: Spec, audit: AuditSpec, *, device: str | torch.device = "cpu",
              progress: Progress | None = None) -> dict[str, Any]:
    """Run ``audit.trials`` runs on each of the two neighbouring data sets and compare the
    empirical lower bound on epsilon with every accountant's upper bound (module docstring).

    Returns a JSON-able dict: ``epsilon_lower`` (the 95% lower bound at ``delta``, the main
    accountant's delta), ``fit``, ``mu_lower``, ``epsilon_lower_threshold`` (+ ``_ci``), ``delta``,
    ``unit``, ``trials``, ``rounds``, ``upper`` {accountant: epsilon}, ``accountants``
    {accountant: {epsilon, delta, unit, reason, guaranteed, epsilon_lower, epsilon_lower_gdp,
    epsilon_lower_threshold, epsilon_lower_threshold_ci, exceeded}}, ``main``, ``scope``,
    ``statistic``, ``test`` and ``meta``.
    """
    default_threads()  # the CLI's thread policy (otafl/device.py)
    t0 = time.perf_counter()
    dev = resolve_device(str(device))
    tr, K = spec.train, spec.data.users
    d, c, N, R = audit.dim, audit.canary, audit.trials, tr.rounds
    local = ALGORITHMS[tr.algorithm].local
    plan = build_channel(spec, dim=d, device=dev, generators=make_generators(tr.seed, dev))
    aggregation = build_aggregation(spec, dim=d, setup=plan.setup)  # the loop's own strategy
    digital = aggregation.digital
    target = int(torch.argmax(plan.p[0]))  # the most likely participant: its record is used most
    recs = audit_records(users=K, records=audit.records if local else 1, dim=d, canary=c, target=target,
                         co_users=audit.co_users, neighbour="null" if local else "mirror",
                         local_lr=tr.local_lr, curvature=audit.curvature, device=dev)
    gens = make_generators(audit.seed, dev)
    tally = Tally(progress, 2 * N)
    runs = {present: run_trials(spec, audit, recs=recs, present=present, trials=N, rounds=R, plan=plan,
                                aggregation=aggregation, target=target, gens=gens, tally=tally)
            for present in (True, False)}
    tally.finish()

    # the accountants read trial 0's facts, as the loop records them
    run = runs[True]
    sensitivity = 2.0 * spec.transmit.clip
    step_facts, warm_facts = {}, {}
    if local:
        steps = facts_steps(spec, audit, recs, make_generators(audit.seed, dev), dev)
        kw = dict(credit_transmit_noise=aggregation.credits_transmit_noise, credit_co_users=aggregation.sums_linearly)
        step_facts, warm_facts = steps.step_facts(**kw), steps.step_facts(**kw, warm=True)
    facts = []
    if run.warm:
        facts.append(aggregation.facts(run.aggs[0], run.aggs[0].eligible, sensitivity=sensitivity,
                                       step_facts=warm_facts, warm=True))
    for t in range(R):
        agg = run.aggs[int(run.warm) + t]
        facts.append(aggregation.facts(agg, plan.p[t] * agg.eligible.to(plan.p.dtype), sensitivity=sensitivity,
                                       step_facts=step_facts))
    extra = (SUMDOM,) if local and SUMDOM in ACCOUNTANTS else ()
    privacy, note = account_facts(spec, facts, digital, extra=extra)
    names = list(privacy)
    if not names:
        raise OtaflInputError("privacy.accountants is empty: audit-run compares the audit with an accountant")

    # the statistic: fitted on the calibration trials, evaluated on the others
    p_target = [float(plan.p[t][target]) for t in range(R)]
    hidden = audit.scope == "central" and any(p < 1.0 for p in p_target)
    x = {k: transcript_features(v.outputs.cpu().numpy(), c, hidden=hidden) for k, v in runs.items()}
    n_cal = int(N * CALIBRATION)
    if n_cal < 1 or N - n_cal < 2:
        raise OtaflInputError(f"audit.trials = {N} is too few: the calibration share {CALIBRATION} leaves no trial")
    w = discriminant(x[True][:n_cal], x[False][:n_cal])
    score = {k: v[n_cal:] @ w for k, v in x.items()}
    one = len(facts) == 1
    kind, why_not = _fit_kind(spec, audit, p_target, local, digital, len(facts))
    relation = "add" if local else "replace"
    if kind == SAMPLED_FIT:
        fit = sampled_fit(score[True], score[False], p=p_target[0], relation=relation)
        to_epsilon = lambda mu, delta: sampled_epsilon(mu, p_target[0], relation, delta)  # noqa: E731
    else:
        fit = gaussian_fit(score[True], score[False])
        to_epsilon = gdp_epsilon
    fitted = kind != "none"
    cache: dict[float, Any] = {}
    rows: dict[str, dict] = {}
    for name in names:
        res = privacy[name]
        if audit.scope == "central":
            eps, delta = ((res.epsilon_central_per_round[0], res.delta_central) if one
                          else (res.epsilon_central_total, res.delta_central_total))
        else:
            eps, delta = ((res.epsilon_local_per_round[0], res.delta_local) if one
                          else (res.epsilon_local_total, res.delta_local_total))
        eps, delta = float(eps), float(delta)
        if delta not in cache and 0.0 <= delta < 1.0:
            cache[delta] = (empirical_epsilon(score[True], score[False], delta=delta),
                            to_epsilon(fit.mu_lower, delta) if delta > 0 else math.inf)
        emp, gdp = cache.get(delta, (None, None))
        lower = None if emp is None else (gdp if fitted else emp.epsilon_lower)
        reason = "; ".join(r for r in (res.reason, "" if one else res.total_reason) if r)
        rows[name] = {"epsilon": eps, "delta": delta, "unit": res.unit, "reason": reason,
                      "guaranteed": ACCOUNTANTS[name].guaranteed,
                      "epsilon_lower": lower,
                      "epsilon_lower_gdp": gdp,
                      "epsilon_lower_threshold": None if emp is None else emp.epsilon_lower,
                      "epsilon_lower_threshold_ci": None if emp is None else list(emp.ci),
                      "exceeded": bool(lower is not None and lower > eps)}
    main = _main_accountant(spec, names)
    main_row = rows[main]
    main_emp = cache.get(main_row["delta"], (None, None))[0]
    outputs = {k: v.outputs[:, :, c].cpu().numpy() for k, v in runs.items()}
    out = {
        "epsilon_lower": main_row["epsilon_lower"],
        "fit": kind,
        "mu_lower": fit.mu_lower,
        "epsilon_lower_threshold": main_row["epsilon_lower_threshold"],
        "epsilon_lower_threshold_ci": main_row["epsilon_lower_threshold_ci"],
        "delta": main_row["delta"],
        "unit": main_row["unit"],
        "trials": N,
        "rounds": R,
        "transmissions": len(facts),
        "upper": {name: row["epsilon"] for name, row in rows.items()},
        "accountants": rows,
        "main": main,
        "scope": audit.scope,
        "statistic": "linear discriminant of the transcript's canary coordinates"
                     + (" and their noise-normalised values" if hidden and d > 1 else "")
                     + f", fitted on {n_cal} trials per data set, evaluated on {N - n_cal}",
        "test": None if main_emp is None else main_emp.test,
        "meta": {
            "command": "audit-run", "algorithm": tr.algorithm, "aggregation": tr.aggregation,
            "mechanism": digital.mechanism if digital is not None else None, "scheme": spec.sampling.scheme,
            "users": K, "dim": d, "canary": c, "target": target, "target_p": p_target,
            "co_users": audit.co_users, "records": audit.records if local else 1, "curvature": audit.curvature,
            "warm_start": run.warm, "unit_label": UNIT_LABELS.get(main_row["unit"], main_row["unit"]),
            "neighbours": "add/remove (canary or null record)" if local else "replace-one (canary or mirrored canary)",
            "seed": audit.seed, "channel_seed": tr.seed, "confidence": 2 * CONFIDENCE - 1,
            "fit_note": {GDP_FIT: "Gaussian transcripts: their trade-off curve is Gaussian, the fit exact in shape",
                         SAMPLED_FIT: f"the target takes part with p = {p_target[0]:.4g}: fitted in the "
                                      "sampled-Gaussian family, an assumption on the curve's shape "
                                      "(docs/privacy/auditing.md#auditing)",
                         }.get(kind, f"no fit: {why_not}; epsilon_lower is the threshold test's"),
            "gdp_point": fit.point, "discriminant": [float(v) for v in w],
            "mean_present": float(outputs[True].mean()), "mean_absent": float(outputs[False].mean()),
            "var_present": float(outputs[True].var()), "var_absent": float(outputs[False].var()),
            "updates_within_bound": None if not local else
            f"{runs[True].within[0] + runs[False].within[0]}/{runs[True].within[1] + runs[False].within[1]}",
            "privacy_note": note, "wall_seconds": time.perf_counter() - t0,
        },
    }
    if not all(math.isfinite(v) or v == math.inf for v in out["upper"].values()):
        out["meta"]["warning"] = "an accountant returned a non-finite epsilon"
    return out
