r"""Record-level DP of S local DP-SGD steps per round, released through the participants' sum.

One round, seen by one record of user k (docs/privacy/steps.md#steps): with probability p the
user takes part and runs S steps of DP-SGD; at every step the record enters the user's
minibatch with probability q (Poisson), its clipped gradient moves the step's sum by at
most the sensitivity, and the step adds Gaussian noise. The release is a post-processing
of the user's own S steps (an adaptive composition) in which the last step also carries the
noise that nobody uses again (the other participants' last-step noise under FedAvg, the
artificial and channel noise): S - 1 steps of PoissonSampled(q, Gaussian(z)) and a last one
of PoissonSampled(q, Gaussian(z_S)), z_S >= z (``StepRound.last_noise``; the accountant in
:mod:`otafl.privacy.accountants.steps` chooses z_S; the source's sum-domination, kept as
``steps-sumdom``, sets every step to z = sigma sqrt(m)). One round is therefore the mechanism

    STEPS(p, q, z, S, z_S) = with probability p: S - 1 steps of PoissonSampled(q, Gaussian(z))
                             and one of PoissonSampled(q, Gaussian(z_S)), otherwise: nothing,

under add/remove adjacency with unit sensitivity. The user coin is revealed: the adversary
may learn whether user k took part (over the air its own noise adds to the aggregate's
variance, which a high-dimensional output shows, docs/privacy/exact.md#exact; and the user's
other records move its update whether or not the target record is in it). The round's pair
is the mixture with the branch revealed, delta(eps) = p delta_S(eps) (joint convexity); over
T rounds the number of rounds the user takes part is binomial, which the composition of the
mixtures accounts exactly. (Reading the coin as hidden, p-subsampling the record, is not
sound at record level: "user absent" is not "user present, record absent";
docs/privacy/steps.md#steps-user-sampling.)

Compositions (:data:`COMPOSITIONS`): ``pld`` (dp_accounting privacy-loss distributions,
pessimistic), ``rdp`` (Renyi DP, improved conversion of Balle et al. 2020 via
dp_accounting's ``compute_epsilon``) and ``rdp-classic`` (Mironov 2017, Prop. 3:
eps = min_alpha RDP_alpha + log(1/delta)/(alpha - 1)).

dp_accounting is imported on first use. Everything here is pure math on floats.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.analysis.pld import pld_fits, take_notes  # noqa: F401 - take_notes re-exported
from otafl.privacy.names import COMPOSITIONS

__all__ = [
    "COMPOSITIONS",
    "composition_used",
    "PLD_DISCRETIZATION",
    "take_notes",
    "StepRound",
    "round_pld",
    "round_rdp",
    "rdp_orders",
    "rdp_to_epsilon",
    "compose_epsilon",
    "round_epsilon",
    "subsampled_gaussian_epsilon",
]

# COMPOSITIONS (how rounds and steps are composed and turned into (eps, delta)): otafl.privacy.names,
# torch-free, so that the CLI offers them without loading this module.

PLD_DISCRETIZATION = 1e-4
"""Loss discretisation of every PLD (dp_accounting's default, PLDAccountant's too)."""


@dataclass(frozen=True, order=True)
class StepRound:
    """One round's dominating mechanism for a record (unit sensitivity).

    user_rate : p in [0, 1], the probability that the record's user takes part.
    record_rate : q in (0, 1], the probability that a step's minibatch holds the record.
    noise_multiplier : z >= 0, std of the step's (summed) noise over the sensitivity; 0: no
        noise (eps = +inf), +inf: no leakage.
    steps : S >= 1 steps per round.
    last_noise : z_S >= noise_multiplier, the noise multiplier of the round's last step
        (the first S - 1 steps have ``noise_multiplier``); ``None``: the same as the others.
        With S = 1 the one step is the last: it is normalised to ``noise_multiplier`` =
        z_S, ``last_noise`` = None (so equal mechanisms compare and hash equal).
    """

    user_rate: float
    record_rate: float
    noise_multiplier: float
    steps: int = 1
    last_noise: float | None = None

    def __post_init__(self):
        check_range("user_rate", self.user_rate, lo=0.0, hi=1.0)
        check_range("record_sampling", self.record_rate, lo=0.0, hi=1.0, lo_open=True)
        check_range("noise_multiplier", self.noise_multiplier, lo=0.0)
        if int(self.steps) != self.steps or self.steps < 1:
            raise OtaflInputError(f"local_steps = {self.steps!r} is outside the allowed range (integers >= 1)")
        if self.last_noise is not None:
            check_range("last_noise", self.last_noise, lo=self.noise_multiplier)
            if self.steps == 1:
                object.__setattr__(self, "noise_multiplier", float(self.last_noise))
            if self.steps == 1 or self.last_noise == self.noise_multiplier:
                object.__setattr__(self, "last_noise", None)

    @property
    def last(self) -> float:
        """The last step's noise multiplier z_S."""
        return self.noise_multiplier if self.last_noise is None else self.last_noise

    @property
    def silent(self) -> bool:
        """No leakage at all: the user never takes part, or infinite noise in every step."""
        return self.user_rate == 0.0 or math.isinf(self.noise_multiplier)

    @property
    def open(self) -> bool:
        """Infinite leakage: the user may take part and some step has no noise."""
        return not self.silent and self.noise_multiplier == 0.0


