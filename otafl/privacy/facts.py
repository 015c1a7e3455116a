"""What one round reveals to the accountants: privacy as data (dp_accounting's DpEvent style).

The FL loop builds one :class:`RoundFacts` per round; the accountants in
:mod:`otafl.privacy.accountants` interpret a list of them. Nothing here knows about
training: the facts are the sampling law, the noise levels and the channel's gain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range

__all__ = ["DigitalMechanism", "RoundFacts", "stack_facts", "uniform_facts"]


@dataclass(frozen=True)
class DigitalMechanism:
    """What a digital (secure-aggregation) round adds to the facts (docs/privacy/digital.md#digital).

    name : ``gaussian`` (continuous shares), ``skellam``, ``ddg`` or ``pbm``.
    noise_var : per-user noise variance per coordinate, gradient units (gaussian, skellam, ddg).
    scale : integer levels per gradient unit (skellam, ddg; nan otherwise).
    coordinates : D, coordinates sent per user (the padded dimension when rotated).
    box : c, per-coordinate bound of the rotated vector (pbm; inf otherwise).
    theta, trials : the PBM's theta and m (nan and 0 otherwise).
    bits : bits per coordinate (the field Z_{2^bits}).
    """

    name: str
    noise_var: float = 0.0
    scale: float = float("nan")
    coordinates: int = 1
    box: float = float("inf")
    theta: float = float("nan")
    trials: int = 0
    bits: int = 32


@dataclass(frozen=True, eq=False)
class RoundFacts:
    """What one round reveals to the accountants (privacy as data, dp_accounting style).

    Attributes
    ----------
    participation_prob : [K], float64 -- p_{k,t} (after any truncation policy).
    noise_var : [K], float64          -- sigma_{k,t}^2, artificial noise variance per
                                         coordinate, in gradient units.
    alignment_gain : float            -- c_t (>= 0).
    n0 : float                        -- receiver noise variance N0 (0 = no channel noise).
    sensitivity : float               -- Delta, l2-sensitivity of one user's clipped
                                         gradient to one record (2L by default).
    dim : int                         -- model dimension d.
    participants : int                -- realised |K_t|; informational only, accountants
                                         must not use it (the adversary does not see it).

    Local steps (read by the ``steps`` accountant only; the defaults describe FedSGD):

    local_steps : int                 -- S, DP-SGD steps per participant and round.
    record_sampling : float           -- q, Poisson rate of a record per local step.
    step_noise : float or None        -- sigma, the per-step noise multiplier of one user
                                         (std / record_clip); None: no step noise (FedSGD).
    record_clip : float or None       -- C, the per-example clipping norm of the local steps
                                         (their add/remove sensitivity); None: FedSGD.
    update_clip_failure : float       -- probability that some transmitter's update was
                                         clipped at the power normalisation (added to delta).
    co_user_noise : float             -- r in [0, 1]: the share (std) of another participant's
                                         last-step noise that no state carries on, in the
                                         target's units (FedAvg: D_min / D_max; SCAFFOLD: 0).
    transmit_to_record : float        -- turns a transmit-unit noise std into the record's
                                         noise multiplier, (B / L) q D_min / (eta_l C); 0: the
                                         artificial and channel noise are not credited.
    digital : DigitalMechanism | None -- the digital mechanism of a ``digital`` round (the
                                         ``digital`` accountant reads it; None otherwise).
    csi_ratio_min, csi_ratio_max : float -- estimated CSI: the smallest and largest gain
                                         mismatch r_k = h_k / h_hat_k over the users who may
                                         transmit (1, 1: perfect CSI). Read through
                                         :mod:`otafl.privacy.csi` (docs/privacy/csi.md#csi).
    """

    participation_prob: Tensor
    noise_var: Tensor
    alignment_gain: float
    n0: float
    sensitivity: float
    dim: int
    participants: int
    local_steps: int = 1
    record_sampling: float = 1.0
    step_noise: float | None = None
    record_clip: float | None = None
    update_clip_failure: float = 0.0
    co_user_noise: float = 1.0
    transmit_to_record: float = 0.0
    digital: DigitalMechanism | None = None
    csi_ratio_min: float = 1.0
    csi_ratio_max: float = 1.0


def uniform_facts(users: int, p: float, sigma2: float, alignment_gain: float, n0: float, sensitivity: float,
                  dim: int, device=None) -> RoundFacts:
    """One round of K identical users (participation p, noise sigma2 each), as ``otafl bound``
    and ``otafl audit`` state a grid point's rounds."""
    f64 = dict(dtype=torch.float64, device=device)
    return RoundFacts(participation_prob=torch.full((int(users),), float(p), **f64),
                      noise_var=torch.full((int(users),), float(sigma2), **f64), alignment_gain=float(alignment_gain),
                      n0=float(n0), sensitivity=float(sensitivity), dim=int(dim), participants=0)


def stack_facts(facts: list[RoundFacts]) -> dict[str, Tensor]:
    """Stack T rounds of facts into batched tensors (round dimension first).

    Returns
    -------
    dict with ``participation_prob`` [T, K], ``noise_var`` [T, K], ``alignment_gain`` [T],
    ``n0`` [T], ``sensitivity`` [T] (all float64, on the device of the first round's
    ``participation_prob``) and ``dim`` [T] (int64).

    Raises
    ------
    OtaflInputError
        No rounds, a number of users that changes between rounds, or a value outside
        its range (p outside [0, 1], negative variance, gain or N0, Delta <= 0).
    """
    if len(facts) == 0:
        raise OtaflInputError("facts = [] is outside the allowed range (at least one round)")
    device = torch.as_tensor(facts[0].participation_prob).device
    users = torch.as_tensor(facts[0].participation_prob).numel()
    for t, f in enumerate(facts):
        if torch.as_tensor(f.participation_prob).numel() != users:
            raise OtaflInputError(f"facts[{t}].participation_prob has {torch.as_tensor(f.participation_prob).numel()} "
                                  f"users, outside the allowed range (the {users} users of round 0)")
    p = torch.stack([torch.as_tensor(f.participation_prob, dtype=torch.float64, device=device).reshape(-1)
                     for f in facts])
    var = torch.stack([torch.as_tensor(f.noise_var, dtype=torch.float64, device=device).reshape(-1)
                       .expand(users) for f in facts])
    for t, f in enumerate(facts):
        check_range(f"facts[{t}].alignment_gain", f.alignment_gain, lo=0.0)
        check_range(f"facts[{t}].n0", f.n0, lo=0.0)
        check_range(f"facts[{t}].sensitivity", f.sensitivity, lo=0.0, lo_open=True)
        check_range(f"facts[{t}].dim", f.dim, lo=1)
    if not bool(((p >= 0) & (p <= 1)).all()):
        bad = p[~((p >= 0) & (p <= 1))][0].item()
        raise OtaflInputError(f"participation_prob = {bad!r} is outside the allowed range [0, 1]")
    if not bool((var >= 0).all()):
        bad = var[~(var >= 0)][0].item()
        raise OtaflInputError(f"noise_var = {bad!r} is outside the allowed range [0, inf)")

    def col(name):
        return torch.tensor([float(getattr(f, name)) for f in facts], dtype=torch.float64, device=device)

    return {
        "participation_prob": p,
        "noise_var": var,
        "alignment_gain": col("alignment_gain"),
        "n0": col("n0"),
        "sensitivity": col("sensitivity"),
        "dim": torch.tensor([int(f.dim) for f in facts], dtype=torch.int64, device=device),
    }
