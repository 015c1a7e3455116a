"""The ``steps`` accountants: record-level DP of S local DP-SGD steps per round (docs/privacy/steps.md#steps).

Each participant runs S steps of DP-SGD (Poisson record sampling at rate q, per-example
clipping to C, Gaussian noise sigma C per step) and the MAC delivers only the sum of the
participants' updates, plus artificial and channel noise. Two readings of that sum
(``CREDITS``):

- ``last-step`` (accountant ``steps``, the default; proven in docs/privacy/steps.md#steps): the
  release is a post-processing of the target user's own S-step transcript in which the last
  step also carries every noise that nobody uses again: the other participants' *last-step*
  noise (FedAvg: each of them starts the round from the public model, so its last step's
  noise leaves only through the sum; SCAFFOLD keeps it in c_k, so nothing of it is credited)
  and the artificial and channel noise. Per round: S - 1 steps of PoissonSampled(q,
  Gaussian(sigma)) and a last step at z_S = sqrt(sigma^2 + (m_t - 1) r^2 sigma^2 + x^2)
  (r: ``co_user_noise``, x: the artificial and channel noise in units of the record's
  sensitivity, ``transmit_to_record``).
- ``sum`` (accountant ``steps-sumdom``; NOT a guaranteed bound): the source's
  sum-domination (Heikkila et al., Thm. 4.6), every step at sigma sqrt(m_t). Another
  participant's later steps can cancel its own earlier noise (the counterexample:
  docs/privacy/steps.md#steps-sum-domination-and-its-counterexample), so this understates
  the leakage; kept to compare with the source's tables, flagged ``!``.

The unknown count of participants is replaced by a lower quantile m_t of 1 + (number of
*other* participants), a data-independent count, whose failure probability is added to
delta; a record is only used when its user takes part (user rate p). The pure math is
:mod:`otafl.privacy.analysis.steps`.

Local DP (a server colluding with the other users): the user's own S-step DP-SGD,
STEPS(1, q, sigma, S) per round, no credit and no user-sampling amplification.

Called with the common accountant arguments only (``step_noise=None``), it reads a
FedSGD round the same way: one step (S = 1, q = 1) of sensitivity Delta whose per-user
noise is the artificial noise, sqrt(sigma_k^2) / Delta in units of Delta, summed over the
m_t participants (one step: every participant's noise is its last step's, so both credits
agree); the channel noise is not credited.
"""

from __future__ import annotations

import math

import torch

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants.base import (
    REASON_NO_CENTRAL_NOISE,
    REASON_NO_LOCAL_NOISE,
    REASON_NO_STEP_NOISE,
    RoundBound,
    prepare_round,
)
from otafl.privacy.analysis.concentration import binomial_lower_quantile, poisson_binomial_lower_quantile
from otafl.privacy.analysis.steps import (
    StepRound,
    check_composition,
    compose_epsilon,
    round_epsilon,
    subsampled_gaussian_epsilon,
)
from otafl.privacy.facts import RoundFacts

__all__ = ["AUTO_COUNT_FAILURE", "CREDITS", "check_user_sampling", "steps_round", "steps_sumdom_round", "steps_totals", "round_mechanisms", "facts_kwargs"]

AUTO_COUNT_FAILURE = 1e-2
"""``delta_prime = "auto"``: the count quantile's failure probability is this times delta_l per round."""

CREDITS = ("last-step", "sum")
"""Which participants' step noise a round credits to the target (module docstring)."""

_P_GRID = 1e-3  # user rates (up) and last-step noise multipliers (down) are rounded to geometric grids of this ratio