def check_composition(composition: str) -> str:
    if composition not in COMPOSITIONS:
        raise OtaflInputError(f"composition = {composition!r} is not one of: {', '.join(COMPOSITIONS)}")
    return composition


class _QuietAbsl:
    """dp_accounting logs (absl) a warning per fractional order it cannot integrate at small
    noise; those orders are dropped (RDP +inf there), which is conservative. Silence them."""

    def __enter__(self):
        self.logger = logging.getLogger("absl")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)


# --------------------------------------------------------------------------- PLD


def _pld_module():
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution


@functools.lru_cache(maxsize=256)
def _step_pld(record_rate: float, noise_multiplier: float):
    """One PoissonSampled(q, Gaussian(z)) step (dp_accounting, pessimistic); None for z = inf."""
    if math.isinf(noise_multiplier):
        return None
    return _pld_module().from_gaussian_mechanism(
        standard_deviation=noise_multiplier, sampling_prob=record_rate,
        value_discretization_interval=PLD_DISCRETIZATION)


@functools.lru_cache(maxsize=64)
def _steps_pld(record_rate: float, noise_multiplier: float, steps: int):
    """``steps`` steps of PoissonSampled(q, Gaussian(z)) (dp_accounting, pessimistic): the head
    that the rounds of a run share (their last steps differ), computed once."""
    pld = _step_pld(record_rate, noise_multiplier)
    return pld.self_compose(steps) if steps > 1 else pld


@functools.lru_cache(maxsize=256)
def _inner_pld(record_rate: float, noise_multiplier: float, steps: int, last_noise: float | None = None):
    """S steps of PoissonSampled(q, Gaussian(z)), the last at z_S = ``last_noise`` when given
    (dp_accounting, pessimistic; adaptive composition of the steps)."""
    if last_noise is None:
        return _steps_pld(record_rate, noise_multiplier, steps)
    head = _steps_pld(record_rate, noise_multiplier, steps - 1)
    last = _step_pld(record_rate, last_noise)
    return head if last is None else head.compose(last)


def _identity_pld():
    return _pld_module().identity(value_discretization_interval=PLD_DISCRETIZATION)


@functools.lru_cache(maxsize=128)
def round_pld(r: StepRound):
    """The privacy-loss distribution of one round (``None`` when the round leaks nothing):
    the mixture p PLD_S + (1 - p) identity (dp_accounting's ``compute_mixture``: the pair with
    the user's branch revealed). Raises for a round without noise (check ``r.open`` first).
    """
    if r.silent:
        return None
    if r.open:
        raise OtaflInputError("a round without noise has no privacy-loss distribution (eps = +inf)")
    inner = _inner_pld(r.record_rate, r.noise_multiplier, r.steps, r.last_noise)
    if r.user_rate == 1.0:
        return inner
    return inner.compute_mixture(_identity_pld(), r.user_rate)


# --------------------------------------------------------------------------- RDP


