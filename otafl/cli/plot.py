"""``otafl plot RESULTS.sqlite --kind KIND --out FILE``: figures from a sweep."""

from __future__ import annotations

import click

from otafl.api.defaults import accountant_names
from otafl.report.names import EPSILONS, KINDS


@click.command("plot")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--kind", type=click.Choice(KINDS), required=True,
              help="accuracy: accuracy vs round per p; privacy: epsilon vs p per accountant; tradeoff: accuracy "
                   "vs epsilon per scheme; channel: gain traces and participation over time; scaling: accuracy and "
                   "central epsilon vs a swept key (--x), with the per-round epsilon's log-log slope.")
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True,
              help="Image file; the format follows the suffix: .png, .svg or .pdf.")
@click.option("--group-by", "group_by", multiple=True, metavar="SECTION.KEY",
              help="Curves per these spec keys besides scheme and p / h_th [default: every key that varies].")
@click.option("--facet", default=None, metavar="SECTION.KEY|none",
              help="One panel per value of this grouping key [default: the first key that varies besides "
                   "the sampling keys and the seed, e.g. channel.snr_db; none: a single panel].")
@click.option("--accountant", default=None, metavar="NAME[,NAME]",
              help=f"Accountant(s) on the epsilon axis: {', '.join(accountant_names())}, or all [default for tradeoff: exact "
                   "if the runs carry it, else the first present (as otafl table); for privacy: all].")
@click.option("--epsilon", type=click.Choice(EPSILONS), default="round", show_default=True,
              help="privacy / tradeoff: the worst round's leakage, or the total composed over the T rounds.")
@click.option("--x", "x", default="data.users", show_default=True, metavar="SECTION.KEY",
              help="scaling: the swept numeric key on the horizontal axis.")
def plot(results, kind, out, group_by, facet, accountant, epsilon, x):
    """Draw a figure of KIND from the finished runs in RESULTS and save it to OUT."""
    from otafl.report.plots import plot_results, scaling_slopes

    keys = [k.strip() for item in group_by for k in item.split(",") if k.strip()] or None
    path = plot_results(results, kind, out, group_by=keys, accountant=accountant, facet=facet, epsilon=epsilon, x=x)
    if kind == "scaling":
        click.echo(scaling_slopes(results, group_by=keys, accountant=accountant, x=x))
    click.echo(f"{kind} figure -> {path}")
