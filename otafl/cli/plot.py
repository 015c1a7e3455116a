"""``otafl plot RESULTS.sqlite --kind KIND --out FILE``: figures from a sweep."""

from __future__ import annotations

import click

KINDS = ("accuracy", "privacy", "tradeoff", "channel")


@click.command("plot")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--kind", type=click.Choice(KINDS), required=True,
              help="accuracy: accuracy vs round per p; privacy: epsilon vs p; tradeoff: accuracy vs "
                   "epsilon per scheme; channel: gain traces and participation over time.")
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True,
              help="Image file; the format follows the suffix: .png, .svg or .pdf.")
@click.option("--group-by", "group_by", multiple=True, metavar="SECTION.KEY",
              help="Curves per these spec keys besides scheme and p / h_th [default: every key that varies].")
@click.option("--accountant", default=None,
              help="Accountant on the epsilon axis of --kind tradeoff [default: tight if present].")
@click.option("--epsilon", type=click.Choice(["round", "total"]), default="round", show_default=True,
              help="Epsilon axis of --kind tradeoff: the worst round's, or composed over the run.")
def plot(results, kind, out, group_by, accountant, epsilon):
    """Draw a figure of KIND from the finished runs in RESULTS and save it to OUT."""
    from otafl.report.plots import plot_results

    keys = [k.strip() for item in group_by for k in item.split(",") if k.strip()] or None
    path = plot_results(results, kind, out, group_by=keys, accountant=accountant, epsilon=epsilon)
    click.echo(f"{kind} figure -> {path}")
