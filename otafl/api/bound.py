"""Local and central privacy bounds on a parameter grid, without training.

The grid is the product of ``users x p x sigma2 x clip x snr_db``. Each accountant
evaluates it in chunks of grid points (otafl.privacy), so memory stays bounded by the
chunk and the output rows, and a ``progress`` callback can follow it. With h = 1 (no
channel preset) the alignment gain is the ``min`` policy's value for identical users,

    c = sqrt(P / (L^2 + d sigma^2)),   P = 10^(SNR/10) d N0          (docs/model.md#alignment)

(with N0 = 0 the SNR refers to a unit noise, as in :func:`otafl.transmit.max_power`, and
the channel adds no noise). With a channel preset, T rounds of fading are drawn exactly as
a run of the same spec and seed draws them (:func:`otafl.setup.build_channel`) and the
``min`` policy is taken over the preset's users and SNR groups per round. With ``rounds``
the totals over T rounds are added, composed as a run composes them (``composition`` =
``pld``, the default): ``paper`` and ``tight`` through
:func:`~otafl.privacy.accountants.compose_round_bounds` with PLD (the smallest of basic,
advanced, RDP and PLD at one total delta), ``exact`` through
:func:`~otafl.privacy.accountants.exact_total` (PLD of its rounds' rows, at its own
delta), ``steps`` through its own totals; so ``bound --rounds T --channel PRESET --seed S``
states the totals of ``run_experiment(spec, train=False)`` for that preset, T and seed.
``composition = "rdp"`` keeps the older compositions: the smallest of basic, advanced and
RDP (``exact``: basic and advanced, it has no RDP view). ``digital`` is composed without
PLD in either case (a run composes it by its own run-level PLD, which needs the count law).

Without ``rounds`` a channel preset draws :data:`DEFAULT_CHANNEL_ROUNDS` rounds and reports
the worst of them. Only the round with the largest gain floor B_t is evaluated: every
user is aligned to the same c_t = B_t / sqrt(L^2 + d sigma^2), so rounds differ only in the
channel noise N0 / c_t^2 in gradient units, and a round with more of it is the dominating
round's output plus independent Gaussian noise (post-processing). The dominating round's
bound therefore holds for every round (for ``paper`` and ``tight``, monotone in the channel
noise, it is the maximum over the rounds).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Sequence

import torch

from otafl.api.defaults import DEFAULT_CHANNEL_ROUNDS, DELTA_TOTAL, JSON_NON_FINITE, PAPER_DIM
from otafl.device import default_threads
from otafl.privacy.accountants import (
    REASONS,
    RoundBound,
    compose_round_bounds,
    composition_name,
    exact_total,
    get_accountant,
    reason_text,
)
from otafl.privacy.accountants.registry import STEPS_ACCOUNTANTS
from otafl.privacy.accountants.result import (
    FLAGGED_REASON,
    FLAGGED_REASONS,
    TOTAL_OUT_OF_RANGE,
    ZERO_REASON,
    delta_too_large,
    unreachable_reason,
)
from otafl.privacy.accountants.run import split_share
from otafl.privacy.accountants.steps import steps_totals
from otafl.privacy.analysis.concentration import AutoShare
from otafl.privacy.analysis.composition import COMPOSITIONS as RULES
from otafl.privacy.analysis.steps import COMPOSITIONS
from otafl.privacy.units import unit_of
from otafl.progress import Progress, Tally

__all__ = ["COMPOSITIONS", "DEFAULT_CHANNEL_ROUNDS", "GRID_AXES", "PLD_ACCOUNTANTS", "bound_grid",
           "channel_gain_floor"]

GRID_AXES = ("users", "p", "sigma2", "clip", "snr_db")
"""The axes of the grid, in row order (the last varies fastest)."""

from otafl.api.checks import CHUNK_ELEMENTS, check_bound_grid, check_grid_memory  # noqa: E402

PLD_ACCOUNTANTS = ("paper", "tight")
"""Accountants whose totals :func:`compose_round_bounds` may take by PLD (as ``account_run`` does)."""

SLOW_PIECE = {"exact": 16, "steps": 16, "steps-sumdom": 16}
"""(grid point, round) pairs per call of the slow accountants (progress between calls)."""


def _worst_round(bound: RoundBound) -> RoundBound:
    """Collapse the trailing rounds dimension: worst round for eps/delta, any reason, all flags."""
    def reduce(name: str, value: torch.Tensor) -> torch.Tensor:
        if name == "reason":
            out = torch.zeros_like(value[..., 0])
            for bit in REASONS:
                out = out + ((value & bit) != 0).any(-1).long() * bit
            return out
        if value.dtype == torch.bool:
            return value.all(-1)
        if name in ("central_noise_std", "local_noise_std"):
            return value.amin(-1)
        return value.amax(-1)

    return RoundBound(**{f: None if getattr(bound, f) is None else reduce(f, getattr(bound, f))
                         for f in RoundBound.__dataclass_fields__})


def _evaluate(acc, tally: Tally, piece: int, *, K, pp, s2, L, c, n0, delta_l, delta_prime, dim, share=None, **extra
              ) -> tuple[RoundBound, int]:
    """One accountant on a chunk of grid points [n] and evaluated rounds: fields [n, T].

    The (point, round) pairs are evaluated ``piece`` at a time, each piece but the last
    reported to ``tally`` as it ends; returns the bound and the last piece's size.
    """
    n, t = c.shape
    flat = [v.unsqueeze(-1).expand(n, t).reshape(-1) for v in (K, pp, s2, L)] + [c.reshape(-1)]
    parts, size = [], n * t
    for lo in range(0, size, piece):
        k, pv, sv, lv, cv = (v[lo:lo + piece] for v in flat)
        dp = delta_prime if share is None else AutoShare(share)
        b = acc.bound(participation_prob=pv, users=k, noise_var=sv, sensitivity=2 * lv, alignment_gain=cv, n0=n0,
                      delta_l=delta_l, delta_prime=dp, dim=dim, **extra)
        parts.append({f: None if getattr(b, f) is None else torch.broadcast_to(getattr(b, f), (len(k),))
                      for f in RoundBound.__dataclass_fields__})
        if lo + piece < size:
            tally.advance(piece)
    bound = RoundBound(**{f: None if parts[0][f] is None else torch.cat([pt[f] for pt in parts]).reshape(n, t)
                          for f in RoundBound.__dataclass_fields__})
    return bound, size - (size - 1) // piece * piece


def _exact_totals(*, K, pp, s2, L, c, n0: float, dim: int, rounds: int, delta_l: float,
                  delta_target: float | None) -> dict[str, torch.Tensor]:
    """``exact``'s totals of a chunk of grid points as a run states them (:func:`exact_total`).

    ``c`` [n, t] holds the alignment gain of every round (t = T), or of one round that every
    round repeats (t = 1, h = 1). Returns the fields of :func:`compose_round_bounds` ([n]).
    """
    from otafl.privacy.facts import uniform_facts

    out: dict[str, list] = {}
    for i in range(c.shape[0]):
        facts = [uniform_facts(int(K[i]), float(pp[i]), float(s2[i]), ct, n0, 2.0 * float(L[i]), dim)
                 for ct in c[i].tolist()]
        facts = facts * rounds if len(facts) == 1 else facts
        for kind in ("central", "local"):
            tot = exact_total(facts, kind, delta_l=delta_l, delta_target=delta_target)
            how = RULES.index(tot["composition"]) if tot["composition"] in RULES else -1
            for key, value in ((f"epsilon_{kind}_total", tot["epsilon"]), (f"delta_{kind}_total", tot["delta"]),
                               (f"composition_{kind}", how)):
                out.setdefault(key, []).append(value)
    return {k: torch.tensor(v, dtype=torch.int64 if k.startswith("composition") else torch.float64)
            for k, v in out.items()}


def _rows(name: str, points: list[tuple], bound: RoundBound, totals: dict | None, c_mean, chan_mean, *,
          channel: bool, rounds: int | None, composition: str, max_delta: float | None = None) -> list[dict]:
    """The rows of one accountant on a chunk of grid points (fields [n])."""
    flat = {f: getattr(bound, f).tolist()
            for f in ("epsilon_local", "delta_local", "epsilon_central", "delta_central", "mean_participants",
                      "quantile", "delta_prime", "classic_valid", "classic_valid_local", "reason")}
    if totals is not None:
        flat.update({k: torch.broadcast_to(v, (len(points),)).tolist() for k, v in totals.items()})
    gains, chans = c_mean.tolist(), chan_mean.tolist()
    steps = name in STEPS_ACCOUNTANTS
    rows = []
    for i, (u, pv, sv, lv, snr) in enumerate(points):
        row = {"users": int(u), "p": pv, "sigma2": sv, "clip": lv, "snr_db": None if channel else snr,
               "accountant": name, "epsilon_local": flat["epsilon_local"][i], "delta_local": flat["delta_local"][i],
               "epsilon_central": flat["epsilon_central"][i], "delta_central": flat["delta_central"][i],
               "mean_participants": flat["mean_participants"][i], "quantile": flat["quantile"][i],
               "delta_prime": flat["delta_prime"][i], "alignment_gain": gains[i], "channel_noise_var": chans[i],
               "classic_valid": bool(flat["classic_valid"][i]),
               "classic_valid_local": bool(flat["classic_valid_local"][i]),
               "defined": flat["reason"][i] == 0, "reason": reason_text(flat["reason"][i])}
        if totals is not None:
            row.update({"rounds": rounds,
                        "epsilon_local_total": flat["epsilon_local_total"][i],
                        "delta_local_total": flat["delta_local_total"][i],
                        "epsilon_central_total": flat["epsilon_central_total"][i],
                        "delta_central_total": flat["delta_central_total"][i],
                        "composition": composition if steps else composition_name(int(flat["composition_central"][i])),
                        "composition_local": composition if steps else
                        composition_name(int(flat["composition_local"][i]))})
        row["delta_flagged"] = any(delta_too_large(row.get(k), row["users"], max_delta) for k in (
            "delta_central", "delta_local", "delta_central_total", "delta_local_total"))
        rows.append(row)
    return rows


def channel_gain_floor(channel: str, *, rounds: int, dim: int, seed: int = 0, n0: float | None = None,
                       device: str | torch.device = "cpu") -> tuple[torch.Tensor, dict]:
    """B_t = min_k h_{k,t} sqrt(P_k) of a channel preset, as a run sees it: ([T] float64, info).

    ``channel`` is a preset name (``channels/NAME.toml``) or a TOML path. The spec
    ``{"channel": {"preset": channel, "n0": n0}, "train": {"rounds": rounds, "seed": seed}}``
    (``data.users`` from the preset; ``n0`` None keeps the preset's N0) goes through
    :func:`otafl.setup.build_channel` with the model dimension ``dim``, so h[T, K] is the
    ``fading`` stream of ``seed`` and the groups, budgets P_k = 10^(SNR_k/10) d N0 and
    large-scale gains are the run's. With one L and sigma^2 for every user, the ``min``
    policy's alignment gain of round t is c_t = B_t / sqrt(L^2 + d sigma^2).

    ``info`` describes the channel: ``preset``, ``path``, ``users`` (K) and the resolved
    ``[channel]`` fields (``fading rician_k rho n0 snr_db group_sizes large_scale_gain``).
    """
    from otafl.config import resolve_preset, spec_from_mapping
    from otafl.setup import build_channel

    body: dict[str, Any] = {"preset": str(channel)}
    if n0 is not None:
        body["n0"] = float(n0)
    spec = spec_from_mapping({"channel": body, "train": {"rounds": int(rounds), "seed": int(seed)}})
    plan = build_channel(spec, dim=int(dim), device=device)
    info = {"preset": str(channel), "path": str(resolve_preset(str(channel), None)), "users": spec.data.users,
            **{k: v for k, v in dataclasses.asdict(spec.channel).items() if k != "preset"}}
    return plan.gain_floor.to(torch.float64), info


def bound_grid(*, users: Sequence[int], p: Sequence[float], sigma2: Sequence[float], clip: Sequence[float],
               snr_db: Sequence[float], accountants: Sequence[str], delta_l: float = 1e-5,
               delta_prime: float | str = "auto", n0: float | None = None, dim: int = PAPER_DIM,
               rounds: int | None = None, channel: str | None = None, seed: int = 0,
               delta_target: float | None = DELTA_TOTAL, device: str | torch.device = "cpu", local_steps: int = 1,
               record_sampling: float = 1.0, step_noise: float | None = None, composition: str = "pld",
               user_sampling: str = "revealed", progress: Progress | None = None,
               max_delta: float | None = None) -> dict[str, Any]:
    """Evaluate the accountants on the product grid of the five axes.

    Parameters
    ----------
    users : K values (integers >= 1); empty with ``channel``.
    p : participation probabilities in (0, 1].
    sigma2 : artificial-noise variances per coordinate, >= 0 (gradient units).
    clip : clipping norms L > 0; the sensitivity is Delta = 2 L.
    snr_db : transmit SNRs in dB (h = 1 alignment gain above); empty with ``channel``.
    accountants : registry names (``otafl.privacy.accountants.ACCOUNTANTS``), at least one.
    delta_l : delta of the Gaussian step, in (0, 1).
    delta_prime : the concentration failure probability, in (0, 1), or ``"auto"``.
    n0 : receiver noise variance N0 >= 0 (0: no channel noise). None: 1, or the
        preset's N0 with ``channel``. The ``digital`` accountant ignores it: secure
        aggregation over orthogonal access decodes the sum exactly, with no receiver noise
        (its rows report ``channel_noise_var`` 0).
    dim : model dimension d (number of parameters), default :data:`PAPER_DIM`.
    rounds : T; adds the totals composed over T rounds.
    channel : a channel preset name or TOML path: K, the SNR groups and N0 come from it
        and T = ``rounds`` fading rounds are drawn with ``seed`` as a run draws them
        (:func:`channel_gain_floor`); without ``rounds``, :data:`DEFAULT_CHANNEL_ROUNDS`
        rounds for the per-round worst case (no totals; module docstring).
    delta_target : delta_total, the one delta of every accountant's totals (``--delta-total``,
        default :data:`DELTA_TOTAL`; None: each accountant's own, the older default).
    max_delta : the largest sane delta; a row whose per-round or total delta is above it
        (default 1/K) has ``delta_flagged`` True.
    device : where the tensors live.
    composition : one of :data:`COMPOSITIONS`. ``pld`` (default): the totals as a run
        composes them (module docstring); ``rdp``: without PLD, the smallest of basic,
        advanced and RDP; ``rdp-classic``: ``steps`` only (RDP with the classic conversion).
        ``steps`` composes its S steps and its rounds with it (the ``composition`` column).
    local_steps, record_sampling, step_noise : read by the ``steps`` accountant only (S, q,
        sigma in units of C; docs/privacy/steps.md#steps).
    user_sampling : ``revealed``, the only sound reading of the user coin at record level;
        ``hidden`` is refused (docs/privacy/steps.md#steps-user-sampling). ``step_noise`` None: its FedSGD reading (one step of
        sensitivity 2L with noise sqrt(sigma2)).
    progress : called with (done, total) as the grid is evaluated, ending with (total,
        total); the units are (grid point, evaluated round, accountant) triples.

    Returns
    -------
    ``{"rows": [...], "meta": {...}}``. One row per grid point and accountant (grid order
    users, p, sigma2, clip, snr_db; accountants outer) with ``users p sigma2 clip snr_db
    accountant epsilon_local delta_local epsilon_central delta_central mean_participants
    quantile delta_prime alignment_gain channel_noise_var classic_valid classic_valid_local
    defined reason`` and, with ``rounds``, ``rounds epsilon_local_total delta_local_total
    epsilon_central_total delta_central_total composition composition_local``. Undefined
    bounds are +inf with ``defined`` False and a ``reason``. With ``channel``, ``snr_db``
    is None, each row reports the worst round, and ``alignment_gain`` (c_t) and
    ``channel_noise_var`` (N0 / c_t^2) are means over the drawn rounds. ``meta`` holds the
    inputs, the accountants, the number of points and the channel description (with
    ``fading_rounds`` drawn, ``evaluated_rounds`` and, without ``rounds``, the index of the
    ``worst_round``).
    """
    default_threads()  # the CLI's thread policy (otafl/device.py)
    device = torch.device(device)
    accountants = check_bound_grid(users=users, p=p, sigma2=sigma2, clip=clip, snr_db=snr_db, accountants=accountants,
                                   delta_l=delta_l, delta_prime=delta_prime, n0=n0, dim=dim, rounds=rounds,
                                   channel=channel, delta_target=delta_target, composition=composition,
                                   user_sampling=user_sampling, max_delta=max_delta, local_steps=local_steps,
                                   record_sampling=record_sampling, step_noise=step_noise)
    from otafl.limits import memory_limit_bytes
    from otafl.privacy.analysis.pld import set_memory_budget, take_notes

    take_notes()  # forget notes of earlier calls in this process
    set_memory_budget(memory_limit_bytes())  # caps the steps accountant's PLDs
    accs = [get_accountant(a) for a in accountants]
    share = split_share(delta_prime, delta_target, rounds) if rounds is not None else None  # auto delta' per round
    f64 = dict(dtype=torch.float64, device=device)
    steps_kwargs = dict(local_steps=local_steps, record_sampling=record_sampling, step_noise=step_noise,
                        composition=composition)

    info = None
    if channel is not None:
        drawn = rounds if rounds is not None else DEFAULT_CHANNEL_ROUNDS
        floor, info = channel_gain_floor(channel, rounds=drawn, dim=int(dim), seed=seed, n0=n0, device=device)
        n0 = float(info["n0"])
        users, snr_db = [int(info["users"])], [math.nan]
        # With --rounds every round is evaluated (the totals compose them); without, only the
        # round of the largest gain floor: it dominates every other round (module docstring).
        worst = int(torch.argmax(floor))
        evaluated = floor if rounds is not None else floor[worst:worst + 1]
        info = {**info, "fading_rounds": drawn, "evaluated_rounds": int(evaluated.numel()),
                "worst_round": None if rounds is not None else worst}
    else:
        n0 = 1.0 if n0 is None else n0
    t_eval = 1 if info is None else int(evaluated.numel())
    # without a channel, checked with the other inputs (check_bound_grid); with one, now that T is known
    chunk = check_grid_memory(users=users, p=p, sigma2=sigma2, clip=clip, snr_db=snr_db, accountants=accountants,
                              delta_prime=delta_prime, rounds=rounds, evaluated_rounds=t_eval, n0=n0,
                              chunk_elements=CHUNK_ELEMENTS)
    shape = (len(users), len(p), len(sigma2), len(clip), len(snr_db))
    points = math.prod(shape)

    axes = [torch.tensor([float(v) for v in values], **f64) for values in (users, p, sigma2, clip)]
    if info is None:
        from otafl.transmit import max_power

        power = max_power(torch.tensor([float(v) for v in snr_db], dtype=torch.float64), int(dim), n0).to(device)
    else:
        floor = floor.to(device)
        evaluated = evaluated.to(device)
        inv_floor2 = (1.0 / (floor * floor)).mean()
    tally = Tally(progress, points * t_eval * len(accs))
    point_list = list(itertools.product(users, p, sigma2, clip, snr_db))
    rows = []
    for acc in accs:
        piece = SLOW_PIECE.get(acc.name, CHUNK_ELEMENTS)
        for start in range(0, points, chunk):
            stop = min(points, start + chunk)
            idx, coords = torch.arange(start, stop, device=device), []
            for size in reversed(shape):
                coords.append(idx % size)
                idx = idx // size
            iu, ip, i2, il, isnr = reversed(coords)
            K, pp, s2, L = axes[0][iu], axes[1][ip], axes[2][i2], axes[3][il]
            if info is None:
                c = torch.sqrt(power[isnr] / (L * L + dim * s2))
                c_eval, c_mean = c.unsqueeze(-1), c
                chan_mean = torch.zeros_like(c) if n0 == 0.0 else n0 / (c * c)
            else:
                norm = torch.sqrt(L * L + dim * s2)
                c_eval = evaluated.unsqueeze(0) / norm.unsqueeze(-1)
                c_mean = floor.mean() / norm
                chan_mean = torch.zeros_like(norm) if n0 == 0.0 else n0 * (L * L + dim * s2) * inv_floor2
            if acc.name == "digital":  # secure aggregation over orthogonal access: no receiver noise in the sum
                chan_mean = torch.zeros_like(chan_mean)
            steps = acc.name in STEPS_ACCOUNTANTS
            per_round, held = _evaluate(acc, tally, piece, K=K, pp=pp, s2=s2, L=L, c=c_eval,
                                        n0=0.0 if acc.name == "digital" else n0, delta_l=delta_l,
                                        delta_prime=share if steps and share is not None else delta_prime,
                                        share=share if acc.name in PLD_ACCOUNTANTS else None, dim=int(dim),
                                        **(steps_kwargs if acc.name in STEPS_ACCOUNTANTS else {}))
            bound = _worst_round(per_round)
            totals = None
            if rounds is not None and acc.name in STEPS_ACCOUNTANTS:  # the rounds' mechanisms composed (channel-free)
                totals = steps_totals(participation_prob=pp, users=K, noise_var=s2, sensitivity=2 * L,
                                      delta_l=delta_l, rounds=rounds,
                                      delta_prime=delta_prime if share is None else share, delta_target=delta_target, credit=STEPS_ACCOUNTANTS[acc.name], **steps_kwargs)
            elif rounds is not None and acc.name == "exact" and composition == "pld":  # as account_run
                totals = _exact_totals(K=K, pp=pp, s2=s2, L=L, c=c_eval, n0=n0, dim=int(dim), rounds=rounds,
                                       delta_l=delta_l, delta_target=delta_target)
            elif rounds is not None:
                over_rounds = per_round if info is not None else RoundBound(**{
                    f: None if getattr(per_round, f) is None else getattr(per_round, f).expand(-1, rounds)
                    for f in RoundBound.__dataclass_fields__})
                pld = composition == "pld" and acc.name in PLD_ACCOUNTANTS
                revealed = pp.unsqueeze(-1).expand(-1, rounds) if pld and acc.name == "tight" else None
                totals = compose_round_bounds(over_rounds, delta_target=delta_target, delta_slack=delta_l,
                                              pld=pld, local_revealed_rate=revealed)
            rows.extend(_rows(acc.name, point_list[start:stop], bound, totals, c_mean, chan_mean,
                              channel=info is not None, rounds=rounds, composition=composition, max_delta=max_delta))
            tally.advance(held)  # the last piece counts once its totals and rows are done
    tally.finish()
    meta = {
        "command": "bound", "accountants": [a.name for a in accs], "grid": dict(zip(GRID_AXES, (
            list(users), list(p), list(sigma2), list(clip), None if info is not None else list(snr_db)))),
        "points": points, "delta_l": delta_l, "delta_prime": delta_prime, "n0": n0, "dim": int(dim),
        "rounds": rounds, "delta_target": delta_target, "delta_total": delta_target, "max_delta": max_delta,
        "delta_limit": "1/K" if max_delta is None else max_delta, "composition": composition, "sensitivity": "2 * clip",
        "alignment": (f"min policy over the preset's users, per fading round drawn as a run of the same spec and "
                      f"seed draws it ({info['fading_rounds']} rounds: --rounds, or {DEFAULT_CHANNEL_ROUNDS} "
                      f"without; rows: the worst round, "
                      + ("over every round" if rounds is not None else
                         "the round of the largest gain, which dominates the others")
                      + "; alignment_gain and channel_noise_var are means over the rounds)") if info is not None else
                     "h = 1: c = sqrt(P / (L^2 + d sigma^2)), P = 10^(snr_db/10) d N0 (N0 = 1 reference if N0 = 0)",
        "channel": info, "seed": seed if info is not None else None, "device": str(device),
        **({"steps": {**steps_kwargs, "sensitivity": "record_clip C (step_noise in units of C)" if step_noise
                      is not None else "2 * clip (FedSGD reading)"}}
           if any(a.name in STEPS_ACCOUNTANTS for a in accs) else {}),
        "reasons": {str(k): v for k, v in REASONS.items()},
        "non_finite": f"{JSON_NON_FINITE} (see defined/reason)",
    }
    from otafl.privacy.analysis.pld import take_notes

    notes = take_notes()  # e.g. a steps composition too large for a PLD, composed with rdp
    if notes:
        meta["notes"] = notes
    meta["units"] = {a.name: unit_of(a.name, local_steps=step_noise is not None) for a in accs}
    for row in rows:
        _explain(row, meta["units"][row["accountant"]], delta_target)
    return {"rows": rows, "meta": meta}


def _explain(row: dict, unit: str, delta_target: float | None) -> None:
    """Name the row's privacy unit and give every 0 and +inf its reason (in place): a per-round
    0 adds :data:`ZERO_REASON` to ``reason``; ``total_reason`` explains a +inf or 0 total."""
    row["unit"] = unit
    if row["epsilon_central"] == 0.0 or row["epsilon_local"] == 0.0:
        row["reason"] = "; ".join(r for r in (row["reason"], ZERO_REASON) if r)
    if not (row["classic_valid"] and row["classic_valid_local"]):
        flag = FLAGGED_REASONS.get(row["accountant"], FLAGGED_REASON)
        row["reason"] = "; ".join(r for r in (row["reason"], flag) if r)
    if "epsilon_central_total" not in row:
        return
    why = []
    totals = (row["epsilon_central_total"], row["epsilon_local_total"])
    if math.inf in totals:
        if math.inf in (row["epsilon_central"], row["epsilon_local"]):
            why.append("total +inf: some round's epsilon is +inf (see reason)")
        elif delta_target is not None and row["rounds"] * row["delta_prime"] >= delta_target:
            why.append(unreachable_reason("central", row["rounds"] * row["delta_prime"], delta_target,
                                          "per-round tails (T delta' or count tails)"))
        else:
            why.append(TOTAL_OUT_OF_RANGE.format(delta=row["delta_central_total"]))
    if 0.0 in totals:
        why.append("total " + ZERO_REASON)
    row["total_reason"] = "; ".join(why)
