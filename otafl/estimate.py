"""Server-side estimators of the FedSGD gradient from the aligned over-the-air sum.

The server divides the MAC output by the alignment gain (docs/model.md#estimators):

    a_t = y_t / c_t = sum_{k in K_t} g_k + sum_{k in K_t} n_{k,t} + m_t / c_t,

and targets the full-participation gradient g_t = (1/K) sum_k g_k. The noise terms have zero
mean, so only the random set K_t (user k joins with probability p_{k,t}, independently)
decides the bias:

- ``known``   g_hat = a_t / |K_t|, the server is told |K_t|; no update when |K_t| = 0.
  Under uniform sampling, given |K_t| = n > 0, K_t is a uniformly random n-subset, so
  E[sum_{K_t} g_k | n] = n g_t and E[g_hat | |K_t| > 0] = g_t: unbiased *conditional on
  |K_t| > 0*. With non-uniform p it is biased towards the users with large p.
- ``unknown`` g_hat = a_t / mu_t, mu_t = sum_k p_{k,t}, only the p's are known.
  E[g_hat] = sum_k p_{k,t} g_k / mu_t: unbiased for that p-weighted mean, which is g_t when
  p is uniform. Channel-aware sampling (p = min(1, h/h_th)) therefore weights user k by
  p_{k,t}: users in good fades count more in that round's estimate.

Shapes: ``aligned`` is [d] (or [..., d]; the division broadcasts), in gradient units.
"""

from __future__ import annotations

from torch import Tensor

from otafl.errors import check_range, out_of_range

__all__ = ["estimate_known", "estimate_unknown", "ESTIMATORS"]


def estimate_known(aligned: Tensor, participants: int, mu: float | None = None) -> Tensor | None:
    """g_hat = (y_t / c_t) / |K_t|, or ``None`` (skip the update) when |K_t| = 0.

    Parameters
    ----------
    aligned : [d], float — y_t / c_t.
    participants : int — |K_t| >= 0, the number of users who transmitted.
    mu : ignored (the registry's common signature).

    Returns
    -------
    g_hat : [d], dtype of ``aligned``, or None. Unbiased for g_t conditional on |K_t| > 0
    under uniform sampling (module docstring).
    """
    n = int(participants)
    if n != participants or n < 0:
        raise out_of_range("participants", participants, "{0, 1, 2, ...}")
    if n == 0:
        return None
    return aligned / n


def estimate_unknown(aligned: Tensor, mu: float, participants: int | None = None) -> Tensor | None:
    """g_hat = (y_t / c_t) / mu_t with mu_t = sum_k p_{k,t}, or ``None`` when mu_t = 0
    (nobody could join: skip the update).

    Parameters
    ----------
    aligned : [d], float — y_t / c_t.
    participants : ignored (the server does not know |K_t|).
    mu : float — expected number of participants mu_t >= 0.

    Returns
    -------
    g_hat : [d] or None; unbiased for sum_k p_{k,t} g_k / mu_t (= g_t when p is uniform, a
    p-weighted mean otherwise, e.g. under channel-aware sampling).
    """
    mu = check_range("mu_t", float(mu), lo=0.0)
    if mu == 0.0:
        return None
    return aligned / mu


#: Estimators by name, one signature: ``fn(aligned, *, participants, mu) -> [d] | None``
#: (None: skip the round's update). ``known`` uses |K_t|, ``unknown`` uses mu_t.
from otafl.names import ESTIMATORS  # noqa: E402 (the names, torch-free; entries resolve here)
