"""``otafl plot-accountants``: the accountants figure (per-round central epsilon vs p).

Parses the options and calls :func:`otafl.api.curves.accountant_curves` (all three
accountants: the figure compares them) with a progress bar on stderr over ``exact``'s
points (:func:`otafl.progress.progress_bar`); draws with
:func:`otafl.report.accountants_figure.plot_accountants` and prints the curves with
:func:`otafl.report.text.accountants_text`, CSV or JSON.
"""

from __future__ import annotations

import click

from otafl.api.defaults import CURVES_P as DEFAULT_P, CURVES_PRESET as PRESET
from otafl.cli.options import parse_list, quiet_option
from otafl.progress import progress_bar
from otafl.report.text import accountants_text


@click.command("plot-accountants")
@click.option("--out", type=click.Path(dir_okay=False), default="figures/accountants.png", show_default=True,
              help="Output image; the format follows the suffix: .png, .svg or .pdf.")
@click.option("--p", "p", default=",".join(f"{v:g}" for v in DEFAULT_P), show_default=True,
              help="Participation probabilities in (0, 1] (comma list).")
@click.option("--users", type=int, default=PRESET["users"], show_default=True, help="Number of users K.")
@click.option("--sigma2", type=float, default=PRESET["sigma2"], show_default=True,
              help="Artificial noise variance per coordinate (gradient units).")
@click.option("--clip", type=float, default=PRESET["clip"], show_default=True,
              help="Clipping norm L (sensitivity 2L).")
@click.option("--delta-l", "delta_l", type=float, default=PRESET["delta_l"], show_default=True,
              help="delta of the Gaussian step, in (0, 1).")
@click.option("--n0", type=float, default=PRESET["n0"], show_default=True,
              help="Receiver noise variance N0 (alignment gain c = 1); 0 = no channel noise.")
@click.option("--dim", type=int, default=PRESET["dim"], show_default=True,
              help="Model dimension d (number of parameters; exact depends on it).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help='Printed curves: a text table, CSV rows (p, accountant, epsilon, delta) or JSON '
                   '(non-finite numbers as the strings "inf", "-inf", "nan").')
@quiet_option
def plot_accountants(out, p, users, sigma2, clip, delta_l, n0, dim, fmt, quiet):
    """Write the accountants figure (per-round central epsilon vs p of paper, tight, exact) and print it."""
    from otafl.api.checks import check_curves
    from otafl.results import output_target

    output_target(out)  # before the work
    p = parse_list("p", p)
    check_curves(p=p, users=users, sigma2=sigma2, clip=clip, delta_l=delta_l, n0=n0, dim=dim)  # before torch loads

    from otafl.api.curves import accountant_curves
    from otafl.report.accountants_figure import plot_accountants as draw
    from otafl.report.text import csv_text, json_text

    with progress_bar("exact", quiet=quiet, unit="p") as progress:
        curves = accountant_curves(p=p, users=users, sigma2=sigma2, clip=clip, delta_l=delta_l,
                                   n0=n0, dim=dim, progress=progress)
    path = str(draw(curves, out))
    if fmt == "json":
        click.echo(json_text({**curves, "figure": path}))
    elif fmt == "csv":
        click.echo(csv_text([{"p": pv, "accountant": n, "epsilon_central": curves[n]["epsilon"][i],
                              "delta_central": curves[n]["delta"][i]}
                             for n in ("paper", "tight", "exact") for i, pv in enumerate(curves["p"])]), nl=False)
    else:
        click.echo(accountants_text(curves, path), nl=False)
