"""``otafl calibrate SPEC``: solve one spec value for a target total epsilon, without training.

Parses the options, calls :func:`otafl.api.calibrate.calibrate` and prints the result;
the search itself lives there.
"""

from __future__ import annotations

import json

import click

from otafl.api.calibrate import KNOBS, SCOPES, calibrate as calibrate_spec, calibration_header, write_spec
from otafl.api.defaults import accountant_names
from otafl.cli.options import parse_list, quiet_option
from otafl.progress import progress_bar
from otafl.errors import OtaflInputError
from otafl.report.text import calibration_text


def _knob_help() -> str:
    return "; ".join(f"{name}: {'smallest' if k.prefer == 'min' else 'largest'} feasible"
                     for name, k in KNOBS.items())


@click.command("calibrate")
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("--target-epsilon", "target_epsilon", type=float, required=True,
              help="Target total epsilon over the spec's train.rounds rounds.")
@click.option("--solve", "knob", type=click.Choice(list(KNOBS)), required=True,
              help=f"The spec value to solve for ({_knob_help()}).")
@click.option("--delta-total", "--target-delta", "target_delta", type=float, default=None,
              help="The one delta of the totals the target epsilon is solved at [default: the spec's "
                   "privacy.delta_total, 1e-5 unless set; docs/privacy/composition.md#delta-total].")
@click.option("--accountant", type=click.Choice(accountant_names()), default=None,
              help="Accountant [default: the spec's first privacy.accountants entry].")
@click.option("--scope", type=click.Choice(SCOPES), default="central", show_default=True,
              help="Central DP, or local DP of the worst user.")
@click.option("--grid-points", "grid_points", type=int, default=12, show_default=True,
              help="Bracketing grid size (log grid for sigma2, clip, rounds; linear for p and snr_db in dB).")
@click.option("--range", "value_range", default=None, metavar="LO,HI",
              help="Search range [default per knob: transmit.sigma2 and digital.sigma2 1e-4,1e3; p 0.01,1; "
                   "rounds 1,10T; snr_db -20,40; clip 1e-3,1e2].")
@click.option("--tol", type=float, default=1e-3, show_default=True,
              help="Bisection tolerance: relative for sigma2, clip, rounds; absolute for p and snr_db (dB).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a spec value, e.g. --set train.rounds=100 (repeatable).")
@click.option("--seed", type=int, default=None, help="Override train.seed (the fading and coins drawn).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--write", "write_path", type=click.Path(dir_okay=False), default=None,
              help="Write the calibrated spec (TOML) here.")
@click.option("--overwrite", is_flag=True, help="Let --write replace an existing file.")
@quiet_option
def calibrate(spec, target_epsilon, knob, target_delta, accountant, scope, grid_points, value_range, tol,
              overrides, seed, fmt, write_path, overwrite, quiet):
    """Find the value of one spec knob that meets a total-epsilon target (Opacus'
    get_noise_multiplier, for any of the knobs below).

    Every evaluation is a bounds-only run (no training) of SPEC, so the answer is for the
    spec's seed (its fading and coins). Leakage need not be monotone in the knob: every
    interval of the range where epsilon_total <= target is reported, and the chosen value
    is its least private end (the least noise, the most rounds, the largest p or clip, the
    highest SNR). Exit 2 when no value in the range meets the target.
    """
    from pathlib import Path

    from otafl.config import load_spec

    overrides = list(overrides) + ([f"train.seed={seed}"] if seed is not None else [])
    if target_delta is not None:  # named as the user typed it (the library says target_delta)
        from otafl.errors import check_range

        check_range("--delta-total", target_delta, 0.0, 1.0, lo_open=True, hi_open=True)
    cfg = load_spec(spec, overrides)
    if write_path is not None:
        from otafl.results import output_target

        output_target(write_path, "--write")  # a name over 255 bytes, a device node: refused before the work
    if write_path is not None and Path(write_path).exists() and not overwrite:
        raise OtaflInputError(f"--write {write_path!r} exists; pass --overwrite to replace it")
    bounds = None
    if value_range is not None:
        bounds = parse_list("--range", value_range)
        if len(bounds) != 2:
            raise OtaflInputError(f"--range = {value_range!r} must be two numbers LO,HI")
    with progress_bar("calibrate", quiet=quiet, unit="run") as progress:  # one bounds-only run a step
        result = calibrate_spec(cfg, knob=knob, target_epsilon=target_epsilon, target_delta=target_delta,
                                accountant=accountant, scope=scope, grid_points=grid_points,
                                value_range=bounds, tol=tol, progress=progress)
    if write_path is not None:
        source = (spec or "the default spec") + "".join(f" --set {o}" for o in overrides)
        write_spec(write_path, result.spec, calibration_header(result, source), overwrite=overwrite)
    if fmt == "json":
        click.echo(json.dumps(result.to_json()))
        return
    click.echo(calibration_text(result, grid_points=grid_points, tol=tol), nl=False)
    if write_path is not None:
        click.echo(f"wrote {write_path}")
