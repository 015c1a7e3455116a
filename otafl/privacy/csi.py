r"""Estimated CSI in the accounting: a round with a gain mismatch, as a round that dominates it.

With estimated CSI every sender k arrives with gain r_k c_t, r_k = h_k / h_hat_k
(docs/model.md#channel-state-information), so the server's aligned sum is

    y_t / c_t = sum_{k in K_t} r_k (g_k + n_k) + m_t / c_t.

The accountants credit none of the estimation error as noise: they assume that the adversary
knows every realised r_k (the server knows h_hat; it may learn h as well), and read only the
round's extremes ``csi_ratio_min`` and ``csi_ratio_max`` (over the users who may transmit) from
:class:`~otafl.privacy.facts.RoundFacts`. For a target user j, dividing the output by the known
r_j (a bijection, so no divergence changes) gives

* its own term g_j + n_j: sensitivity 2L and own noise sigma_j^2, exactly as with perfect CSI;
* every other participant's noise (r_k / r_j) n_k, of variance at least
  kappa sigma_k^2 with kappa = (r_min / r_max)^2;
* the channel noise m_t / (c_t r_j), of variance at least N0 / (c_t r_max)^2.

Given the count n of the other participants, replacing each of them by a smaller variance and
the channel noise by a smaller one is a post-processing (data-independent Gaussian noise added,
the argument of docs/privacy/exact.md#exact-model), so the round is dominated, for every target,
by the perfect-CSI round with alignment gain c_t r_max, own noise sigma_j^2 and the others'
noise floor kappa sigma_o^2 (:func:`exact_keys`). Eq. (5) of ``exact`` (the others all add one
variance) no longer holds, so ``exact`` uses eq. (1) in such rounds. ``tight`` and ``paper``
read one noise level for the user and the others, and get kappa sigma_k^2 for both
(:func:`target_frame`): for their LDP (a Gaussian mechanism given participation) less noise
can only raise epsilon; their central bound is the fixed-noise model's, as without CSI error.
docs/privacy/csi.md#csi.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from otafl.errors import OtaflInputError
from otafl.privacy.accountants.registry import CSI_ACCOUNTANTS
from otafl.privacy.facts import RoundFacts

__all__ = ["CSI_ACCOUNTANTS", "exact_keys", "has_mismatch", "others_scale", "refuse_unless_supported",
           "target_frame"]

DIMENSION_FREE_ABOVE = 64
"""Above this model dimension a mismatched round's central rows take ``exact``'s dimension-free
bound (d -> inf, an upper bound for every d: a lower-dimensional output is a projection of a
higher one) instead of eq. (1)'s d-dimensional cells. Eq. (5) is out in such rounds, and eq. (1)'s
cells cost about 20 s a round at d = 7850 (K = 200) on a 2-core machine, where the norm of the
output reveals participation anyway (measured: docs/privacy/csi.md#csi-cost)."""



def has_mismatch(facts: RoundFacts | Sequence[RoundFacts]) -> bool:
    """Whether a round (or any of several) has a gain mismatch (estimated CSI with r != 1)."""
    rounds = [facts] if isinstance(facts, RoundFacts) else facts
    return any(f.csi_ratio_min != 1.0 or f.csi_ratio_max != 1.0 for f in rounds)


def _ratios(f: RoundFacts) -> tuple[float, float]:
    lo, hi = float(f.csi_ratio_min), float(f.csi_ratio_max)
    if not (0.0 < lo <= hi < float("inf")):
        raise OtaflInputError(f"csi_ratio_min = {lo!r}, csi_ratio_max = {hi!r} are outside the allowed range "
                              "0 < min <= max < inf")
    return lo, hi


def others_scale(f: RoundFacts) -> float:
    """kappa = (r_min / r_max)^2: the factor on the other participants' noise in any target's frame."""
    lo, hi = _ratios(f)
    return (lo / hi) ** 2


def target_frame(f: RoundFacts, *, scale_own: bool) -> RoundFacts:
    """The perfect-CSI round that dominates ``f`` in every target's frame: alignment gain
    c_t r_max (channel noise N0 / (c_t r_max)^2) and no mismatch; with ``scale_own`` every
    noise variance times kappa (``tight``, ``paper``: one noise level for the user and the others),
    else the own noises unchanged and kappa applied to the others' floor by :func:`exact_keys`.
    ``f`` itself when it has no mismatch."""
    if not has_mismatch(f):
        return f
    lo, hi = _ratios(f)
    noise = torch.as_tensor(f.noise_var, dtype=torch.float64)
    return dataclasses.replace(f, alignment_gain=float(f.alignment_gain) * hi, csi_ratio_min=1.0, csi_ratio_max=1.0,
                               noise_var=noise * (lo / hi) ** 2 if scale_own else noise)


def exact_keys(keys: list[tuple], facts: Sequence[RoundFacts], kind: str) -> list[tuple]:
    """``exact``'s row keys of the rounds :func:`target_frame` (``scale_own=False``) made, with each
    mismatched round's central rows given the others' floor kappa sigma_o^2 and eq. (1) only
    (the key layout of :func:`otafl.privacy.accountants.exact_run.round_row_keys`:
    ``("c", p, own, others, ch, a, dim, law, total_ok)``), and above :data:`DIMENSION_FREE_ABOVE`
    dimensions the dimension-free bound (dim None). Local rows (n = 0) have no others."""
    if kind != "central":
        return keys
    out = []
    for ks, f in zip(keys, facts):
        if has_mismatch(f):
            kappa = others_scale(f)
            ks = tuple((*k[:3], k[3] * kappa, *k[4:6], None if k[6] > DIMENSION_FREE_ABOVE else k[6], k[7], False)
                       for k in ks)
        out.append(ks)
    return out


def refuse_unless_supported(facts: Sequence[RoundFacts], names: Sequence[str]) -> None:
    """OtaflInputError when a round has a gain mismatch and an accountant that does not read it is asked."""
    if not has_mismatch(facts):
        return
    other = [n for n in names if n not in CSI_ACCOUNTANTS]
    if other:
        raise OtaflInputError(f"accountants {other!r} are outside the allowed range for estimated CSI "
                              f"(a gain mismatch h/h_hat != 1): only {', '.join(CSI_ACCOUNTANTS)} read it")
