"""The ``steps`` accountant over a whole run: per-round bounds and totals (docs/privacy/steps.md#steps).

:func:`account_steps` reads a run's :class:`~otafl.privacy.facts.RoundFacts` (with their
local-steps fields), evaluates :func:`~otafl.privacy.accountants.steps.steps_round` per
round and composes the rounds' mechanisms with privacy-loss distributions or RDP (not
basic/advanced composition of per-round (eps, delta)); the result is the same
:class:`~otafl.privacy.accountants.run.AccountantResult` the other accountants give, so it
joins a run's :class:`~otafl.privacy.accountants.run.PrivacyResult`.
(A module of its own: ``run`` imports the registry, which imports ``steps``.)
"""

from __future__ import annotations

import math
from typing import Sequence

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants.base import reason_text
from otafl.privacy.accountants.result import AccountantResult, unreachable_reason
from otafl.privacy.accountants.steps import facts_kwargs, round_mechanisms, steps_round
from otafl.privacy.analysis.steps import StepRound, check_composition, compose_epsilon, composition_used
from otafl.privacy.units import unit_of
from otafl.privacy.facts import RoundFacts

__all__ = ["account_steps"]


def account_steps(facts: Sequence[RoundFacts], *, delta_l: float, delta_prime="auto", composition: str = "pld",
                  delta_target: float | None = None,
                  credit: str = "last-step") -> AccountantResult:
    """The ``steps`` accountant over a run, as an :class:`~otafl.privacy.accountants.run.AccountantResult`.

    ``credit = "sum"`` gives ``steps-sumdom`` (the source's sum-domination, not a guaranteed
    bound; flagged ``classic_valid`` false).

    Per round: :func:`steps_round` on the round's facts (their ``local_steps``,
    ``record_sampling``, ``step_noise``, ``update_clip_failure``). Totals: the rounds'
    mechanisms composed with ``composition`` (not basic/advanced composition of per-round
    (eps, delta)); central at delta_dp = ``delta_target`` minus the charged tails, or
    delta_l by default, reported with delta_central_total = delta_dp + sum_t (tail_t +
    update_clip_failure_t) (= ``delta_target``; +inf with ``total_reason`` where the
    charged tails reach it); local (every round taken part in) at ``delta_target``, or delta_l.
    """
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    check_composition(composition)
    if not facts:
        raise OtaflInputError("facts = [] is outside the allowed range (at least one round)")
    eps_c, eps_l, d_c, d_l_round = [], [], [], []
    reason = 0
    central: dict[StepRound, int] = {}
    local: dict[StepRound, int] = {}
    charged = 0.0
    for f in facts:
        b = steps_round(**facts_kwargs(f, delta_l=delta_l, delta_prime=delta_prime), composition=composition,
                        credit=credit)
        eps_c.append(float(b.epsilon_central))
        eps_l.append(float(b.epsilon_local))
        d_c.append(float(b.delta_central))
        d_l_round.append(float(b.delta_local))
        reason |= int(b.reason)
        rc, rl, tail = round_mechanisms(f, delta_prime=delta_prime, delta_l=delta_l,
                                        credit=credit)
        charged += tail + float(f.update_clip_failure)
        if rc is not None:
            central[rc] = central.get(rc, 0) + 1
            local[rl] = local.get(rl, 0) + 1
    total_reason = ""
    if delta_target is not None:
        check_range("delta_target", delta_target, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        delta_dp = delta_target - charged
        if delta_dp <= 0:  # the charged tails alone reach the target: no total at it
            total_reason = unreachable_reason("central", charged, delta_target,
                                              "count tails and clip failures")
    else:
        delta_dp = delta_l
    delta_local = delta_l if delta_target is None else delta_target
    total_c = compose_epsilon(sorted(central.items()), delta=delta_dp, composition=composition) if delta_dp > 0 \
        else math.inf
    total_l = compose_epsilon(sorted(local.items()), delta=delta_local, composition=composition)
    name = "steps" if credit == "last-step" else "steps-sumdom"
    return AccountantResult(
        name=name,
        epsilon_local_max=max(eps_l), delta_local=max(d_l_round),
        epsilon_central=max(eps_c), delta_central=max(d_c),
        epsilon_local_total=total_l, delta_local_total=delta_local if local else 0.0,
        epsilon_central_total=total_c,
        delta_central_total=min(1.0, delta_dp + charged) if delta_target is None else delta_target,
        composition_central=composition_used(sorted(central.items()), composition) if delta_dp > 0 else composition,
        composition_local=composition_used(sorted(local.items()), composition),  # rdp where pld fell back
        defined=reason == 0, reason=reason_text(reason), classic_valid=credit == "last-step",
        epsilon_central_per_round=tuple(eps_c), epsilon_local_per_round=tuple(eps_l), total_reason=total_reason,
        unit=unit_of(name, local_steps=any(f.step_noise is not None for f in facts)))


