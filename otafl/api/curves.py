"""Per-round central epsilon vs p for the ``paper``, ``tight`` and ``exact`` accountants.

The data of the accountants figure (:func:`otafl.report.accountants_figure.plot_accountants`),
at the paper's preset by default: K = 200, sigma^2 = 0.1, L = 1, delta_l = 1e-5, N0 = 0,
d = :data:`~otafl.api.defaults.PAPER_DIM`. ``exact`` (numerical, ~0.1 s a point) is evaluated
a few points at a time, so that a ``progress`` callback can follow it.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from otafl.device import default_threads
from otafl.api.defaults import CURVES_P, CURVES_PRESET
from otafl.api.checks import check_curves
from otafl.progress import Progress, Tally

__all__ = ["ACCOUNTANTS", "DEFAULT_P", "PRESET", "accountant_curves"]

ACCOUNTANTS = ("paper", "tight", "exact")
"""The accountants of the figure, in drawing order."""

PRESET = CURVES_PRESET
"""The paper's preset: the defaults of :func:`accountant_curves`."""

DEFAULT_P = CURVES_P
"""p = 0.05, 0.10, ..., 1."""


def accountant_curves(*, p: Sequence[float] = DEFAULT_P, users: int = PRESET["users"],
                      sigma2: float = PRESET["sigma2"], clip: float = PRESET["clip"],
                      delta_l: float = PRESET["delta_l"], n0: float = PRESET["n0"], dim: int = PRESET["dim"],
                      alignment_gain: float = 1.0, progress: Progress | None = None) -> dict:
    """Per-round central (eps, delta) of the three accountants on a grid of uniform p.

    Parameters
    ----------
    p : participation probabilities in (0, 1].
    users : K >= 1.   sigma2 : artificial-noise variance per coordinate (gradient units).
    clip : L > 0 (sensitivity 2L).   delta_l : delta of the Gaussian step, in (0, 1).
    n0 : receiver noise variance N0 >= 0; N0 / c^2 is the channel noise in gradient units.
    dim : model dimension d (``exact`` depends on it).
    alignment_gain : c (irrelevant when N0 = 0).
    progress : called with (done, total) values of p done by ``exact`` (the slow one),
        ending with (total, total).

    Returns
    -------
    A JSON-able dict: ``p`` (list), and for each of ``paper``, ``tight``, ``exact`` a dict
    ``{"epsilon": [...], "delta": [...]}`` (lists over p; +inf where undefined);
    ``paper_classic_valid`` (list of bool: the paper's classic Gaussian step has eps_0 <= 1);
    the parameters ``users sigma2 clip delta_l n0 dim``.
    """
    default_threads()  # the CLI's thread policy (otafl/device.py)
    from otafl.privacy.accountants import paper_round, tight_round
    from otafl.privacy.accountants import exact_round

    check_curves(p=p, users=users, sigma2=sigma2, clip=clip, delta_l=delta_l, n0=n0, dim=dim)
    pp = torch.tensor(list(p), dtype=torch.float64)
    kw = dict(participation_prob=pp, users=users, noise_var=sigma2, alignment_gain=alignment_gain, n0=n0,
              sensitivity=2.0 * clip, delta_l=delta_l)
    tally = Tally(progress, len(pp))
    piece = max(1, min(16, math.ceil(len(pp) / 10)))  # >= 10 updates; batches of <= 16 points
    exact = {"epsilon": [], "delta": []}
    for lo in range(0, len(pp), piece):
        part = exact_round(dim=dim, **{**kw, "participation_prob": pp[lo:lo + piece]})
        exact["epsilon"] += part.epsilon_central.tolist()
        exact["delta"] += torch.broadcast_to(part.delta_central, part.epsilon_central.shape).tolist()
        tally.advance(len(pp[lo:lo + piece]))
    bounds = {"paper": paper_round(**kw), "tight": tight_round(**kw)}
    out = {"p": pp.tolist(), "users": users, "sigma2": sigma2, "clip": clip, "delta_l": delta_l, "n0": n0,
           "dim": dim, "paper_classic_valid": bounds["paper"].classic_valid.tolist()}
    for name, b in bounds.items():
        out[name] = {"epsilon": b.epsilon_central.tolist(), "delta": b.delta_central.tolist()}
    out["exact"] = exact
    tally.finish()
    return out
