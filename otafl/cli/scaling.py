"""``otafl scaling``: central leakage vs K for fixed p and for p = a K^{-1/2} (K^{-1/2} vs K^{-3/4}).

Parses the options and calls :func:`otafl.api.scaling.scaling_grid`; prints with
:func:`otafl.report.text.scaling_text` (plus the half-range slopes), CSV or JSON, and
draws the figure (:func:`otafl.report.scaling.plot_scaling`) only where ``--out`` says.
A tqdm progress bar goes to stderr when it is a terminal (``--quiet``: never).
"""

from __future__ import annotations

import sys

import click

from otafl.api.defaults import PAPER_DIM, SCALING_SCHEMES as SCHEMES
from otafl.cli.options import accountant_list, accountant_option, echo_result, output_options, parse_delta_prime
from otafl.report.text import render_table, scaling_text


def scaling_table(result: dict) -> str:
    """:func:`scaling_text` (title, one slope row per accountant and scheme), then the
    channel and grid line and the slopes over the lower and upper half of the K range,
    then the figure written, if any."""
    m = result["meta"]
    text = scaling_text({"rows": result["rows"], "meta": {**m, "figure": None}})
    labels = {"fixed_p": f"fixed p = {m['p']:g}", "sqrt_p": f"p = {m['a']:g} K^-1/2"}
    lines = []
    for name in m["accountants"]:
        users = m["users_of"][name]
        for scheme in SCHEMES:
            fit = m["slopes"][name][scheme]
            lines.append([name, labels[scheme], f"{users[0]}-{round(fit['k_mid'])}", fit["slope_low"],
                          f"{round(fit['k_mid'])}-{users[-1]}", fit["slope_high"]])
    text += render_table(["accountant", "scheme", "K_lower_half", "slope_lower", "K_upper_half", "slope_upper"], lines)
    counts = ", ".join(f"{n} {len(m['users_of'][n])}" for n in m["accountants"])
    text += (f"d = {m['dim']}, N0 = {m['n0']:g}, SNR = {m['snr_db']:g} dB (channel noise N0/c^2 = "
             f"{m['channel_noise_var']:.4g} per coordinate; paper leaves it out); K points: {counts}\n")
    return text + (f"figure -> {m['figure']}\n" if m.get("figure") else "")


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
@click.option("--dim", type=int, default=PAPER_DIM, show_default=True,
              help="Model dimension d (the paper's MNIST model by default); exact depends on it.")
@click.option("--n0", type=float, default=1.0, show_default=True,
              help="Receiver noise variance N0; 0 = no channel noise. With h = 1 and the min alignment policy "
                   "(as otafl bound) the channel adds N0/c^2 ~ sigma2/SNR per coordinate; paper leaves it out.")
@click.option("--snr-db", "snr_db", type=float, default=10.0, show_default=True,
              help="Transmit SNR in dB (sets P = 10^(SNR/10) d N0, hence the alignment gain c).")
@click.option("--k-min", "k_min", type=float, default=1e2, show_default=True,
              help="Smallest number of users K of the log grid (>= 1).")
@click.option("--k-max", "k_max", type=float, default=1e6, show_default=True,
              help="Largest number of users K of the log grid (> --k-min).")
@click.option("--points", type=int, default=41, show_default=True,
              help="K values, log-spaced between --k-min and --k-max (rounded; repeats dropped).")
@click.option("--exact-points", "exact_points", type=int, default=21, show_default=True,
              help="K values for exact (log-spaced over the same range; at most --points). exact is integrated "
                   "one K at a time, ~0.2-10 s a point on one thread (K = 10^6: ~0.3 s fixed p, ~8 s "
                   "p = a/sqrt(K)); 21 points over 10^2..10^6 take ~4-5 min (paper alongside is instant). Much slower at "
                   "small --delta-l (1e-10: minutes a point).")
@accountant_option(default=("paper",), help="Accountant(s), repeatable or comma-separated (e.g. paper,tight,exact: "
                                            "one figure, one colour each).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the log-log figure here (PNG, PDF, SVG by extension) [default: no figure].")
@click.option("--no-plot", is_flag=True, help="Do not draw the figure, even with --out.")
@click.option("--quiet", is_flag=True, help="No progress bar (it is only shown when stderr is a terminal).")
@output_options
def scaling(p, a, sigma2, clip, delta_l, delta_prime, dim, n0, snr_db, k_min, k_max, points, exact_points,
            accountant, out, no_plot, quiet, fmt, device):
    """Fit and draw how the central leakage falls with K: fixed p (theory -1/2) and p = a/sqrt(K) (-3/4)."""
    from otafl.api.checks import check_scaling_grid

    if out is not None and not no_plot:  # a bad --out is refused before the work, not after it
        from otafl.report.names import check_suffix
        from otafl.results import output_target

        output_target(out)
        check_suffix(out)
    delta_prime = parse_delta_prime(delta_prime)
    check_scaling_grid(k_min=k_min, k_max=k_max, points=points, exact_points=exact_points, p=p, a=a, sigma2=sigma2,
                       clip=clip, delta_l=delta_l, accountants=accountant_list(accountant), dim=dim, n0=n0,
                       snr_db=snr_db)  # a bad value is refused before torch loads

    from tqdm import tqdm

    from otafl.api.scaling import scaling_grid
    from otafl.device import resolve_device

    bar = None

    def progress(done: int, total: int, label: str) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="scaling", unit="pt", file=sys.stderr, leave=False, dynamic_ncols=True,
                       disable=True if quiet else None)  # None: off when stderr is not a terminal
        bar.update(done - bar.n)
        bar.set_postfix_str(label, refresh=False)

    try:
        result = scaling_grid(k_min=k_min, k_max=k_max, points=points, exact_points=exact_points, p=p, a=a,
                              sigma2=sigma2, clip=clip, delta_l=delta_l, delta_prime=delta_prime,
                              accountants=accountant_list(accountant), dim=dim, n0=n0, snr_db=snr_db,
                              progress=progress, device=resolve_device(device))
    finally:
        if bar is not None:
            bar.close()
    if out is not None and not no_plot:
        from otafl.report.scaling import plot_scaling

        result["meta"]["figure"] = str(plot_scaling(result["curves"], out))
    echo_result(result, fmt, scaling_table)
