"""``otafl table RESULTS.sqlite``: the Table II trade-off table of a sweep."""

from __future__ import annotations

import click


@click.command("table")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["md", "latex", "csv"]), default="md", show_default=True,
              help="Markdown (GitHub), LaTeX (booktabs) or CSV (plain numbers).")
@click.option("--group-by", "group_by", multiple=True, metavar="SECTION.KEY",
              help="Group rows by these spec keys besides scheme and p / h_th (repeatable or comma-separated) "
                   "[default: every key that varies between runs, except the seed].")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the table to this file instead of standard output.")
@click.option("--no-legend", is_flag=True, help="Leave out the explanatory line under the table.")
def table(results, fmt, group_by, out, no_legend):
    """Print the accuracy / privacy trade-off table of the finished runs in RESULTS.

    One row per sampling scheme and p (or h_th), and per other swept value: test accuracy
    (mean +- std over seeds), local and central leakage per accountant (worst round and
    composed over the run), and the mean number of participants per round.
    """
    from pathlib import Path

    from otafl.report.table import render_table, tradeoff_table
    from otafl.results import atomic_write_text
    from otafl.sweep.store import read_store

    keys = [k.strip() for item in group_by for k in item.split(",") if k.strip()] or None
    with read_store(results) as store:
        tab = tradeoff_table(store.runs("done"), group_by=keys)
    text = render_table(tab, fmt, legend=not no_legend)
    if out is None:
        click.echo(text, nl=False)
    else:
        atomic_write_text(Path(out), text)
        click.echo(f"{len(tab.rows)} rows -> {out}")
