"""Monte Carlo audit of the over-the-air round beside each accountant's bound.

Same grid as :func:`otafl.api.bound.bound_grid` (``users x p x sigma2 x clip x snr_db``,
h = 1, sensitivity 2L). For every grid point and accountant, the reported (epsilon,
delta) is checked against the mechanism itself: we draw the server's sufficient
statistics under the worst-case neighbouring pair, evaluate the privacy loss L exactly,
and estimate delta(eps) = E[(1 - e^{eps - L})_+] at the accountant's epsilon, with a
Clopper-Pearson interval (exact binomial interval on the count of L > eps + E,
E ~ Exp(1); see :mod:`otafl.privacy.audit`). A claimed delta below the interval's lower
end is marked ``below``: the claim is contradicted by the audit at that confidence. The
default ``hidden`` adversary is the real threat model (it knows the law of the
participant count, not the count); ``others`` and ``total`` also know the number of
other / of all participants, which is what each of ``exact``'s two conditional bounds
charges.

The draws of a row are taken in batches of :data:`AUDIT_BATCH` (the same stream as one
call of :func:`otafl.privacy.audit.audit_round`), so that a ``progress`` callback can
follow them.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import torch

from otafl.api.bound import bound_grid
from otafl.heap import retained_heap
from otafl.api.defaults import AUDIT_ACCOUNTANTS, AUDIT_SCOPES, DELTA_TOTAL, JSON_NON_FINITE, PAPER_DIM, check_accountants
from otafl.limits import DEFAULT_MAX_DRAWS, MAX_EXACT_INT, check_draws, check_exact_totals
from otafl.device import default_threads
from otafl.errors import OtaflInputError, check_range
from otafl.privacy.audit import ADVERSARIES, audit_round, clopper_pearson
from otafl.privacy.accountants import exact_round, exact_total
from otafl.privacy.accountants.base import reason_text
from otafl.privacy.analysis.count_law import binomial_count_law, local_count_law
from otafl.privacy.analysis.ota_round import RoundSpec
from otafl.privacy.facts import uniform_facts
from otafl.progress import Progress, Tally

__all__ = ["AUDIT_BATCH", "DEFAULT_ACCOUNTANTS", "SCOPES", "audit_grid"]

DEFAULT_ACCOUNTANTS = AUDIT_ACCOUNTANTS
"""All three: the audit is there to compare them."""
SCOPES = AUDIT_SCOPES
AUDIT_BATCH = 1 << 16
"""Monte Carlo draws per call of ``audit_round`` (its chunk: the stream is that of one call)."""
EXACT_PIECE = 16
"""Grid points per call of ``exact_round``."""


def _audit_batches(spec: RoundSpec, eps: torch.Tensor, *, samples: int, generator: torch.Generator, rounds: int,
                   adversary: str, confidence: float, tally: Tally):
    """``audit_round`` in batches of :data:`AUDIT_BATCH` draws (``rounds`` units each on
    ``tally``): (delta, lower, upper, hits), as one call gives them."""
    done, hits, total_y = 0, None, None
    with retained_heap():  # the batches' buffers are reused, not unmapped and faulted in again (otafl/heap.py)
        while done < samples:
            size = min(AUDIT_BATCH, samples - done)
            res = audit_round(spec, eps, samples=size, generator=generator, rounds=rounds, adversary=adversary,
                              confidence=confidence)
            hits = res.hits if hits is None else hits + res.hits
            total_y = res.delta * size if total_y is None else total_y + res.delta * size
            done += size
            tally.advance(rounds)
    lower, upper = clopper_pearson(hits, samples, confidence)
    return total_y / samples, lower, upper, hits


#: Largest K an audit draws for: its participant counts come from a window of ~7 sqrt(K)
#: categories, and torch.multinomial takes at most 2^24 (K = 10^12: 7 10^6).
MAX_AUDIT_USERS = 1e12


def audit_grid(*, users: Sequence[int], p: Sequence[float], sigma2: Sequence[float],
               clip: Sequence[float], snr_db: Sequence[float], accountants: Sequence[str] = DEFAULT_ACCOUNTANTS,
               samples: int, seed: int = 0, delta_l: float = 1e-5, delta_prime: float | str = "auto",
               n0: float = 1.0, dim: int = PAPER_DIM, rounds: int | None = None, scope: str = "central",
               adversary: str = "hidden", confidence: float = 0.95,
               device: str | torch.device = "cpu", max_draws: int = DEFAULT_MAX_DRAWS,
               progress: Progress | None = None, delta_total: float | None = DELTA_TOTAL) -> dict[str, Any]:
    """Accountants' bounds and the Monte Carlo audit on the product grid.

    Parameters
    ----------
    users, p, sigma2, clip, snr_db, delta_l, delta_prime, n0, dim : the grid and the
        constants of :func:`otafl.api.bound.bound_grid` (h = 1; sensitivity 2L).
    accountants : registry names, at least one (``exact`` uses the dimension ``dim``).
    samples : Monte Carlo draws per grid point, scope and horizon (>= 1).
    seed : seed of the one Monte Carlo generator (rows are drawn in row order).
    rounds : T; also audits the totals over T identical rounds (T independent per-round
        losses added), each stated as a run states it: ``paper`` and ``tight`` by
        :func:`otafl.api.bound.bound_grid` (PLD among the compositions), ``exact`` by
        :func:`otafl.privacy.accountants.exact_total`, every one at ``delta_total``.
    delta_total : the one delta of the totals (default :data:`DELTA_TOTAL`; None: each
        accountant's own, the older default).
    scope : ``central``, ``local`` or ``both``.
    adversary : ``hidden``, ``others`` or ``total`` (:data:`otafl.privacy.audit.ADVERSARIES`).
    confidence : level of the two-sided Clopper-Pearson interval, in (0, 1).
    max_draws : refuse (before drawing) an audit of more draws in all than this.
    progress : called with (done, total) as the work goes, ending with (total, total). The
        units: one per grid point and accountant for the bounds (and per scope for
        ``exact``'s totals), then ``rounds`` per batch of :data:`AUDIT_BATCH` draws.

    Returns
    -------
    ``{"rows": [...], "meta": {...}}``: one row per grid point, scope (central / local),
    horizon and accountant with ``users p sigma2 clip snr_db scope rounds accountant epsilon
    delta audit_delta audit_lower audit_upper hits verdict``; ``rounds`` is 1 for the
    per-round bounds, T for the totals. ``verdict``: ``ok`` (claimed delta >= the
    interval's lower end), ``below`` (claimed delta < lower end) or ``inf`` (no finite
    epsilon to audit; the audit columns are then None). ``meta`` holds the inputs.
    """
    accountants = check_accountants(accountants)
    check_range("samples", samples, lo=1)
    check_range("dim", dim, lo=1, hi=MAX_EXACT_INT)
    for value in users:  # the draws pick a count from a window of ~7 sqrt(K) (torch.multinomial: < 2^24)
        check_range("users", value, lo=1, hi=MAX_AUDIT_USERS)
    if "exact" in accountants and users:  # exact's totals state every user of every round
        check_exact_totals(max(users), rounds)
    grid_points = math.prod(len(axis) for axis in (users, p, sigma2, clip, snr_db))
    horizons_n = 1 + (rounds is not None)
    check_draws(f"{grid_points} grid points x {2 if scope == 'both' else 1} scopes x {horizons_n} horizons x "
                f"--samples {samples}", grid_points * (2 if scope == "both" else 1) * horizons_n * samples,
                max_draws)
    if scope not in SCOPES:
        raise OtaflInputError(f"scope = {scope!r} is outside the allowed range {{{', '.join(SCOPES)}}}")
    if adversary not in ADVERSARIES:
        raise OtaflInputError(f"adversary = {adversary!r} is outside the allowed range "
                              f"{{{', '.join(ADVERSARIES)}}}")
    check_range("confidence", confidence, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    default_threads()  # the CLI's thread policy (otafl/device.py)
    device = torch.device(device)
    scopes = ["central", "local"] if scope == "both" else [scope]
    horizons = [1] + ([rounds] if rounds is not None else [])
    batches = -(-samples // AUDIT_BATCH)
    has_exact = "exact" in accountants
    # ``exact`` is computed here (conditional bounds and its own composition), the rest by bound_grid.
    via_bound = [a for a in accountants if a != "exact"]
    G = grid_points
    tally = Tally(progress, G * len(via_bound or ["paper"])
                  + (G * (1 + (rounds is not None) * (1 + (scope != "central"))) if has_exact else 0)
                  + G * len(scopes) * batches * sum(horizons))
    base = bound_grid(users=users, p=p, sigma2=sigma2, clip=clip, snr_db=snr_db,
                      accountants=via_bound or ["paper"], delta_l=delta_l, delta_prime=delta_prime,
                      n0=n0, dim=dim, rounds=rounds, device=device,
                      delta_target=None if rounds is None else delta_total,
                      progress=tally.part(G * len(via_bound or ["paper"])))
    points = list(itertools.product(users, p, sigma2, clip, snr_db))
    by_point: dict[int, dict[str, dict]] = {i: {} for i in range(G)}
    per_acc = {}
    for row in base["rows"]:
        per_acc.setdefault(row["accountant"], []).append(row)
    for name in via_bound:
        for i, row in enumerate(per_acc[name]):
            by_point[i][name] = row
    first = per_acc[via_bound[0] if via_bound else "paper"]
    c = [row["alignment_gain"] for row in first]
    chan = [row["channel_noise_var"] for row in first]
    if has_exact:
        f64 = dict(dtype=torch.float64, device=device)
        ex = {k: [] for k in ("epsilon_central", "delta_central", "epsilon_local", "delta_local", "reason")}
        for lo in range(0, G, EXACT_PIECE):
            piece = points[lo:lo + EXACT_PIECE]
            res = exact_round(participation_prob=torch.tensor([pt[1] for pt in piece], **f64),
                              users=torch.tensor([float(pt[0]) for pt in piece], **f64),
                              noise_var=torch.tensor([pt[2] for pt in piece], **f64),
                              alignment_gain=torch.tensor(c[lo:lo + EXACT_PIECE], **f64), n0=n0,
                              sensitivity=torch.tensor([2.0 * pt[3] for pt in piece], **f64),
                              delta_l=delta_l, dim=dim)
            for k in ex:
                ex[k] += torch.broadcast_to(getattr(res, k), (len(piece),)).tolist()
            ex["reason"][-len(piece):] = [reason_text(code) for code in ex["reason"][-len(piece):]]
            tally.advance(len(piece))
        for i in range(G):
            row = {k: ex[k][i] for k in ex}
            if rounds is not None:
                # exact's totals as a run states them (account_run's rule), at delta_total
                u, pv, sv, lv, _ = points[i]
                facts = [uniform_facts(int(u), pv, sv, c[i], n0, 2.0 * lv, dim, device)] * rounds
                for sc in ["central"] + (["local"] if scope != "central" else []):
                    tot = exact_total(facts, sc, delta_l=delta_l, delta_target=delta_total)
                    row.update({f"epsilon_{sc}_total": tot["epsilon"], f"delta_{sc}_total": tot["delta"]})
                    tally.advance(1)
            by_point[i]["exact"] = row

    gen = torch.Generator(device=device).manual_seed(int(seed))
    out_rows = []
    for i, (u, pv, sv, lv, snr) in enumerate(points):
        one = lambda v: torch.tensor([float(v)], dtype=torch.float64, device=device)  # noqa: E731
        for sc in scopes:
            if sc == "central":
                law = binomial_count_law(one(pv), int(u) - 1, tail_mass=1e-12, block_rel_width=0.0)
                others = sv
            else:
                law, others = local_count_law(1, device=device), 0.0
            spec = RoundSpec(participation_prob=one(pv), own_noise_var=one(sv), others_noise_var=one(others),
                             channel_noise_var=one(chan[i]), half_sensitivity=one(lv), law=law, dim=int(dim))
            for T in horizons:
                names = [a for a in accountants if a in by_point[i]]
                suffix = "" if T == 1 else "_total"
                eps = [by_point[i][a].get(f"epsilon_{sc}{suffix}", math.inf) for a in names]
                dels = [by_point[i][a].get(f"delta_{sc}{suffix}", math.nan) for a in names]
                delta, lower, upper, hits = _audit_batches(
                    spec, torch.tensor(eps, dtype=torch.float64), samples=samples, generator=gen, rounds=T,
                    adversary=adversary, confidence=confidence, tally=tally)
                for j, name in enumerate(names):
                    finite = math.isfinite(eps[j])
                    verdict = "inf" if not finite else ("ok" if dels[j] >= float(lower[j]) else "below")
                    out_rows.append({
                        "users": int(u), "p": pv, "sigma2": sv, "clip": lv, "snr_db": snr, "scope": sc,
                        "rounds": T, "accountant": name, "epsilon": eps[j], "delta": dels[j],
                        "audit_delta": float(delta[j]) if finite else None,
                        "audit_lower": float(lower[j]) if finite else None,
                        "audit_upper": float(upper[j]) if finite else None,
                        "hits": int(hits[j]), "verdict": verdict, "unit": "user",
                        "reason": _reason(by_point[i][names[j]], eps[j], total=T > 1)})
    tally.finish()
    meta = {"command": "audit", "accountants": list(accountants), "samples": samples, "seed": seed,
            "confidence": confidence, "adversary": adversary, "scope": scope, "delta_l": delta_l,
            "delta_prime": delta_prime, "delta_total": delta_total, "n0": n0, "dim": dim, "rounds": rounds, "device": str(device),
            "interval": "Clopper-Pearson on the count of L > eps + Exp(1) draws (exact binomial)",
            "model": "worst-case pair +-L (sensitivity 2L), others' gradients known; h = 1 grid as otafl bound",
            "unit": "user",
            "non_finite": JSON_NON_FINITE}
    return {"rows": out_rows, "meta": meta}


def _reason(bound_row: dict, epsilon: float, *, total: bool) -> str:
    """Why the audited epsilon is +inf or 0 (the bound row's reason; '' for a finite positive one)."""
    if 0.0 < epsilon < math.inf:
        return ""
    why = bound_row.get("total_reason", "") if total else ""
    return why or bound_row.get("reason", "") or ("+inf: no finite bound" if epsilon == math.inf else "")
