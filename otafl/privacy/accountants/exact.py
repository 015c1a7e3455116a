"""The ``exact`` accountant: the numerically integrated leakage of one over-the-air round.

No closed form and no published tool covers this mechanism, so the per-round privacy
profile delta(eps) is integrated numerically, as an *upper bound* with explicit error
control (:mod:`otafl.privacy.analysis.ota_round`; derivation in docs/privacy/exact.md#exact).
This module adapts it to the accountant interface (:func:`exact_round`, a
:class:`~otafl.privacy.accountants.base.RoundBound` per round, unrounded, for grids and
sweeps of single rounds) and composes rounds with privacy-loss distributions
(:func:`compose_exact`, through :mod:`otafl.privacy.accountants.exact_run`, whose
rounded and cached rows ``account_run`` uses for runs).

Worst-case pair: antipodal +-Delta/2 around the no-participation mean. For Delta = 2L
(minibatch clipping, the paper's setting) no other pair in the L-ball is farther apart;
that no closer pair leaks more was checked numerically in d = 1, not proven. With
per-sample clipping (Delta < 2L) a supremum over the pair's offset would be needed,
which is not computed (the accountant interface carries Delta, not L).
"""

from __future__ import annotations

import math

import torch

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants.base import (
    REASON_NO_CENTRAL_NOISE,
    REASON_NO_LOCAL_NOISE,
    REASON_BEYOND_RANGE,
    RoundBound,
    prepare_round,
)
from otafl.privacy.analysis.cells import DEFAULT_GRID, CellGrid
from otafl.privacy.accountants.exact_run import (DEFAULT_RESOLUTION, PROFILE_GRID, Resolution, compose_exact_rounds,
                                                 run_row_keys)
from otafl.privacy.analysis.ota_rows import central_rows, local_rows, rows_epsilon

__all__ = ["exact_round", "compose_exact"]

_DT = torch.float64


def exact_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l,
                delta_prime="auto", users=None, dim=None, grid: CellGrid = DEFAULT_GRID):
    r"""Per-round LDP and central DP by numerical integration (docs/privacy/exact.md#exact).

    Same arguments as ``paper_round``/``tight_round`` (see
    :func:`~otafl.privacy.accountants.base.prepare_round`). ``dim=None`` gives the
    dimension-free bound (d -> inf, participation revealed by the norm; valid for every
    d, cheap, but without the amplification that a finite d leaves). ``delta_prime`` is
    validated but unused: there is no concentration step.

    - central: eps at delta = delta_l of the round's bound (worst user group, see
      :func:`~otafl.privacy.analysis.ota_rows.central_rows`); ``delta_central`` = delta_l,
      at most ``tight``'s q delta_l + delta'. The per-round numbers are directly comparable.
    - local: for each user, eps at delta = p_k delta_l with n = 0 (only the user's own
      noise and the channel protect it); the worst user is reported, ``delta_local`` =
      max_k p_k delta_l (as ``paper``/``tight``). Unlike ``tight``'s LDP this does not
      assume user k's noise is present when it is absent: in high dimension with little
      channel noise the residual's norm reveals participation and the sampling
      amplification disappears, so ``exact``'s LDP can exceed ``tight``'s.

    The RDP views of :class:`RoundBound` are ``None`` (the sampled-Gaussian view is the
    fixed-noise model that ``exact`` does not assume): compose ``exact`` with
    :func:`compose_exact` (privacy-loss distributions).
    ``quantile`` is the smallest number of participants (n + 1) the central sum keeps:
    P(|K_t| < quantile) is at most the truncated tail mass, min(1e-12, 1e-6 delta_l),
    which is charged to delta. ``delta_prime`` is 0.
    """
    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var,
                      alignment_gain=alignment_gain, n0=n0, sensitivity=sensitivity,
                      delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    b = x.batch
    B = math.prod(b)
    dev = x.participation_prob.device

    def flat(t, users_dim=False):
        if users_dim:
            return torch.broadcast_to(t, (*b, t.shape[-1])).reshape(B, t.shape[-1])
        return torch.broadcast_to(t, b).reshape(B)

    if x.uniform:
        p_all, s2_all = flat(x.participation_prob[..., 0]), flat(x.noise_var[..., 0])
        users_flat = flat(x.users)
    else:
        p_all = flat(x.participation_prob, True)
        s2_all = torch.broadcast_to(x.noise_var, p_all.shape) if x.noise_var.shape[-1] == 1 \
            else flat(x.noise_var, True)
        users_flat = None
    ch, sens, dl = flat(x.channel_noise_var), flat(x.sensitivity), flat(x.delta_l)
    dims = flat(x.dim).round().long() if x.dim is not None else torch.zeros(B, dtype=torch.long,
                                                                           device=dev)
    eps_c = torch.zeros(B, dtype=_DT, device=dev)
    eps_l = torch.zeros(B, dtype=_DT, device=dev)
    fewest = torch.zeros(B, dtype=_DT, device=dev)
    for d in torch.unique(dims).tolist():
        idx = torch.nonzero(dims == d).reshape(-1)
        sub = lambda t: None if t is None else t[idx]  # noqa: E731
        dd = None if d == 0 else int(d)
        crow = central_rows(participation_prob=sub(p_all), noise_var=sub(s2_all),
                            channel_noise_var=sub(ch), sensitivity=sub(sens), dim=dd,
                            delta=sub(dl), users=sub(users_flat))
        lrow = local_rows(participation_prob=sub(p_all), noise_var=sub(s2_all),
                          channel_noise_var=sub(ch), sensitivity=sub(sens), dim=dd,
                          delta_l=sub(dl), uniform=x.uniform)
        eps_c[idx], fewest[idx] = rows_epsilon(crow, len(idx), grid=grid)
        eps_l[idx], _ = rows_epsilon(lrow, len(idx), grid=grid)
    shape = lambda t: t.reshape(b)  # noqa: E731
    no_central = (x.min_noise_var == 0) & (x.channel_noise_var == 0)
    no_local = no_central if x.uniform else (
        ((x.noise_var + x.channel_noise_var.unsqueeze(-1)) == 0)
        & (x.participation_prob > 0)).any(-1)
    eps_c, eps_l = shape(eps_c), shape(eps_l)
    reason = (torch.isinf(eps_c) & no_central).long() * REASON_NO_CENTRAL_NOISE \
        + (torch.isinf(eps_l) & no_local).long() * REASON_NO_LOCAL_NOISE \
        + ((torch.isinf(eps_c) & ~no_central) | (torch.isinf(eps_l) & ~no_local)).long() * REASON_BEYOND_RANGE
    grid_ = lambda t: torch.broadcast_to(t, b)  # noqa: E731
    true = torch.ones((), dtype=torch.bool, device=dev)
    return RoundBound(
        epsilon_local=eps_l, delta_local=grid_(x.max_participation_prob * x.delta_l),
        epsilon_central=eps_c, delta_central=grid_(x.delta_l), users=grid_(x.users),
        mean_participants=grid_(x.mean_participants),
        delta_prime=grid_(torch.zeros((), dtype=_DT, device=dev)),
        quantile=fewest.reshape(b),
        central_noise_std=None, central_sampling_rate=None, local_noise_std=None,
        local_sampling_rate=None, sensitivity=grid_(x.sensitivity), classic_valid=grid_(true),
        classic_valid_local=grid_(true), reason=grid_(reason))