def rdp_orders(rounds: Sequence[StepRound]) -> tuple[float, ...]:
    """dp_accounting's default Renyi orders (the same for every round)."""
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    del rounds
    return tuple(float(a) for a in DEFAULT_RDP_ORDERS)


@functools.lru_cache(maxsize=1024)
def _rdp_step(q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of one PoissonSampled(q, Gaussian(z)) step at ``orders`` (dp_accounting)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    with _QuietAbsl():
        step = rdp._compute_rdp_poisson_subsampled_gaussian  # noqa: SLF001 (no public per-step RDP)
        out = np.asarray(step(q, z, list(orders)), dtype=np.float64)
    out.setflags(write=False)
    return out


def _rdp_steps(q: float, r: StepRound, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of the round's S steps at record rate ``q``: (S - 1) rdp_1(z) + rdp_1(z_S)
    (adaptive composition; a step with z = inf adds nothing)."""
    head = (r.steps - 1) * _rdp_step(q, r.noise_multiplier, orders) if r.steps > 1 else 0.0
    last = 0.0 if math.isinf(r.last) else _rdp_step(q, r.last, orders)
    return np.zeros(len(orders)) + head + last


@functools.lru_cache(maxsize=512)
def round_rdp(r: StepRound, orders: tuple[float, ...]) -> np.ndarray:
    r"""RDP of one round at ``orders`` (read-only array; +inf for a round without noise): the
    revealed mixture, both directions,

        exp((a - 1) RDP_a) = (1 - p) + p exp((a - 1) rdp_S(a)),

    with rdp_S = (S - 1) rdp_1(z) + rdp_1(z_S) the S steps and rdp_1 one PoissonSampled(q,
    Gaussian(z)) step (dp_accounting).
    """
    a = np.asarray(orders, dtype=np.float64)
    if r.silent:
        return np.zeros_like(a)
    if r.open:
        return np.full_like(a, np.inf)
    p = r.user_rate
    inner = _rdp_steps(r.record_rate, r, tuple(orders))
    if p == 1.0:
        return inner
    with np.errstate(over="ignore"):
        return np.logaddexp(math.log1p(-p), math.log(p) + (a - 1.0) * inner) / (a - 1.0)


def rdp_to_epsilon(rdp: np.ndarray, orders: Sequence[float], delta: float, *, classic: bool) -> float:
    """(eps, delta) from an RDP curve: Mironov's classic conversion (``classic``) or the
    improved one of Balle et al. (2020) (dp_accounting ``compute_epsilon``)."""
    rdp = np.asarray(rdp, dtype=np.float64)
    a = np.asarray(orders, dtype=np.float64)
    if np.all(rdp == 0):
        return 0.0
    if not np.isfinite(rdp).any():
        return math.inf
    if classic:
        return float(max(0.0, np.min(rdp + math.log(1.0 / delta) / (a - 1.0))))
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    eps, _ = compute_epsilon(list(a), list(rdp), delta)
    return float(max(0.0, eps)) if math.isfinite(eps) else math.inf


# --------------------------------------------------------------------------- both


def compose_epsilon(rounds: Sequence[tuple[StepRound, int]], *, delta: float, composition: str = "pld") -> float:
    """Total eps at ``delta`` of the rounds, given as (StepRound, repetitions) pairs.

    ``pld``: the rounds' PLDs (:func:`round_pld`) self-composed and composed; ``rdp`` /
    ``rdp-classic``: the rounds' RDP curves (:func:`round_rdp`) summed, then converted.
    0 when no round leaks, +inf when some round may run without noise.
    """
    check_composition(composition)
    check_range("delta", delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    active = [(r, int(c)) for r, c in rounds if int(c) > 0 and not r.silent]
    if not active:
        return 0.0
    if any(r.open for r, _ in active):
        return math.inf
    if composition == "pld" and not pld_fits(active, PLD_DISCRETIZATION):
        composition = "rdp"
    if composition == "pld":
        from otafl.privacy.analysis.pld import compose_counted, epsilon_for_delta

        total = compose_counted((round_pld(r), count) for r, count in active)
        return float(max(0.0, epsilon_for_delta(total, delta)))
    orders = rdp_orders([r for r, _ in active])
    rdp = sum(count * round_rdp(r, orders) for r, count in active)
    return rdp_to_epsilon(rdp, orders, delta, classic=composition == "rdp-classic")


def composition_used(rounds: Sequence[tuple[StepRound, int]], composition: str = "pld") -> str:
    """The composition :func:`compose_epsilon` applies to ``rounds``: ``composition``, except
    ``pld`` where the PLD would be too large (:func:`pld_fits`): ``rdp``, which it falls back to
    (the label a run reports beside its totals)."""
    active = [(r, int(c)) for r, c in rounds if int(c) > 0 and not r.silent]
    if composition == "pld" and active and not any(r.open for r, _ in active) \
            and not pld_fits(active, PLD_DISCRETIZATION):
        return "rdp"
    return composition


def round_epsilon(r: StepRound, delta: float, composition: str = "pld") -> float:
    """eps at ``delta`` of a single round (:func:`compose_epsilon` of one round), memoised
    (``pld`` falls back to ``rdp`` where the PLD would be too large, :func:`pld_fits`)."""
    if composition == "pld" and not r.silent and not r.open and not pld_fits([(r, 1)], PLD_DISCRETIZATION):
        composition = "rdp"
    return _round_epsilon(r, delta, composition)


@functools.lru_cache(maxsize=4096)
def _round_epsilon(r: StepRound, delta: float, composition: str) -> float:
    return compose_epsilon([(r, 1)], delta=delta, composition=composition)


# --------------------------------------------------------------------------- one step, closed form


def subsampled_gaussian_epsilon(*, rate, noise_multiplier, delta, iterations: int = 80):
    r"""Exact eps(delta) of one PoissonSampled(rate, Gaussian(z)) step, batched (torch float64).

    The step's profile in both directions from the Gaussian's G(eps) (Balle & Wang 2018,
    unit sensitivity; its pair is symmetric) through the exact identities of a subsampled
    pair A' = (1 - rate) B + rate A against B, for every pair (A, B) and gamma = e^eps:

        remove: H_gamma(A' || B) = rate G(log(1 + (e^eps - 1) / rate)),
        add:    H_gamma(B || A') = (1 - e^eps (1 - rate))_+ G(log(e^eps rate / (1 - e^eps (1 - rate)))),

    and eps(delta) is the smallest eps >= 0 where both are <= delta, by bisection on
    [0, eps_G(delta)] (the unsampled Gaussian's eps bounds it). No discretisation: this is
    the exact value that dp_accounting's pessimistic PLD approaches from above. Returns 0
    where rate = 0 or z = inf, +inf where z = 0 < rate.
    """
    import torch

    from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon, as_float64, gaussian_hockey_stick

    r, z, delta = torch.broadcast_tensors(*as_float64(rate, noise_multiplier, delta))
    silent = (r == 0) | torch.isinf(z)
    open_ = (z == 0) & ~silent
    zs = torch.where(silent | open_, torch.ones_like(z), z)
    rs = torch.where(silent, torch.ones_like(r), r)
    one = torch.ones_like(zs)

    def profile(eps):
        e = torch.exp(eps)
        rem = rs * gaussian_hockey_stick(epsilon=torch.log1p(torch.expm1(eps) / rs), sensitivity=one, noise_std=zs)
        scale = 1.0 - e * (1.0 - rs)
        ok = scale > 0
        arg = torch.where(ok, torch.log(e * rs / torch.where(ok, scale, one)), torch.zeros_like(e))
        add = torch.where(ok, scale * gaussian_hockey_stick(epsilon=arg, sensitivity=one, noise_std=zs),
                          torch.zeros_like(e))
        return torch.maximum(rem, add)

    lo = torch.zeros_like(zs)
    hi = analytic_gaussian_epsilon(sensitivity=one, noise_std=zs, delta=delta)
    hi = torch.where(profile(hi) <= delta, hi, hi * 2 + 1)  # guard against rounding at the bracket
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        above = profile(mid) > delta
        lo = torch.where(above, mid, lo)
        hi = torch.where(above, hi, mid)
    out = torch.where(profile(lo) <= delta, lo, hi)
    out = torch.where(silent, torch.zeros_like(out), out)
    return torch.where(open_, torch.full_like(out, math.inf), out)
