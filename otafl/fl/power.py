"""Power control as a strategy: how far below its alignment bound each round transmits.

Every transmitting user sends x_k = (c_t / h_k)(g_k + n_k), and the alignment bound
c_t <= min_k h_k sqrt(P_k / (L^2 + d sigma_k^2)) keeps every user within its budget
(:mod:`otafl.transmit`). A policy chooses c_t at or below that bound (and, for COTAF, which
users stay silent); the server divides by c_t, so a lower c_t raises the channel noise
N0 / c_t^2 in the aligned sum, which is what the accountants read (the round's facts carry
c_t). Registry: :data:`otafl.fl.strategies.POWER_CONTROLS`; docs/model.md#power-control.

* :class:`FullPower` -- c_t = the bound (the paper; the default).
* :class:`PrivacyBudget` -- c_t lowered so that ``exact``'s central epsilon over the run meets
  ``privacy.target_epsilon`` (Liu & Simeone, JSAC 2021, with ``exact`` as the rule).
* :class:`Cotaf` -- COTAF's precoder (Sery et al., TSP 2021): a fixed gain set by the public
  update-norm bound L and the threshold h_min, users below h_min silent.
* :class:`Schedule` -- c_t = s_t times the bound, s_t a public per-round schedule.

Every policy depends on public facts only: the channel gains, the spec's schedule and target
and the sampling law, never on the data, so that the released c_t leaks nothing beyond what
the accountants are told. A policy is planned once per run by :func:`plan_power` from the
run's channel h [T, K] and participation probabilities p [T, K] (:func:`otafl.setup.build_channel`)
and attached to its :class:`~otafl.transmit.ChannelSetup`, whose ``gain(h)`` then asks it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from otafl.channel.fading import run_row
from otafl.errors import OtaflInputError
from otafl.fl.round import channel_state, csi_mismatch  # the round's own channel side, so the plan is the run's
from otafl.transmit import ChannelSetup

if TYPE_CHECKING:
    from otafl.config import Spec

__all__ = ["Cotaf", "FullPower", "PowerControl", "PrivacyBudget", "Schedule", "plan_power"]


class PowerControl:
    """The strategy interface. ``gain(setup, h)`` -> (c_t, eligible [K] bool) for one round's gains.

    silences : the policy may leave active users ineligible (the round's outages).
    changes_gain : the policy moves c_t off the alignment bound, so it needs the ``ota`` aggregation (the
        others never ask for c_t).

    With estimated CSI (``setup.csi``) the round hands :meth:`gain` the known gains h_hat_t (users
    with h_hat <= 0 at +inf, a row of :attr:`~otafl.channel.csi.KnownGains.finite`), not h_t: every
    policy then aligns to what the server knows, and :meth:`round_of` finds the round from either.
    """

    silences = False
    changes_gain = True

    def __init__(self, spec: Spec, setup: ChannelSetup, h: Tensor, p: Tensor):
        self.spec, self.h, self.p = spec, h, p
        self.csi = getattr(setup, "csi", None)  # KnownGains (estimated CSI) or None
        if self.changes_gain and spec.train.aggregation != "ota":
            raise OtaflInputError(f"transmit.power_control = {spec.transmit.power_control!r} needs train.aggregation "
                                  f"= 'ota' (found {spec.train.aggregation!r}, which has no alignment gain)")

    def attach(self, setup: ChannelSetup) -> ChannelSetup:
        """The run's setup with this policy deciding c_t."""
        return dataclasses.replace(setup, power_control=self)

    def gain(self, setup: ChannelSetup, h: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def summary(self) -> dict:
        """Run-summary fields describing the policy's plan."""
        return {"power_control": self.spec.transmit.power_control}

    def round_of(self, h: Tensor) -> int:
        """Which round of the run's h [T, K] the gains ``h`` are (the loop and ``audit-run`` pass the
        row ``h[t]`` itself, a view of the run's tensor: its storage offset names t; with estimated CSI
        the round passes the row ``finite[t]`` of its :class:`~otafl.channel.csi.KnownGains`)."""
        t = run_row(h, self.h)
        if t is None and self.csi is not None:
            t = run_row(h, self.csi.finite)
        if t is not None:
            return t
        raise OtaflInputError(f"transmit.power_control = {self.spec.transmit.power_control!r} needs the run's own "
                              "channel rows h[t] (a row of the planned channel, not a copy)")


class FullPower(PowerControl):
    """c_t = the alignment bound (the paper's ``min`` or ``truncate`` policy): today's behaviour.
    Planning returns the setup unchanged."""

    changes_gain = False

    def attach(self, setup):
        return setup

    def gain(self, setup, h):
        return setup.full_gain(h)

    def summary(self):
        return {}


class Schedule(PowerControl):
    """c_t = s_t b_t, b_t the alignment bound, s_t in (0, 1] from ``transmit.power_schedule`` (one per
    round) or the geometric ramp s_t = start (end / start)^(t / (T - 1)). Public: fixed before the run."""

    def __init__(self, spec, setup, h, p):
        super().__init__(spec, setup, h, p)
        tx, T = spec.transmit, int(h.shape[0])
        if tx.power_schedule:
            if len(tx.power_schedule) != T:
                raise OtaflInputError(f"transmit.power_schedule has {len(tx.power_schedule)} values; the allowed "
                                      f"length is {T} (one per round)")
            scales = [float(v) for v in tx.power_schedule]
        else:
            a, b = float(tx.power_start), float(tx.power_end)
            scales = [a * (b / a) ** (t / (T - 1)) if T > 1 else a for t in range(T)]
        self.scales = torch.tensor(scales, dtype=torch.float64)

    def gain(self, setup, h):
        c, eligible = setup.full_gain(h)
        return c * float(self.scales[self.round_of(h)]), eligible

    def summary(self):
        first, last = float(self.scales[0]), float(self.scales[-1])
        return {**super().summary(), "power_scale_first": first, "power_scale_last": last,
                "power_control_note": f"schedule: c_t from {first:.3g} to {last:.3g} times the alignment bound"}


class Cotaf(PowerControl):
    """COTAF's precoder (Sery, Shlezinger, Cohen, Eldar, TSP 2021) over the fading MAC.

    COTAF scales every update by sqrt(alpha_t), alpha_t = P / max_k E||u_k,t||^2 (the expected norm
    of the update, public), and on a fading channel inverts each gain, users with h_k < h_min silent
    (truncated inversion, so that alpha_t carries h_min^2). In this model's units the aligned gain is

        c_t = h_min min_k sqrt(P_k / B_t^2),   B_t^2 = L^2 + d sigma_k^2,

    with B_t the public bound on E||g_k + n_k||^2 (FedSGD clips to L, so B_t is the same every round),
    h_min = ``transmit.threshold``, and the users with h_k < h_min silent this round. Every transmitter
    meets its budget: (c_t / h_k)^2 B_t^2 <= (h_min / h_k)^2 P_k <= P_k.
    """

    silences = True

    def __init__(self, spec, setup, h, p):
        super().__init__(spec, setup, h, p)
        th = spec.transmit.threshold
        if th is None or not th > 0:
            raise OtaflInputError(f"transmit.threshold = {th!r} is outside the allowed range (0, inf) for "
                                  "transmit.power_control = 'cotaf' (the h_min below which users stay silent)")
        self.threshold = float(th)
        self.c = self.threshold * float(setup.bound_scale.min())

    def gain(self, setup, h):
        eligible = torch.as_tensor(h, dtype=torch.float64, device=setup.bound_scale.device) >= self.threshold
        return torch.tensor(self.c, dtype=torch.float64, device=setup.bound_scale.device), eligible

    def summary(self):
        return {**super().summary(), "cotaf_gain": self.c,
                "power_control_note": f"cotaf: c_t = {self.c:.3g} every round, users with h below "
                                      f"{self.threshold:g} silent"}


class PrivacyBudget(PowerControl):
    """Liu & Simeone's adaptive power control with ``exact`` as the rule (docs/model.md#power-control).

    With N0 > 0 each round's c_t is lowered to c_t = min(b_t, c*), b_t the alignment bound: the one cap
    c* is the largest for which ``exact``'s central epsilon over the run's T rounds, composed at
    ``privacy.delta_total``, is at most ``privacy.target_epsilon`` (bisection on N0 / c*^2, within
    :data:`TOLERANCE` of the target). Rounds whose bound is below c* already carry more channel noise
    than needed and keep b_t; nothing is added to them. If full power meets the target, c* = inf
    ("privacy for free"). With N0 = 0 the channel adds nothing, so artificial noise a is added to every
    user's sigma_k^2 instead (the smallest a that meets the target), at full power.

    The plan reads the run's channel gains h [T, K], the participation law p [T, K], sigma_k^2, L, d
    and T: public facts, never the data. It is clairvoyant in the channel (it knows every round's bound
    before the first); when no bound falls below c* (the usual case, and the quickstart's), c* depends
    on the participation law, the noise and T only.

    With estimated CSI the plan composes the rounds the accountants will compose: each round's bound
    from the known gains h_hat_t, its eligible users, and its gain-mismatch extremes r_min, r_max
    (r = h / h_hat over the users who may transmit), which ``exact`` turns into a dominating round
    with gain c_t r_max and the others' noise times (r_min / r_max)^2 (:mod:`otafl.privacy.csi`). So
    exact's total still meets the target. Like the accountants, the plan reads the realised r (it is
    clairvoyant in the estimation error as in h): data-independent, so c_t still reveals no gradient.
    """

    TOLERANCE = 0.005  # the total lands in [target (1 - TOLERANCE), target] (up to the grid's steps)

    def __init__(self, spec, setup, h, p):
        super().__init__(spec, setup, h, p)
        tr = spec.train
        if tr.algorithm != "fedsgd" or tr.aggregation != "ota":
            raise OtaflInputError(f"transmit.power_control = 'privacy-budget' needs train.algorithm = 'fedsgd' and "
                                  f"train.aggregation = 'ota' (found {tr.algorithm!r}, {tr.aggregation!r})")
        self.target = float(spec.privacy.target_epsilon)
        # each round at full power as the round will meet it (otafl.fl.round): its bound b_t, the users
        # who may transmit and, with estimated CSI, the extremes of r = h / h_hat the accountants read
        full = dataclasses.replace(setup, power_control=None)
        states = [channel_state(h[t], torch.ones_like(h[t], dtype=torch.bool), full) for t in range(int(h.shape[0]))]
        self.bounds = [s.gain for s in states]
        self.p_eff = [(p[t] * s.eligible.to(p.dtype)).to(torch.float64).cpu() for t, s in enumerate(states)]
        self.mismatch = [csi_mismatch(s) for s in states]  # {} with perfect CSI
        self.cap, self.added = math.inf, 0.0
        if setup.n0 > 0:
            self.cap = self._solve_cap(setup)
        else:
            self.added = self._solve_noise(setup)
        self.epsilon = self._epsilon(setup.noise_var + self.added, self.cap, setup)

    # -- the rule: exact's central total over the run, as the run will account it
    def _facts(self, noise_var: Tensor, cap: float, setup: ChannelSetup, bounds=None) -> list:
        from otafl.privacy.facts import RoundFacts

        s2 = noise_var.to(torch.float64).cpu()
        bounds = self.bounds if bounds is None else bounds
        return [RoundFacts(participation_prob=pe, noise_var=s2, alignment_gain=min(b, cap), n0=setup.n0,
                           sensitivity=2.0 * setup.clip, dim=setup.dim, participants=0, **m)
                for pe, b, m in zip(self.p_eff, bounds, self.mismatch)]

    def _epsilon(self, noise_var, cap, setup, bounds=None) -> float:
        from otafl.privacy.accountants.run import exact_total

        pv = self.spec.privacy
        return float(exact_total(self._facts(noise_var, cap, setup, bounds), "central", delta_l=pv.delta_l,
                                 delta_target=pv.delta_total)["epsilon"])

    def _bisect(self, eps_of, lo: float, hi: float) -> float:
        """The smallest x in [lo, hi] (log scale) with eps_of(x) <= target, eps_of decreasing; hi meets it."""
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            e = eps_of(mid)
            if e <= self.target:
                hi = mid
                if e >= self.target * (1 - self.TOLERANCE):
                    break
            else:
                lo = mid
            if hi / lo < 1 + 1e-6:
                break
        return hi

    def _find_upper(self, eps_of, start: float) -> float:
        x = start
        for _ in range(200):
            if eps_of(x) <= self.target:
                return x
            x *= 4.0
        raise OtaflInputError(f"privacy.target_epsilon = {self.target!r} is outside the reachable range of "
                              "transmit.power_control = 'privacy-budget' (no noise level meets it)")

    def _solve_cap(self, setup: ChannelSetup) -> float:
        """c* from the channel noise level v = N0 / c*^2 (bisection in log v)."""
        n0 = setup.n0
        if self._epsilon(setup.noise_var, math.inf, setup) <= self.target:
            return math.inf  # full power meets the target: privacy for free
        finite = [b for b in self.bounds if b > 0]
        v_full = n0 / max(finite) ** 2 if finite else 1.0  # the least channel noise of any round at full power
        eps_of = lambda v: self._epsilon(setup.noise_var, math.sqrt(n0 / v), setup)  # noqa: E731
        hi = self._find_upper(eps_of, v_full)
        v = self._bisect(eps_of, min(v_full, hi / 4.0), hi)
        return math.sqrt(n0 / v)

    def _solve_noise(self, setup: ChannelSetup) -> float:
        """N0 = 0: the artificial noise a added to every sigma_k^2, at full power (bisection in log a)."""
        if self._epsilon(setup.noise_var, math.inf, setup) <= self.target:
            return 0.0

        def eps_of(a):
            return self._epsilon(setup.noise_var + a, math.inf, setup)

        hi = self._find_upper(eps_of, 1e-3 * setup.clip ** 2)
        return self._bisect(eps_of, hi / 4.0 if hi > 1e-3 * setup.clip ** 2 else hi * 1e-3, hi)

    def attach(self, setup):
        noisy = dataclasses.replace(setup, noise_var=setup.noise_var + self.added) if self.added else setup
        return dataclasses.replace(noisy, power_control=self)

    def gain(self, setup, h):
        c, eligible = setup.full_gain(h)
        return torch.clamp(c, max=self.cap), eligible

    def summary(self):
        capped = sum(b > self.cap for b in self.bounds)
        how = (f"c_t capped at {self.cap:.3g} in {capped} of {len(self.bounds)} rounds" if math.isfinite(self.cap)
               else f"full power, artificial noise {self.added:.3g} added per user" if self.added
               else "full power (it meets the target)")
        pv = self.spec.privacy
        return {**super().summary(), "target_epsilon": self.target, "planned_epsilon": self.epsilon,
                "power_cap": self.cap, "added_noise_var": self.added,
                "power_control_note": f"privacy-budget: {how}; exact's central total {self.epsilon:.3g} at delta "
                                      f"{pv.delta_total:.3g} for target {self.target:g}"}


def plan_power(spec: Spec, setup: ChannelSetup, h: Tensor, p: Tensor) -> ChannelSetup:
    """The run's setup with ``spec.transmit.power_control``'s policy planned from the channel h [T, K]
    and participation probabilities p [T, K] (:data:`~otafl.fl.strategies.POWER_CONTROLS`)."""
    from otafl.fl.strategies import POWER_CONTROLS

    policy = POWER_CONTROLS[spec.transmit.power_control].load()(spec, setup, h, p)
    return policy.attach(setup)