def compose_exact(facts, *, delta_target: float, kind: str = "central", rounds: int | None = None,
                  points: int = 64, grid: CellGrid = PROFILE_GRID,
                  resolution: Resolution = DEFAULT_RESOLUTION) -> dict:
    r"""Total epsilon over rounds of the ``exact`` accountant, via privacy-loss distributions.

    The rounds' rows (:func:`~otafl.privacy.accountants.exact_run.run_row_keys`, rounded
    pessimistically as ``resolution`` says where they vary over the rounds) are composed by
    :func:`~otafl.privacy.accountants.exact_run.compose_exact_rounds`: each distinct
    round's profile (the maximum over its rows) with its repetitions, pessimistic
    connect-the-dots PLDs (dp_accounting). :func:`~otafl.privacy.accountants.run.account_run`
    uses the same function for the totals of a run, so the two agree on the same rounds.

    Parameters
    ----------
    facts : a :class:`otafl.privacy.facts.RoundFacts`, or a list of them (one per round).
    delta_target : total delta of the run, in (0, 1).
    kind : "central" or "local" (the worst user: per round the pointwise maximum of the
        users' profiles, which dominates each user's).
    rounds : with a single RoundFacts, the number of identical rounds T.
    points : grid points on [0, eps_max] (the gap is eps_max / points, common to all
        rounds). The chords make the result pessimistic by ~0.2% in eps at 50 points
        (checked against the Gaussian mechanism composed in closed form).
    grid : the s cells of eq. (1) in the profiles (as :func:`~otafl.privacy.accountants.run.account_run`'s).
    resolution : the pessimistic grids (``NO_ROUNDING`` for none).

    Returns
    -------
    dict: ``epsilon`` (float), ``delta`` (= delta_target), ``rounds`` (T), ``points`` (N), ``gap`` (the
    PLD's discretisation interval), ``distinct_rounds``.
    """
    check_range("delta_target", delta_target, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if kind not in ("central", "local"):
        raise OtaflInputError(f"kind = {kind!r} is outside the allowed range {{central, local}}")
    if not isinstance(facts, (list, tuple)):
        facts = [facts] * int(rounds if rounds is not None else 1)
    elif rounds is not None:
        raise OtaflInputError("rounds is only for a single RoundFacts (a list already has its rounds)")
    T = len(facts)
    if T < 1:
        raise OtaflInputError("facts = [] is outside the allowed range (at least one round)")
    keys = run_row_keys(facts, kind, resolution)
    out = compose_exact_rounds(keys, delta_target=delta_target, points=points, grid=grid)
    return {"epsilon": out["epsilon"], "delta": delta_target, "rounds": T, "gap": out["gap"],
            "points": out.get("points", 0), "distinct_rounds": out["distinct_rounds"]}
