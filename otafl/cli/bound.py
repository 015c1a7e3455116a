"""``otafl bound``: local and central privacy bounds on a parameter grid, without training.

The grid is the product of ``--users --p --sigma2 --clip --snr-db`` (each a comma list);
every accountant evaluates the whole grid in one batched call (otafl.privacy). With
h = 1 (the default) the alignment gain is the ``min`` policy's value for identical users,

    c = sqrt(P / (L^2 + d sigma^2)),   P = 10^(SNR/10) d N0          (system-model.md)

(with N0 = 0 the SNR refers to a unit noise, as in :func:`otafl.transmit.max_power`, and
the channel adds no noise). ``--channel PRESET`` draws T rounds of fading from a channel
preset instead and takes the ``min`` policy over the preset's users and SNR groups per
round. ``--rounds T`` adds the totals over T rounds (smallest of basic, advanced, RDP).

:func:`bound_grid` is the library entry point (the command only parses options).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import click
import torch

from otafl.cli.options import (CommaChoice, delta_options, echo_result, grid_options, output_options,
                               parse_delta_prime, parse_list)
from otafl.device import resolve_device
from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants import (
    ACCOUNTANTS,
    REASONS,
    RoundBound,
    compose_round_bounds,
    composition_name,
    get_accountant,
    reason_text,
)

DEFAULT_DIM = 7850
"""Model dimension of the paper's single-layer MNIST model (784 x 10 weights + 10 biases)."""

GRID_AXES = ("users", "p", "sigma2", "clip", "snr_db")


def _map_fields(bound: RoundBound, fn) -> RoundBound:
    return RoundBound(**{f: None if getattr(bound, f) is None else fn(getattr(bound, f))
                         for f in RoundBound.__dataclass_fields__})


def _worst_round(bound: RoundBound) -> RoundBound:
    """Collapse a leading rounds dimension: worst round for eps/delta, any reason, all flags."""
    def reduce(name: str, value: torch.Tensor) -> torch.Tensor:
        if name == "reason":
            out = torch.zeros_like(value[0])
            for bit in REASONS:
                out = out + ((value & bit) != 0).any(0).long() * bit
            return out
        if value.dtype == torch.bool:
            return value.all(0)
        if name in ("central_noise_std", "local_noise_std"):
            return value.amin(0)
        return value.amax(0)

    return RoundBound(**{f: None if getattr(bound, f) is None else reduce(f, getattr(bound, f))
                         for f in RoundBound.__dataclass_fields__})


def _load_channel(name: str, n0: float | None) -> dict:
    from otafl.config import load_preset, resolve_preset

    path = resolve_preset(name, None)
    preset = load_preset(path)
    for key in ("users", "snr_db", "fading"):
        if key not in preset:
            raise OtaflInputError(f"channel preset {str(path)!r} has no {key!r}")
    preset["path"] = str(path)
    if n0 is not None:
        preset["n0"] = n0
    preset.setdefault("n0", 1.0)
    preset.setdefault("rician_k", 0.0)
    preset.setdefault("rho", 0.0)
    return preset


def _channel_gain_floor(preset: dict, *, rounds: int, dim: int, seed: int, device: torch.device) -> torch.Tensor:
    """B_t = min_k h_{k,t} sqrt(P_k) for T fading draws: [T] float64.

    The ``min`` alignment policy gives c_t = min_k h_k sqrt(P_k / (L^2 + d sigma^2)); with
    the same L and sigma^2 for every user (one grid point) this is B_t / sqrt(L^2 + d sigma^2).
    """
    from otafl.channel.fading import make_fading
    from otafl.transmit import alignment_bound, assign_groups, max_power

    users = int(preset["users"])
    snr = [float(v) for v in preset["snr_db"]]
    group = assign_groups(users, preset.get("group_sizes"), len(snr))
    snr_user = torch.tensor(snr, dtype=torch.float64)[group]
    power = max_power(snr_user, dim, float(preset["n0"])).to(device)
    gain = torch.as_tensor(preset.get("large_scale_gain", [1.0] * users), dtype=torch.float64, device=device)
    if gain.numel() == 1:
        gain = gain.expand(users).clone()
    fading = make_fading(str(preset["fading"]), rician_k=float(preset["rician_k"]), rho=float(preset["rho"]))
    generator = torch.Generator(device=device).manual_seed(int(seed))
    h = fading.sample(rounds, gain, generator)
    return alignment_bound(h, power, 1.0, torch.zeros(users, dtype=torch.float64, device=device), dim).amin(-1)


