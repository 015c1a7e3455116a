"""``otafl plot-digital RESULTS --out FILE``: the over-the-air versus digital figure of a sweep."""

from __future__ import annotations

import click


@click.command("plot-digital")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(dir_okay=False), default="figures/ota-vs-digital.png",
              show_default=True, help="Image file; the format follows the suffix: .png, .svg or .pdf.")
@click.option("--no-curves", is_flag=True, help="Leave out panel (d), the bits-versus-epsilon curves (slow).")
def plot_digital(results, out, no_curves):
    """Accuracy vs composed central epsilon, channel uses and energy per round of each system
    (over the air, digital gaussian / skellam / ddg / pbm) in RESULTS, and the bits each discrete
    mechanism needs as epsilon shrinks (computed for the runs' K, d, p, T and delta)."""
    from otafl.api.digital import communication_curves
    from otafl.errors import OtaflInputError
    from otafl.report.digital_figure import plot_digital as draw
    from otafl.report.text import fmt_sig
    from otafl.results import output_target
    from otafl.sweep.store import read_store

    output_target(out)  # before the work
    with read_store(results) as store:
        runs = store.runs("done")
    if not runs:
        raise OtaflInputError("the results file holds no finished ('done') runs yet; run or resume the sweep first")
    curves = None
    digital = [r for r in runs if r.params.get("train", {}).get("aggregation") == "digital"]
    if not digital:
        raise OtaflInputError(f"results file {results!r} holds no digital runs (train.aggregation = 'digital'); "
                              f"plot-digital compares them with over-the-air runs, use otafl plot for the others")
    if digital and not no_curves:
        r = digital[0]
        total = r.summary.get("digital_delta_central_total")
        curves = communication_curves(users=int(r.summary["users"]), dim=int(r.summary["dim"]),
                                      p=float(r.params["sampling"]["p"]), rounds=int(r.summary["rounds"]),
                                      delta_l=float(r.params["privacy"]["delta_l"]),
                                      delta_total=float(total) if total is not None else None,
                                      clip=float(r.params["transmit"]["clip"]))
        for row in curves["rows"]:
            click.echo(f"{row['mechanism']:8s} sigma2 {row['sigma2']:<7g} bits {row['bits']:3d}  central eps over the "
                       f"run {fmt_sig(row['epsilon_central_total'])} at delta {fmt_sig(row['delta_total'])} (user level)")
    path = draw(runs, curves, out)
    click.echo(f"digital figure -> {path}")
