"""Figure: per-round central epsilon vs p for the ``paper``, ``tight`` and ``exact`` accountants.

At the paper's preset by default (K = 200, sigma^2 = 0.1, L = 1, delta_l = 1e-5, N0 = 0,
d = 7850). ``paper`` points whose classic Gaussian step is outside its validity range
(eps_0 > 1) are drawn hollow: there the classic formula is not a theorem. Optionally the
Monte Carlo audit (hidden-count adversary) of ``exact``'s epsilon is added as a check.

    python -m otafl.report.accountants_figure --out figures/accountants.png
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click
import numpy as np
import torch

PRESET = dict(users=200, sigma2=0.1, clip=1.0, delta_l=1e-5, n0=0.0, dim=7850)
DEFAULT_P = tuple(round(0.05 * i, 2) for i in range(1, 21))


def accountant_curves(*, p: Sequence[float] = DEFAULT_P, users: int = 200, sigma2: float = 0.1,
                      clip: float = 1.0, delta_l: float = 1e-5, n0: float = 0.0, dim: int = 7850,
                      alignment_gain: float = 1.0) -> dict:
    """Per-round central (eps, delta) of the three accountants on a grid of uniform p.

    Returns a JSON-able dict: ``p``, and for each accountant ``epsilon``, ``delta``
    (lists over p); ``paper_classic_valid``; the parameters. N0 / c^2 is the channel
    noise in gradient units (``alignment_gain`` c; irrelevant when N0 = 0).
    """
    from otafl.privacy.accountants import paper_round, tight_round
    from otafl.privacy.accountants import exact_round

    pp = torch.tensor(list(p), dtype=torch.float64)
    kw = dict(participation_prob=pp, users=users, noise_var=sigma2, alignment_gain=alignment_gain, n0=n0,
              sensitivity=2.0 * clip, delta_l=delta_l)
    bounds = {"paper": paper_round(**kw), "tight": tight_round(**kw), "exact": exact_round(dim=dim, **kw)}
    out = {"p": pp.tolist(), "users": users, "sigma2": sigma2, "clip": clip, "delta_l": delta_l, "n0": n0,
           "dim": dim, "paper_classic_valid": bounds["paper"].classic_valid.tolist()}
    for name, b in bounds.items():
        out[name] = {"epsilon": b.epsilon_central.tolist(), "delta": b.delta_central.tolist()}
    return out


def plot_accountants(curves: dict, out: str | Path) -> Path:
    """Log-scale eps_c vs p, one line per accountant (hollow paper markers: classic step invalid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from otafl.report.plots import ACCOUNTANT_STYLE, STYLE, save_figure

    p = np.asarray(curves["p"])
    with matplotlib.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(8.0, 5.4))
        for name in ("paper", "tight", "exact"):
            color, marker = ACCOUNTANT_STYLE[name]
            eps = np.asarray(curves[name]["epsilon"], dtype=float)
            ok = np.isfinite(eps)
            delta = curves[name]["delta"]
            label = {"paper": "paper (Hoeffding, classic Gaussian)",
                     "tight": "tight (exact quantile, analytic Gaussian)",
                     "exact": r"exact (numerical, $\delta$ = " f"{delta[0]:g})"}[name]
            ax.plot(p[ok], eps[ok], "-", color=color, label=label)
            if name == "paper":
                valid = np.asarray(curves["paper_classic_valid"], dtype=bool)
                ax.plot(p[ok & valid], eps[ok & valid], marker, color=color, ls="none")
                ax.plot(p[ok & ~valid], eps[ok & ~valid], marker, color=color, ls="none", mfc="white",
                        label=r"paper: classic step invalid ($\epsilon_0$ > 1)" if (~valid & ok).any() else None)
            else:
                ax.plot(p[ok], eps[ok], marker, color=color, ls="none")
        ax.set_yscale("log")
        ax.set_xlabel("participation probability p")
        ax.set_ylabel(r"central leakage $\epsilon_c$ per round")
        ax.set_title(rf"K = {curves['users']}, $\sigma^2$ = {curves['sigma2']:g}, L = {curves['clip']:g}, "
                     rf"$\delta_\ell$ = {curves['delta_l']:g}, N0 = {curves['n0']:g}, d = {curves['dim']}",
                     fontsize=12)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=10, loc="upper right")
        fig.tight_layout()
        path = save_figure(fig, out)
        plt.close(fig)
    return path


@click.command()
@click.option("--out", default="figures/accountants.png", show_default=True, help="Output image (.png/.svg/.pdf).")
@click.option("--p", "p", default=",".join(f"{v:g}" for v in DEFAULT_P), show_default=True,
              help="Participation probabilities (comma list).")
@click.option("--users", type=int, default=PRESET["users"], show_default=True)
@click.option("--sigma2", type=float, default=PRESET["sigma2"], show_default=True)
@click.option("--clip", type=float, default=PRESET["clip"], show_default=True)
@click.option("--delta-l", "delta_l", type=float, default=PRESET["delta_l"], show_default=True)
@click.option("--n0", type=float, default=PRESET["n0"], show_default=True)
@click.option("--dim", type=int, default=PRESET["dim"], show_default=True)
def main(out, p, users, sigma2, clip, delta_l, n0, dim):
    """Write the accountants figure (per-round central epsilon vs p)."""
    from otafl.cli.options import parse_list

    curves = accountant_curves(p=parse_list("p", p), users=users, sigma2=sigma2, clip=clip, delta_l=delta_l,
                               n0=n0, dim=dim)
    path = plot_accountants(curves, out)
    click.echo(f"wrote {path}")
    for i, pv in enumerate(curves["p"]):
        click.echo(f"p={pv:g}  " + "  ".join(f"{n}={curves[n]['epsilon'][i]:.4g}" for n in ("paper", "tight", "exact")))


if __name__ == "__main__":
    main()
