"""``otafl scaling``: central leakage vs K for fixed p and for p = a K^{-1/2} (K^{-1/2} vs K^{-3/4})."""

from __future__ import annotations

import csv
import io
import json
import math

import click
import numpy as np

from otafl.cli.options import CommaChoice, json_safe, output_options, parse_delta_prime
from otafl.device import resolve_device
from otafl.errors import check_range
from otafl.privacy.accountants import ACCOUNTANTS


@click.command("scaling")
@click.option("--p", "p", type=float, default=0.5, show_default=True, help="The fixed participation probability.")
@click.option("--a", "a", type=float, default=5.0, show_default=True,
              help="Coefficient of p = a K^{-1/2}. A fixed delta' needs a > sqrt(ln(2/delta')/2); the auto "
                   "delta' = 2 exp(-2 a^2) + 1e-5 adapts to a (a = 5: ~1e-5).")
@click.option("--sigma2", type=float, default=10.0, show_default=True, help="Artificial noise variance.")
@click.option("--clip", type=float, default=1.0, show_default=True, help="Clipping norm L (sensitivity 2L).")
@click.option("--delta-l", "delta_l", type=float, default=1e-5, show_default=True)
@click.option("--delta-prime", "delta_prime", default="auto", show_default=True, help="A number in (0, 1) or auto.")
@click.option("--k-min", "k_min", type=float, default=1e2, show_default=True)
@click.option("--k-max", "k_max", type=float, default=1e6, show_default=True)
@click.option("--points", type=int, default=41, show_default=True, help="K values, log-spaced.")
@click.option("--accountant", type=CommaChoice(sorted(ACCOUNTANTS)), multiple=True, default=("paper",),
              show_default=True, help="Accountant(s), repeatable or comma-separated.")
@click.option("--out", type=click.Path(dir_okay=False), default="figures/scaling.png", show_default=True,
              help="Where to write the log-log figure.")
@click.option("--no-plot", is_flag=True, help="Do not draw the figure.")
@output_options
def scaling(p, a, sigma2, clip, delta_l, delta_prime, k_min, k_max, points, accountant, out, no_plot, fmt, device):
    """Fit and draw how the central leakage falls with K: fixed p (theory -1/2) and p = a/sqrt(K) (-3/4)."""
    from otafl.report.scaling import THEORY_SLOPES, plot_scaling, scaling_curves

    check_range("k_min", k_min, lo=1)
    check_range("k_max", k_max, lo=k_min, lo_open=True)
    check_range("points", points, lo=2)
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    names = list(dict.fromkeys(n for group in accountant for n in (group if isinstance(group, tuple) else (group,))))
    users = np.unique(np.round(np.logspace(math.log10(k_min), math.log10(k_max), points)))
    curves = scaling_curves(users=users, p=p, a=a, sigma2=sigma2, clip=clip, delta_l=delta_l,
                            delta_prime=parse_delta_prime(delta_prime), accountants=names, device=resolve_device(device))
    figure = None if no_plot else str(plot_scaling(curves, out))
    if fmt == "json":
        rows = [{"users": k, "accountant": n, "scheme": s, "p": p if s == "fixed_p" else a / math.sqrt(k),
                 "epsilon_central": curves["curves"][n][s][i]}
                for n in names for s in ("fixed_p", "sqrt_p") for i, k in enumerate(curves["users"])]
        meta = {k: v for k, v in curves.items() if k not in ("curves", "users")}
        meta.update({"command": "scaling", "theory": THEORY_SLOPES, "figure": figure, "accountants": names})
        click.echo(json.dumps(json_safe({"rows": rows, "meta": meta}), indent=1, allow_nan=False))
        return
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["users", "accountant", "scheme", "p", "epsilon_central"])
        for n in names:
            for s in ("fixed_p", "sqrt_p"):
                for k, eps in zip(curves["users"], curves["curves"][n][s]):
                    writer.writerow([k, n, s, p if s == "fixed_p" else a / math.sqrt(k), eps])
        click.echo(buf.getvalue(), nl=False)
        return
    click.echo(f"central leakage vs K = {int(curves['users'][0])} ... {int(curves['users'][-1])} "
               f"({len(curves['users'])} points), sigma2 = {sigma2:g}, L = {clip:g}, delta_l = {delta_l:g}, "
               f"delta' = {delta_prime}")
    for n in names:
        for s, label in (("fixed_p", f"fixed p = {p:g}"), ("sqrt_p", f"p = {a:g} K^-1/2")):
            fit = curves["slopes"][n][s]
            click.echo(f"  {n:6s} {label:18s} fitted slope {fit['slope']:+.4f}   theory {THEORY_SLOPES[s]:+.2f}"
                       f"   ({fit['points']} finite points)")
    if figure:
        click.echo(f"figure -> {figure}")