def bound_grid(*, users: Sequence[int], p: Sequence[float], sigma2: Sequence[float], clip: Sequence[float],
               snr_db: Sequence[float], accountants: Sequence[str], delta_l: float = 1e-5,
               delta_prime: float | str = "auto", n0: float = 1.0, dim: int = DEFAULT_DIM,
               rounds: int | None = None, channel: str | None = None, seed: int = 0,
               delta_target: float | None = None, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Evaluate the accountants on the product grid; return ``{"rows": [...], "meta": {...}}``.

    One row per grid point and accountant (grid order: users, p, sigma2, clip, snr_db),
    with ``users p sigma2 clip snr_db accountant epsilon_local delta_local epsilon_central
    delta_central mean_participants quantile delta_prime alignment_gain channel_noise_var
    classic_valid classic_valid_local defined reason`` and, with ``rounds``,
    ``rounds epsilon_local_total delta_local_total epsilon_central_total
    delta_central_total composition composition_local``. Sensitivity Delta = 2 L.

    With ``channel`` (a preset name or path) the preset fixes K, the SNR groups and N0
    (``n0`` overrides the preset's N0 when given); ``users`` and ``snr_db`` must then be
    empty. T = ``rounds`` (or 1) fading rounds are drawn with ``seed``; each row reports the
    worst round, and ``alignment_gain`` / ``channel_noise_var`` are means over the rounds.
    """
    device = torch.device(device)
    for value in p:
        check_range("p", value, lo=0.0, hi=1.0, lo_open=True)
    for value in sigma2:
        check_range("sigma2", value, lo=0.0)
    for value in clip:
        check_range("clip", value, lo=0.0, lo_open=True)
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if not isinstance(delta_prime, str):
        check_range("delta_prime", delta_prime, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    elif delta_prime != "auto":
        raise OtaflInputError(f"delta_prime = {delta_prime!r} is outside the allowed range (0, 1) or 'auto'")
    if delta_target is not None:
        check_range("delta_target", delta_target, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    check_range("dim", dim, lo=1)
    if rounds is not None:
        check_range("rounds", rounds, lo=1)
    accs = [get_accountant(a) for a in accountants]
    f64 = dict(dtype=torch.float64, device=device)

    preset = None
    if channel is not None:
        if users or snr_db:
            raise OtaflInputError("--users and --snr-db come from the channel preset; leave them out with --channel")
        preset = _load_channel(channel, n0)
        n0 = float(preset["n0"])
        users, snr_db = [int(preset["users"])], [math.nan]
    for value in users:
        check_range("users", value, lo=1)
    check_range("n0", n0, lo=0.0)

    shape = (len(users), len(p), len(sigma2), len(clip), len(snr_db))

    def axis(values, i):
        view = [1] * 5
        view[i] = -1
        return torch.tensor([float(v) for v in values], **f64).view(view)

    K, pp, s2, L = axis(users, 0), axis(p, 1), axis(sigma2, 2), axis(clip, 3)
    if preset is None:
        from otafl.transmit import max_power

        power = max_power(torch.tensor([float(v) for v in snr_db], dtype=torch.float64), int(dim), n0).to(device)
        c = torch.sqrt(power.view(1, 1, 1, 1, -1) / (L * L + dim * s2))
        T = None
    else:
        T = rounds or 1
        floor = _channel_gain_floor(preset, rounds=T, dim=int(dim), seed=seed, device=device)
        c = floor.view(T, 1, 1, 1, 1, 1) / torch.sqrt(L * L + dim * s2)

    rows_by_acc = {}
    for acc in accs:
        bound = acc.bound(participation_prob=pp, users=K, noise_var=s2, sensitivity=2 * L, alignment_gain=c,
                          n0=n0, delta_l=delta_l, delta_prime=delta_prime, dim=int(dim))
        if T is not None:
            per_round = bound
            bound = _worst_round(per_round)
            over_rounds = _map_fields(per_round, lambda v: torch.movedim(v, 0, -1))
        elif rounds is not None:
            over_rounds = _map_fields(bound, lambda v: v.unsqueeze(-1).expand(*v.shape, rounds))
        totals = None
        if rounds is not None:
            totals = compose_round_bounds(over_rounds, delta_target=delta_target, delta_slack=delta_l)
        rows_by_acc[acc.name] = (bound, totals)

    c_grid = torch.broadcast_to(c.mean(0) if T is not None else c, shape)
    chan = torch.where(torch.tensor(n0 == 0.0, device=device), torch.zeros_like(c), n0 / (c * c))
    chan_grid = torch.broadcast_to(chan.mean(0) if T is not None else chan, shape)
    columns = {"alignment_gain": c_grid.reshape(-1).tolist(), "channel_noise_var": chan_grid.reshape(-1).tolist()}
    points = list(itertools.product(users, p, sigma2, clip, snr_db))
    rows = []
    for name, (bound, totals) in rows_by_acc.items():
        flat = {f: torch.broadcast_to(getattr(bound, f), shape).reshape(-1).tolist()
                for f in ("epsilon_local", "delta_local", "epsilon_central", "delta_central", "mean_participants",
                          "quantile", "delta_prime", "classic_valid", "classic_valid_local", "reason")}
        if totals is not None:
            flat.update({k: torch.broadcast_to(v, shape).reshape(-1).tolist() for k, v in totals.items()})
        for i, (u, pv, sv, lv, snr) in enumerate(points):
            row = {"users": int(u), "p": pv, "sigma2": sv, "clip": lv,
                   "snr_db": None if preset is not None else snr, "accountant": name,
                   "epsilon_local": flat["epsilon_local"][i], "delta_local": flat["delta_local"][i],
                   "epsilon_central": flat["epsilon_central"][i], "delta_central": flat["delta_central"][i],
                   "mean_participants": flat["mean_participants"][i], "quantile": flat["quantile"][i],
                   "delta_prime": flat["delta_prime"][i], "alignment_gain": columns["alignment_gain"][i],
                   "channel_noise_var": columns["channel_noise_var"][i],
                   "classic_valid": bool(flat["classic_valid"][i]),
                   "classic_valid_local": bool(flat["classic_valid_local"][i]),
                   "defined": flat["reason"][i] == 0, "reason": reason_text(flat["reason"][i])}
            if totals is not None:
                row.update({"rounds": rounds,
                            "epsilon_local_total": flat["epsilon_local_total"][i],
                            "delta_local_total": flat["delta_local_total"][i],
                            "epsilon_central_total": flat["epsilon_central_total"][i],
                            "delta_central_total": flat["delta_central_total"][i],
                            "composition": composition_name(int(flat["composition_central"][i])),
                            "composition_local": composition_name(int(flat["composition_local"][i]))})
            rows.append(row)
    meta = {
        "command": "bound", "accountants": [a.name for a in accs], "grid": dict(zip(GRID_AXES, (
            list(users), list(p), list(sigma2), list(clip), None if preset is not None else list(snr_db)))),
        "points": math.prod(shape), "delta_l": delta_l, "delta_prime": delta_prime, "n0": n0, "dim": int(dim),
        "rounds": rounds, "delta_target": delta_target, "sensitivity": "2 * clip",
        "alignment": ("min policy over the preset's users, per fading round (rows: worst round; alignment_gain "
                      "and channel_noise_var are means over rounds)") if preset is not None else
                     "h = 1: c = sqrt(P / (L^2 + d sigma^2)), P = 10^(snr_db/10) d N0 (N0 = 1 reference if N0 = 0)",
        "channel": None if preset is None else {k: v for k, v in preset.items() if k != "description"},
        "seed": seed if preset is not None else None, "device": str(device),
        "reasons": {str(k): v for k, v in REASONS.items()},
        "non_finite": "JSON writes +inf as null (see defined/reason)",
    }
    return {"rows": rows, "meta": meta}


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "inf" if value == math.inf else f"{value:.4g}"
    return "" if value is None else str(value)


def render_table(result: dict) -> str:
    """One line per grid point; the accountants side by side (epsilon columns)."""
    rows, meta = result["rows"], result["meta"]
    names = meta["accountants"]
    with_totals = meta["rounds"] is not None
    keys = ("users", "p", "sigma2", "clip", "snr_db")
    grid: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        grid.setdefault(tuple(row[k] for k in keys), {})[row["accountant"]] = row
    header = ["users", "p", "sigma2", "clip"] + ([] if meta["channel"] else ["snr_db"]) + ["mu"]
    for name in names:
        header += [f"{name}:eps_local", f"{name}:eps_central"] + ([f"{name}:eps_central_total"] if with_totals else [])
    lines, notes = [header], set()
    for point, by_acc in grid.items():
        first = by_acc[names[0]]
        line = [_fmt(v) for v in point[:4]] + ([] if meta["channel"] else [_fmt(point[4])])
        line.append(_fmt(first["mean_participants"]))
        for name in names:
            row = by_acc[name]
            mark = mark_l = ""
            if name == "paper" and row["defined"] and not row["classic_valid"]:
                mark, _ = "!", notes.add("!")
            if name == "paper" and row["epsilon_local"] > 0 and not row["classic_valid_local"]:
                mark_l, _ = "?", notes.add("?")
            if not row["defined"]:
                notes.add(row["reason"])
            cells = [row["epsilon_local"], row["epsilon_central"]] + ([row["epsilon_central_total"]] if with_totals else [])
            line += [_fmt(cells[0]) + mark_l, _fmt(cells[1]) + mark] + [_fmt(v) for v in cells[2:]]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines) + "\n"
    legend = []
    if "!" in notes:
        legend.append("! paper's classic Gaussian step is outside its validity range (eps_0 > 1): the classic "
                      "formula can understate the leakage there; compare with tight")
    if "?" in notes:
        legend.append("? paper's local epsilon is not a guaranteed bound: it is amplified by sampling with p < 1 "
                      "(the server can tell from the received energy who transmitted) or its classic step has "
                      "eps_0 > 1; tight's local epsilon is not amplified and holds")
    legend += [f"inf: {r}" for r in sorted(n for n in notes if n not in ("!", "?"))]
    return text + "".join(f"{line}\n" for line in legend)


@click.command("bound")
@grid_options
@delta_options(delta_l_help="delta of the Gaussian step.",
               delta_prime_help="Concentration failure probability: a number in (0, 1) or auto = "
                                "2 exp(-2 mu^2/K) + 1e-5.")
@click.option("--n0", type=float, default=None, help="Receiver noise variance N0; 0 = no channel noise [default: 1, "
                                                     "or the channel preset's].")
@click.option("--dim", type=int, default=DEFAULT_DIM, show_default=True, help="Model dimension d.")
@click.option("--accountant", "accountant", type=CommaChoice(sorted(ACCOUNTANTS)), multiple=True,
              default=("paper",), show_default=True, help="Accountant(s), repeatable or comma-separated.")
@click.option("--rounds", type=int, default=None, help="Also compose over T rounds (basic/advanced/RDP).")
@click.option("--delta-target", "delta_target", type=float, default=None,
              help="Total delta of the composed totals [default: basic composition's delta + delta_l].")
@click.option("--channel", default=None, metavar="PRESET",
              help="Channel preset (name in channels/ or a TOML path): draw fading instead of h = 1.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the fading draw (--channel).")
@output_options
@click.pass_context
def bound(ctx, users, p, sigma2, clip, snr_db, delta_l, delta_prime, n0, dim, accountant, rounds, delta_target,
          channel, seed, fmt, device):
    """Per-round local and central DP bounds (and totals with --rounds) on a grid, no training."""
    explicit = {name for name in ("users", "snr_db")
                if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    if channel is not None and explicit:
        raise OtaflInputError("--users and --snr-db come from the channel preset; leave them out with --channel")
    names = list(dict.fromkeys(a for group in accountant for a in (group if isinstance(group, tuple) else (group,))))
    result = bound_grid(
        users=[] if channel else parse_list("users", users, int), p=parse_list("p", p),
        sigma2=parse_list("sigma2", sigma2), clip=parse_list("clip", clip),
        snr_db=[] if channel else parse_list("snr_db", snr_db), accountants=names, delta_l=delta_l,
        delta_prime=parse_delta_prime(delta_prime), n0=(1.0 if n0 is None and channel is None else n0), dim=dim,
        rounds=rounds, channel=channel, seed=seed, delta_target=delta_target, device=resolve_device(device))
    echo_result(result, fmt, render_table)