def _grid_up(p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return p
    step = math.log1p(_P_GRID)
    return min(1.0, math.exp(math.ceil(math.log(p) / step - 1e-9) * step))


def _grid_down(z: float, floor: float) -> float:
    """z rounded down to the geometric grid, never below ``floor`` (less noise: conservative). z is
    at least ``floor`` in exact arithmetic (the last step has the head's noise and more); one ulp
    below it (sigma sqrt(m) computed twice) is ``floor``."""
    if not math.isfinite(z) or z <= 0.0:
        return z
    if z <= floor:
        return floor if z >= floor * (1.0 - 1e-12) else z
    step = math.log1p(_P_GRID)
    return max(floor, math.exp(math.floor(math.log(z) / step + 1e-9) * step))


from otafl.privacy.knobs import (  # noqa: E402,F401 (torch-free, for spec validation and the CLI)
    MAX_LOCAL_STEPS, MIN_STEP_NOISE, check_step_knobs, check_user_sampling)


def _check_steps(local_steps, record_sampling, step_noise, composition, update_clip_failure,
                 credit="last-step", co_user_noise=1.0, transmit_to_record=0.0):
    check_step_knobs(local_steps, step_noise)
    check_range("record_sampling", record_sampling, lo=0.0, hi=1.0, lo_open=True)
    if step_noise is None:
        if local_steps != 1 or record_sampling != 1.0:
            raise OtaflInputError("local_steps and record_sampling need step_noise (the per-step noise multiplier)")
    check_composition(composition)
    check_range("update_clip_failure", update_clip_failure, lo=0.0, hi=1.0)
    if credit not in CREDITS:
        raise OtaflInputError(f"credit = {credit!r} is not one of: {', '.join(CREDITS)}")
    check_range("co_user_noise", co_user_noise, lo=0.0, hi=1.0)
    check_range("transmit_to_record", transmit_to_record, lo=0.0, hi=math.inf, hi_open=True)


def _epsilons(rate, noise, steps: int, q: float, delta, composition: str, last=None) -> torch.Tensor:
    """eps at delta of STEPS(rate, q, noise, steps) per grid point ([B] tensors), the last
    step at noise multiplier ``last`` ([B]; None: ``noise``).

    One step with the PLD composition has a closed form (:func:`subsampled_gaussian_epsilon`);
    otherwise each distinct (rate, noise, last, delta) is accounted numerically (memoised),
    with the rate rounded up and the last step's noise down to fine grids (conservative) so
    that runs with varying p and channel reuse results.
    """
    if steps == 1 and last is not None:
        noise, last = last, None  # one step: it is the last
    if steps == 1 and composition == "pld":
        # revealed: (p PLD_1 + (1 - p) identity) at delta is the step at delta / p
        target = torch.where(rate > 0, delta / rate.clamp(min=1e-300), torch.ones_like(delta))
        eps = subsampled_gaussian_epsilon(rate=torch.full_like(rate, q), noise_multiplier=noise,
                                          delta=target.clamp(max=1.0))
        return torch.where((rate > 0) & (target < 1), eps, torch.zeros_like(eps))
    out = []
    lasts = [None] * rate.numel() if last is None else last.tolist()
    for p, z, zl, d in zip(rate.tolist(), noise.tolist(), lasts, delta.tolist()):
        r = StepRound(_grid_up(p), q, z, steps, None if zl is None else _grid_down(zl, z))
        out.append(round_epsilon(r, d, composition))
    return torch.tensor(out, dtype=torch.float64, device=rate.device)


def _round_parts(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l, delta_prime, users,
                 dim, step_noise):
    """Validated inputs, p_max, the count quantile m_t, the charged tail and sigma, on the grid."""
    if isinstance(delta_prime, str):
        if delta_prime != "auto":
            raise OtaflInputError(f"delta_prime = {delta_prime!r} is outside the allowed range (0, 1) or 'auto'")
        check_range("delta_l", float(torch.as_tensor(delta_l, dtype=torch.float64).reshape(-1)[0]), lo=0.0, hi=1.0,
                    lo_open=True, hi_open=True)
        delta_prime = AUTO_COUNT_FAILURE * torch.as_tensor(delta_l, dtype=torch.float64)
    x = prepare_round(participation_prob=participation_prob, noise_var=noise_var, alignment_gain=alignment_gain,
                      n0=n0, sensitivity=sensitivity, delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim)
    b = x.batch
    dev = x.participation_prob.device
    beta = torch.broadcast_to(x.delta_prime, b)
    if x.uniform:
        p = torch.broadcast_to(x.participation_prob[..., 0], b)
        others = torch.broadcast_to(x.users, b) - 1.0
        m_others = binomial_lower_quantile(users=others, p=p, delta_prime=beta)
        certain = (p == 0) | (p == 1) | (others == 0)
    else:
        ranked = torch.sort(torch.broadcast_to(x.participation_prob, (*b, x.participation_prob.shape[-1])),
                            dim=-1, descending=True).values[..., 1:]  # without the most likely user
        if ranked.shape[-1] == 0:
            m_others = torch.zeros(b, dtype=torch.float64, device=dev)
            certain = torch.ones(b, dtype=torch.bool, device=dev)
        else:
            m_others = poisson_binomial_lower_quantile(p=ranked, delta_prime=beta)
            certain = ((ranked == 0) | (ranked == 1)).all(-1)
    m = 1.0 + m_others
    tail = torch.where(certain, torch.zeros_like(beta), beta)
    p_max = torch.broadcast_to(x.max_participation_prob, b)
    if step_noise is None:
        sigma = torch.broadcast_to(torch.sqrt(x.min_noise_var) / x.sensitivity, b)
    else:
        sigma = torch.full(b, float(step_noise), dtype=torch.float64, device=dev)
    return x, p_max, m, tail, sigma


def _last_noise(x, m, sigma, *, credit: str, co_user_noise: float, transmit_to_record: float, step_noise):
    """The last step's noise multiplier z_S per grid point (module docstring).

    ``sum``: sigma sqrt(m) (every step). ``last-step``: sqrt(sigma^2 + (m - 1) r^2 sigma^2 +
    x^2) with x^2 = (m sigma_min^2 + N0 / c_t^2) ``transmit_to_record``^2, the participants'
    artificial noise and the channel noise (no channel noise is credited where c_t = 0). The
    FedSGD reading (``step_noise`` None) has one step whose noise is the artificial noise:
    sigma sqrt(m) under both credits.
    """
    if credit == "sum" or step_noise is None:
        return sigma * torch.sqrt(m)
    var = sigma.square() * (1.0 + (m - 1.0) * co_user_noise ** 2)
    if transmit_to_record > 0:
        chan = x.channel_noise_var
        channel = torch.where(torch.isfinite(chan), chan, torch.zeros_like(chan))
        var = var + (m * x.min_noise_var + channel) * transmit_to_record ** 2
    return torch.sqrt(var)


def steps_round(*, participation_prob, noise_var, alignment_gain, n0, sensitivity, delta_l, delta_prime="auto",
                users=None, dim=None, local_steps: int = 1, record_sampling: float = 1.0,
                step_noise: float | None = None, composition: str = "pld",
                update_clip_failure: float = 0.0, credit: str = "last-step", co_user_noise: float = 1.0,
                transmit_to_record: float = 0.0) -> RoundBound:
    """One round of the ``steps`` accountant (docs/privacy/steps.md#steps), on a grid.

    Common arguments: :func:`~otafl.privacy.accountants.base.prepare_round`. ``delta_prime``
    is the count quantile's failure probability beta_t ("auto": :data:`AUTO_COUNT_FAILURE`
    delta_l). Extra keywords (scalars):

    local_steps : S >= 1.   record_sampling : q in (0, 1].
    step_noise : sigma >= 0, the per-step noise multiplier (std / sensitivity) of one user;
        ``None``: the FedSGD reading (S = q = 1, sigma_k = sqrt(noise_var_k) / sensitivity).
    composition : ``pld`` | ``rdp`` | ``rdp-classic`` (how the S steps are composed and
        converted; docs/privacy/steps.md#steps).
    update_clip_failure : probability that some transmitter's update clip binds this round
        (docs/model.md#local-steps); added to the central delta.
    credit : ``last-step`` (sound, ``steps``) | ``sum`` (sum-domination, ``steps-sumdom``,
        not a guaranteed bound); module docstring.
    co_user_noise : r in [0, 1], the share (in std) of another participant's last-step noise
        credited to the target: D_min / D_max for FedAvg (records counts normalise the
        steps), 0 for SCAFFOLD (its c_k keeps that noise). Read by ``last-step`` only.
    transmit_to_record : the factor that turns a transmit-unit noise std into the record's
        noise multiplier, (B / L) q D_min / (eta_l C); 0: the artificial and channel noise are
        not credited. Read by ``last-step`` only.

    Per round: central eps at delta_l of STEPS(p_max, q, sigma, S) with the last step at
    z_S (:func:`_last_noise`), m_t = 1 + the lower beta_t-quantile of the others' count (worst
    user: the one with the largest p, whose removal leaves the smallest count);
    delta_central = delta_l + the charged tail (beta_t, 0 when the count is certain) +
    ``update_clip_failure``.
    Local eps at delta_l of STEPS(1, q, sigma_min, S), delta_local = p_max delta_l (joint
    convexity: the user's own noise only, participation visible to the server).
    """
    _check_steps(local_steps, record_sampling, step_noise, composition, update_clip_failure,
                 credit, co_user_noise, transmit_to_record)
    x, p_max, m, tail, sigma = _round_parts(participation_prob=participation_prob, noise_var=noise_var,
                                            alignment_gain=alignment_gain, n0=n0, sensitivity=sensitivity,
                                            delta_l=delta_l, delta_prime=delta_prime, users=users, dim=dim,
                                            step_noise=step_noise)
    b = x.batch
    dev = x.participation_prob.device
    z_last = torch.broadcast_to(_last_noise(x, m, sigma, credit=credit, co_user_noise=co_user_noise,
                                            transmit_to_record=transmit_to_record, step_noise=step_noise), b)
    z_head = sigma * torch.sqrt(m) if credit == "sum" else sigma
    d_l = torch.broadcast_to(x.delta_l, b)
    flat = lambda t: t.reshape(-1)  # noqa: E731
    eps_c = _epsilons(flat(p_max), flat(z_head), local_steps, record_sampling, flat(d_l), composition,
                      last=flat(z_last)).reshape(b)
    active = (p_max > 0).to(torch.float64)
    eps_l = _epsilons(flat(active), flat(sigma), local_steps, record_sampling, flat(d_l), composition).reshape(b)
    no_noise = (sigma == 0) & (p_max > 0)
    # FedSGD's reading: its noise is the artificial noise; local steps: the step noise
    why = (REASON_NO_CENTRAL_NOISE | REASON_NO_LOCAL_NOISE) if step_noise is None else REASON_NO_STEP_NOISE
    reason = no_noise.long() * why
    grid = lambda t: torch.broadcast_to(t, b)  # noqa: E731
    true = torch.ones((), dtype=torch.bool, device=dev)
    return RoundBound(
        epsilon_local=eps_l, delta_local=grid(p_max * x.delta_l),
        epsilon_central=eps_c, delta_central=(d_l + tail + update_clip_failure).clamp(max=1.0),
        users=grid(x.users), mean_participants=grid(x.mean_participants), delta_prime=tail, quantile=m,
        central_noise_std=None, central_sampling_rate=None, local_noise_std=None, local_sampling_rate=None,
        sensitivity=grid(x.sensitivity), classic_valid=grid(true if credit == "last-step" else ~true),
        classic_valid_local=grid(true), reason=reason)


def steps_sumdom_round(**kwargs) -> RoundBound:
    """:func:`steps_round` with the source's sum-domination (``credit = "sum"``): NOT a
    guaranteed bound for S > 1 with several participants (docs/privacy/steps.md#steps), flagged
    (``classic_valid`` false); kept to compare with the source's tables."""
    return steps_round(**{**kwargs, "credit": "sum"})


def _central_round(p: float, q: float, sigma: float, m: float, z_last: float, steps: int,
                   credit: str) -> StepRound:
    """The round's central :class:`StepRound`: S - 1 steps at sigma (``sum``: sigma sqrt(m)),
    the last at z_S rounded down to the grid; the user rate rounded up."""
    head = sigma * math.sqrt(m) if credit == "sum" else sigma
    return StepRound(_grid_up(p), q, head, steps, _grid_down(z_last, head))


def round_mechanisms(f: RoundFacts, *, delta_prime, delta_l: float, credit: str = "last-step") -> tuple[StepRound | None, StepRound | None, float]:
    """The central and local :class:`StepRound` of one round's facts and the charged count tail.

    (None for a round in which nobody can take part.) Uses the same count quantile and
    last-step noise as :func:`steps_round`.
    """
    kw = facts_kwargs(f, delta_l=delta_l, delta_prime=delta_prime)
    x, p_max_t, m_t, tail_t, sigma_t = _round_parts(**{k: kw[k] for k in (
        "participation_prob", "noise_var", "alignment_gain", "n0", "sensitivity", "delta_l", "delta_prime", "dim",
        "step_noise")}, users=None)
    p_max = float(p_max_t)
    if p_max == 0.0:
        return None, None, 0.0
    z_last = float(_last_noise(x, m_t, sigma_t, credit=credit, co_user_noise=kw["co_user_noise"],
                               transmit_to_record=kw["transmit_to_record"], step_noise=kw["step_noise"]))
    sigma, m = float(sigma_t), float(m_t)
    S, q = int(f.local_steps), float(f.record_sampling)
    central = _central_round(p_max, q, sigma, m, z_last, S, credit)
    local = StepRound(1.0, q, sigma, S)
    return central, local, float(tail_t)


def facts_kwargs(f: RoundFacts, *, delta_l: float, delta_prime) -> dict:
    """:func:`steps_round`'s keyword arguments for one round's facts."""
    return dict(participation_prob=f.participation_prob.to(torch.float64), noise_var=f.noise_var.to(torch.float64),
                alignment_gain=float(f.alignment_gain), n0=float(f.n0),
                sensitivity=float(f.sensitivity if f.record_clip is None else f.record_clip),  # C for local steps
                delta_l=delta_l, delta_prime=delta_prime, dim=int(f.dim), local_steps=int(f.local_steps),
                record_sampling=float(f.record_sampling), step_noise=f.step_noise,
                update_clip_failure=float(f.update_clip_failure), co_user_noise=float(f.co_user_noise),
                transmit_to_record=float(f.transmit_to_record))


def steps_totals(*, participation_prob, users, noise_var, sensitivity, delta_l, rounds: int, delta_prime="auto",
                 local_steps: int = 1, record_sampling: float = 1.0, step_noise: float | None = None,
                 composition: str = "pld", delta_target: float | None = None,
                 credit: str = "last-step") -> dict[str, torch.Tensor]:
    """Totals of T identical rounds on a uniform grid (``otafl bound --accountant steps --rounds T``).

    Identical users (co-user noise credited in full, r = 1) and no credit for the artificial
    and channel noise (``bound`` knows no update normalisation), so the rounds of a grid point
    are identical: central STEPS(p, q, sigma, S) with the last step at
    sigma sqrt(m) (``sum``: every step at sigma sqrt(m)) and local STEPS(1, q, sigma, S),
    each composed T times with ``composition``. Returns [...] tensors
    ``epsilon_central_total``, ``delta_central_total`` (delta_dp + T tail, delta_dp =
    ``delta_target`` - T tail or delta_l; +inf where T tail reaches the target),
    ``epsilon_local_total``, ``delta_local_total`` (at ``delta_target``, or delta_l).
    """
    check_range("rounds", rounds, lo=1)
    _check_steps(local_steps, record_sampling, step_noise, composition, 0.0, credit)
    x, p_max, m, tail, sigma = _round_parts(participation_prob=participation_prob, noise_var=noise_var,
                                            alignment_gain=1.0, n0=0.0, sensitivity=sensitivity, delta_l=delta_l,
                                            delta_prime=delta_prime, users=users, dim=None, step_noise=step_noise)
    b = x.batch
    d_l = torch.broadcast_to(x.delta_l, b).reshape(-1).tolist()
    out = {k: [] for k in ("epsilon_central_total", "delta_central_total", "epsilon_local_total",
                           "delta_local_total")}
    for p, mm, tl, sg, dl in zip(p_max.reshape(-1).tolist(), m.reshape(-1).tolist(), tail.reshape(-1).tolist(),
                                 sigma.reshape(-1).tolist(), d_l):
        charged = rounds * tl
        delta_dp = dl if delta_target is None else delta_target - charged
        d_loc = dl if delta_target is None else delta_target
        central = _central_round(p, record_sampling, sg, mm, sg * math.sqrt(mm), local_steps, credit)
        local = StepRound(1.0 if p > 0 else 0.0, record_sampling, sg, local_steps)
        out["epsilon_central_total"].append(compose_epsilon([(central, rounds)], delta=delta_dp,
                                                            composition=composition) if delta_dp > 0 else math.inf)
        out["delta_central_total"].append(min(1.0, delta_dp + charged) if delta_target is None else delta_target)
        out["epsilon_local_total"].append(compose_epsilon([(local, rounds)], delta=d_loc, composition=composition))
        out["delta_local_total"].append(d_loc if p > 0 else 0.0)
    return {k: torch.tensor(v, dtype=torch.float64).reshape(b) for k, v in out.items()}
