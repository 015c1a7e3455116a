"""``otafl table RESULTS.sqlite``: the Table II trade-off table of a sweep."""

from __future__ import annotations

import click

from otafl.api.defaults import accountant_names
from otafl.report.table import COLUMNS, DEFAULT_COLUMNS, FORMATS

COLUMN_HELP = ", ".join(COLUMNS) + " (group: every other swept key; or a key's own name)"


@click.command("table")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True,
              help="Markdown (GitHub), plain text (aligned columns), LaTeX (a table float: booktabs tabular, "
                   "caption, note) or CSV (plain numbers).")
@click.option("--accountant", "accountant", default=None, metavar="NAME[,NAME]",
              help=f"Accountant(s) whose leakage is shown: {', '.join(accountant_names())}, or all "
                   "[default: exact if the runs carry it, else the first one present; digital beside it when "
                   "the runs carry it].")
@click.option("--columns", "columns", default=None, metavar="NAME[,NAME...]",
              help=f"Columns to show, in this order; choices: {COLUMN_HELP}. The per-accountant ones (eps_*, "
                   "delta_*, composition, valid) form one block per accountant where the first is listed "
                   f"[default: {','.join(DEFAULT_COLUMNS)}; CSV adds p,h_th and valid].")
@click.option("--group-by", "group_by", multiple=True, metavar="SECTION.KEY",
              help="Group rows by these spec keys besides scheme and p / h_th (repeatable or comma-separated) "
                   "[default: every key that varies between runs, except the seed].")
@click.option("--caption", default=None,
              help="LaTeX caption text (used as is) [default: generated from the accountants, T and seeds]; "
                   "in md / text a given caption is printed above the table.")
@click.option("--label", default=None, help="LaTeX \\label of the table (e.g. tab:tradeoff) [default: none].")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the table to this file instead of standard output.")
@click.option("--no-legend", is_flag=True, help="Leave out the explanatory note under the table.")
def table(results, fmt, accountant, columns, group_by, caption, label, out, no_legend):
    """Print the accuracy / privacy trade-off table of the finished runs in RESULTS.

    One row per sampling scheme and p (or h_th), and per other swept value (sorted as
    numbers): test accuracy (mean +- std over seeds), local and central leakage of the
    chosen accountant(s), per round (worst round) and composed over the T rounds (the
    header names T and the composition), and the mean number of participants per round.
    A value whose accountant left its validity range (paper's classic Gaussian step) is
    marked '!' (LaTeX: dagger; CSV: the ACC_classic_valid column) and explained in the note.
    """
    from otafl.report.table_format import store_table
    from otafl.results import atomic_write_text, output_target

    if out is not None:
        output_target(out)  # a device node, FIFO or folder: refused before the work
    keys = [k.strip() for item in group_by for k in item.split(",") if k.strip()] or None
    text, rows = store_table(results, fmt, accountants=accountant, columns=columns, group_by=keys,
                             legend=not no_legend, caption=caption, label=label)
    if out is None:
        click.echo(text, nl=False)
    else:
        atomic_write_text(out, text)
        click.echo(f"{rows} rows -> {out}")
