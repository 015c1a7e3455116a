"""``otafl scaling``: central leakage vs K for fixed p and for p = a K^{-1/2} (K^{-1/2} vs K^{-3/4}).

Parses the options and calls :func:`otafl.api.scaling.scaling_grid`; draws the figure
(:func:`otafl.report.scaling.plot_scaling`) and prints with
:func:`otafl.report.text.scaling_text`, CSV or JSON.
"""

from __future__ import annotations

import click

from otafl.api.scaling import scaling_grid
from otafl.cli.options import accountant_list, accountant_option, echo_result, output_options, parse_delta_prime
from otafl.device import resolve_device
from otafl.report.text import scaling_text


@click.command("scaling")
@click.option("--p", "p", type=float, default=0.5, show_default=True, help="The fixed participation probability.")
@click.option("--a", "a", type=float, default=5.0, show_default=True,
              help="Coefficient of p = a K^{-1/2}. A fixed delta' needs a > sqrt(ln(2/delta')/2); the auto "
                   "delta' = 2 exp(-2 a^2) + 1e-5 adapts to a (a = 5: ~1e-5).")
@click.option("--sigma2", type=float, default=10.0, show_default=True,
              help="Artificial noise variance per coordinate (gradient units).")
@click.option("--clip", type=float, default=1.0, show_default=True, help="Clipping norm L (sensitivity 2L).")
@click.option("--delta-l", "delta_l", type=float, default=1e-5, show_default=True,
              help="delta of the Gaussian step, in (0, 1).")
@click.option("--delta-prime", "delta_prime", default="auto", show_default=True,
              help="Concentration failure probability: a number in (0, 1) or auto.")
@click.option("--k-min", "k_min", type=float, default=1e2, show_default=True,
              help="Smallest number of users K of the log grid (>= 1).")
@click.option("--k-max", "k_max", type=float, default=1e6, show_default=True,
              help="Largest number of users K of the log grid (> --k-min).")
@click.option("--points", type=int, default=41, show_default=True,
              help="K values, log-spaced between --k-min and --k-max (rounded; repeats dropped).")
@accountant_option(default=("paper",))
@click.option("--out", type=click.Path(dir_okay=False), default="figures/scaling.png", show_default=True,
              help="Where to write the log-log figure.")
@click.option("--no-plot", is_flag=True, help="Do not draw the figure.")
@output_options
def scaling(p, a, sigma2, clip, delta_l, delta_prime, k_min, k_max, points, accountant, out, no_plot, fmt, device):
    """Fit and draw how the central leakage falls with K: fixed p (theory -1/2) and p = a/sqrt(K) (-3/4)."""
    result = scaling_grid(k_min=k_min, k_max=k_max, points=points, p=p, a=a, sigma2=sigma2, clip=clip,
                          delta_l=delta_l, delta_prime=parse_delta_prime(delta_prime),
                          accountants=accountant_list(accountant), device=resolve_device(device))
    if not no_plot:
        from otafl.report.scaling import plot_scaling

        result["meta"]["figure"] = str(plot_scaling(result["curves"], out))
    echo_result(result, fmt, scaling_text)
