"""``otafl bound``: local and central privacy bounds on a parameter grid, without training.

Parses the options and calls :func:`otafl.api.bound.bound_grid` (the grid, the h = 1
alignment gain, ``--channel`` fading drawn as a run draws it, ``--rounds`` totals) with a
progress bar on stderr (:func:`otafl.progress.progress_bar`); prints with
:func:`otafl.report.text.bound_text`, CSV or JSON.
"""

from __future__ import annotations

import click

from otafl.api.defaults import DEFAULT_CHANNEL_ROUNDS, PAPER_DIM
from otafl.cli.options import (accountant_list, accountant_option, delta_options, echo_result, grid_options,
                               max_delta_option, delta_total_option, output_options, parse_delta_prime,
                               parse_list, quiet_option)
from otafl.errors import OtaflInputError, check_range
from otafl.privacy.names import COMPOSITIONS, USER_SAMPLING
from otafl.progress import progress_bar
from otafl.report.text import bound_text


@click.command("bound")
@grid_options
@delta_options(delta_l_help="delta of the Gaussian step.",
               delta_prime_help="Concentration failure probability: a number in (0, 1) or auto = "
                                "2 exp(-2 mu^2/K) + 1e-5.")
@click.option("--n0", type=float, default=None, help="Receiver noise variance N0; 0 = no channel noise [default: 1, "
                                                     "or the channel preset's]. The digital accountant "
                                                     "ignores it: secure aggregation over orthogonal access "
                                                     "adds no receiver noise to the sum.")
@click.option("--dim", type=int, default=PAPER_DIM, show_default=True,
              help="Model dimension d (number of parameters; sets P = 10^(SNR/10) d N0).")
@accountant_option(default=("exact",),
                   help="Accountant(s), repeatable or comma-separated. exact is the sharpest and slowest "
                        "(~0.1 s per grid point); paper and tight are closed forms.")
@click.option("--rounds", type=int, default=None,
              help="Also compose over T rounds, as a run of the same spec composes them (see --composition); "
                   "with --channel, draw exactly T fading rounds.")
@delta_total_option()
@max_delta_option()
@click.option("--channel", default=None, metavar="PRESET",
              help="Channel preset (name in channels/ or a TOML path): draw fading rounds as `otafl run` "
                   "does for the same preset and seed, instead of h = 1, and report the worst round: T = "
                   f"--rounds rounds, or {DEFAULT_CHANNEL_ROUNDS} without --rounds (per-round bounds only; the "
                   "totals need --rounds).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the run whose fading is drawn (train.seed; --channel).")
@click.option("--local-steps", "local_steps", type=int, default=1, show_default=True,
              help="steps accountant: S, local DP-SGD steps per round.")
@click.option("--record-sampling", "record_sampling", type=float, default=1.0, show_default=True,
              help="steps accountant: q, Poisson rate of a record per local step, in (0, 1].")
@click.option("--step-noise", "step_noise", type=float, default=None,
              help="steps accountant: sigma, one user's noise per step in units of the clip C [default: none, "
                   "the FedSGD reading: one step, noise sqrt(sigma2), sensitivity 2L].")
@click.option("--composition", type=click.Choice(COMPOSITIONS), default="pld", show_default=True,
              help="How the totals compose. pld: as runs do (paper, tight: the smallest of basic, advanced, RDP "
                   "and PLD; exact: PLD of its rounds at its own delta; steps: PLD). rdp: the older "
                   "compositions, without PLD (paper, tight: basic, advanced or RDP; exact: basic or advanced; "
                   "steps: RDP, improved conversion). rdp-classic: steps only, RDP with the classic conversion "
                   "eps = rdp + log(1/delta)/(alpha - 1).")
@click.option("--user-sampling", "user_sampling", type=click.Choice(USER_SAMPLING), default="revealed",
              show_default=True, help="steps accountant: the user coin is revealed (a user's absence is "
                                      "visible at record level); 'hidden' is refused "
                                      "(docs/privacy/steps.md#steps-user-sampling).")
@output_options
@quiet_option
@click.pass_context
def bound(ctx, users, p, sigma2, clip, snr_db, delta_l, delta_prime, n0, dim, accountant, rounds, delta_total, max_delta,
          channel, seed, local_steps, record_sampling, step_noise, composition, user_sampling, fmt, device, quiet):
    """Per-round local and central DP bounds (and totals with --rounds) on a grid, no training."""
    from otafl.api.checks import check_bound_grid

    explicit = {name for name in ("users", "snr_db")
                if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    if channel is not None and explicit:
        raise OtaflInputError("--users and --snr-db come from the channel preset; leave them out with --channel")
    # the totals' delta matters with --rounds only: given without it, it is refused (one line)
    if rounds is None and ctx.get_parameter_source("delta_total") is not click.core.ParameterSource.DEFAULT:
        check_range("delta_total", delta_total, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        raise OtaflInputError(f"--delta-total = {delta_total!r} sets the total delta of the composed totals; "
                              "give rounds (--rounds T) too")
    grid = dict(users=[] if channel else parse_list("users", users, int), p=parse_list("p", p),
                sigma2=parse_list("sigma2", sigma2), clip=parse_list("clip", clip),
                snr_db=[] if channel else parse_list("snr_db", snr_db), accountants=accountant_list(accountant),
                delta_l=delta_l, delta_prime=parse_delta_prime(delta_prime), n0=n0, dim=dim, rounds=rounds,
                channel=channel, delta_target=delta_total, max_delta=max_delta, composition=composition,
                user_sampling=user_sampling)
    steps = dict(local_steps=local_steps, record_sampling=record_sampling, step_noise=step_noise)
    check_bound_grid(**grid, **steps)  # a bad value is refused before torch loads

    from otafl.api.bound import bound_grid
    from otafl.device import resolve_device

    with progress_bar("bound", quiet=quiet, unit="pt") as progress:
        result = bound_grid(**grid, **steps, seed=seed, device=resolve_device(device), progress=progress)
    echo_result(result, fmt, bound_text)
    for note in result["meta"].get("notes", []):
        click.echo(f"note: {note}", err=True)
