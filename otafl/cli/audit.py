"""``otafl audit``: Monte Carlo of the over-the-air round beside each accountant's bound.

Parses the options and calls :func:`otafl.api.audit.audit_grid` (same grid as ``otafl
bound``, h = 1, sensitivity 2L; the audit and its Clopper-Pearson interval are described
there) with a progress bar on stderr over the Monte Carlo batches
(:func:`otafl.progress.progress_bar`); prints with :func:`otafl.report.text.audit_text`, CSV
or JSON.
"""

from __future__ import annotations

import click

from otafl.api.defaults import AUDIT_ACCOUNTANTS as DEFAULT_ACCOUNTANTS, AUDIT_SCOPES as SCOPES, PAPER_DIM
from otafl.cli.options import (accountant_list, accountant_option, delta_options, echo_result, grid_options,
                               delta_total_option, output_options, parse_delta_prime,
                               parse_list, quiet_option)
from otafl.limits import DEFAULT_MAX_DRAWS
from otafl.privacy.names import ADVERSARIES
from otafl.progress import progress_bar
from otafl.report.text import audit_text


@click.command("audit")
@grid_options
@delta_options(delta_l_help="delta of the Gaussian step (and exact's per-round target delta).",
               delta_prime_help="Concentration failure probability for paper/tight: a number in (0, 1) or auto.")
@click.option("--n0", type=float, default=1.0, show_default=True,
              help="Receiver noise variance N0; 0 = no channel noise.")
@click.option("--dim", type=int, default=PAPER_DIM, show_default=True,
              help="Model dimension d (number of parameters; sets P = 10^(SNR/10) d N0).")
@accountant_option(default=DEFAULT_ACCOUNTANTS,
                   help="Accountant(s) whose (epsilon, delta) is audited, repeatable or comma-separated "
                        "(default: all three, to compare them).")
@click.option("--rounds", type=int, default=None,
              help="Also audit the totals over T identical rounds (each draw is T rounds: T times slower).")
@delta_total_option()
@click.option("--samples", type=int, default=1_000_000, show_default=True,
              help="Monte Carlo draws per grid point, scope and horizon.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the Monte Carlo generator.")
@click.option("--scope", type=click.Choice(SCOPES), default="central", show_default=True,
              help="Audit central DP, local DP, or both.")
@click.option("--adversary", type=click.Choice(ADVERSARIES), default="hidden", show_default=True,
              help="hidden: knows only the law of the participant count (the real threat); others / total: "
                   "also knows the number of other / of all participants (exact's two conditional bounds).")
@click.option("--confidence", type=float, default=0.95, show_default=True,
              help="Level of the two-sided Clopper-Pearson interval, in (0, 1).")
@click.option("--max-draws", type=click.IntRange(1), default=DEFAULT_MAX_DRAWS, show_default=True,
              help="Refuse audits of more Monte Carlo draws in all (points x scopes x horizons x samples).")
@output_options
@quiet_option
def audit(users, p, sigma2, clip, snr_db, delta_l, delta_prime, n0, dim, accountant, rounds, delta_total, samples, seed,
          scope, adversary, confidence, max_draws, fmt, device, quiet):
    """Monte Carlo audit of the mechanism beside each accountant's (epsilon, delta)."""
    from otafl.api.checks import check_audit_grid

    grid = dict(users=parse_list("users", users, int), p=parse_list("p", p), sigma2=parse_list("sigma2", sigma2),
                clip=parse_list("clip", clip), snr_db=parse_list("snr_db", snr_db),
                accountants=accountant_list(accountant), samples=samples, delta_l=delta_l,
                delta_prime=parse_delta_prime(delta_prime), n0=n0, dim=dim, rounds=rounds, scope=scope,
                adversary=adversary, confidence=confidence, max_draws=max_draws, delta_total=delta_total)
    check_audit_grid(**grid)  # a bad value is refused before torch loads

    from otafl.api.audit import audit_grid
    from otafl.device import resolve_device

    with progress_bar("audit", quiet=quiet) as progress:
        result = audit_grid(**grid, seed=seed, device=resolve_device(device), progress=progress)
    echo_result(result, fmt, audit_text)
