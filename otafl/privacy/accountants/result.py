"""The typed privacy of a run: one :class:`AccountantResult` per accountant, gathered in a
:class:`PrivacyResult` (docs/privacy/index.md). Plain values, JSON-able through ``summary_fields``;
kept apart from the accountants so that every run-level composer (``account_run``,
``account_steps``, ``account_digital_run``) can return them without importing each other."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

__all__ = ["AccountantResult", "FLAGGED_REASONS", "PrivacyResult", "TOTAL_OUT_OF_RANGE", "ZERO_REASON", "delta_limit", "delta_too_large", "explained",
           "unreachable_reason"]


def delta_limit(users, max_delta: float | None = None) -> float:
    """The largest sane delta: ``max_delta`` where the user sets one, else 1/K (a delta
    above 1/K allows the mechanism to publish one user's data outright)."""
    if max_delta is not None:
        return float(max_delta)
    return 1.0 / float(users) if users else 1.0


def delta_too_large(delta, users, max_delta: float | None = None) -> bool:
    """Whether an (eps, delta) statement is flagged: delta above :func:`delta_limit`. The
    same rule for per-round values and totals, in every output format."""
    try:
        d = float(delta)
    except (TypeError, ValueError):
        return False
    return d == d and d > delta_limit(users, max_delta)


def unreachable_reason(kind: str, tails: float, delta_total: float, what: str = "per-round tails") -> str:
    """The ``total_reason`` of a total that cannot be stated at ``delta_total``: the
    accountant's fixed ``what`` (summed over the rounds, ``tails``) already reach it."""
    return (f"{kind} total +inf at delta_total = {delta_total:.3g}: its fixed {what} sum to {tails:.3g} "
            f"(set a larger delta_total, or a smaller delta_prime/delta_l)")


ZERO_REASON = ("eps = 0: the mechanism's delta at eps = 0 (its total variation distance) is already at most "
               "the delta stated: the noise dwarfs the sensitivity, or the user takes part with negligible (or "
               "zero) probability")
"""Why an accountant states epsilon 0 (always sound: 0 means delta(0) <= delta)."""

TOTAL_OUT_OF_RANGE = ("total +inf at delta_total = {delta:.3g} although every round is finite: no composition "
                      "the accountant has states a finite epsilon at a delta this small (a round's privacy "
                      "profile stays above delta_total / T beyond eps = 500, the largest a PLD grid holds); "
                      "raise delta_total")
"""Why a total is +inf where every round is finite and the accountant gave no reason of its own."""


FLAGGED_REASONS = {
    "paper": "flagged, not a guaranteed bound: paper's classic Gaussian step has eps_0 > 1 (outside its validity "
             "range) or its local epsilon is amplified by sampling with p < 1 (the server can tell who transmitted)",
    "steps-sumdom": "flagged, not a guaranteed bound: the source's sum-domination of local steps (another user's "
                    "later steps can cancel its own earlier noise), steps is the sound value",
}
"""Why an accountant's value is flagged (``classic_valid`` false), by accountant."""
FLAGGED_REASON = "flagged, not a guaranteed bound (outside the formula's validity range)"


def _join(*parts: str) -> str:
    return "; ".join(p for p in dict.fromkeys(parts) if p)


def explained(result: "AccountantResult", delta_total: float | None = None) -> "AccountantResult":
    """``result`` with a reason for every 0 and every +inf it states (the issue's rule: no bare
    0 or +inf). A per-round 0 adds :data:`ZERO_REASON` to ``reason`` (``defined`` is unchanged:
    0 is a bound); a total of 0 adds it to ``total_reason``; a +inf total of finite rounds with
    no reason of its own gets :data:`TOTAL_OUT_OF_RANGE`; a +inf total of rounds that are +inf
    points at their ``reason``."""
    import dataclasses
    import math

    rounds = result.epsilon_central_per_round + result.epsilon_local_per_round
    reason, total = result.reason, result.total_reason
    if not result.classic_valid:
        reason = _join(reason, FLAGGED_REASONS.get(result.name, FLAGGED_REASON))
    if any(e == 0.0 for e in rounds) or result.epsilon_central == 0.0:
        reason = _join(reason, ZERO_REASON)
    totals = (result.epsilon_central_total, result.epsilon_local_total)
    if any(e == 0.0 for e in totals):
        total = _join(total, "total " + ZERO_REASON)
    if any(e == math.inf for e in totals) and not total:
        if any(e == math.inf for e in rounds):
            total = "total +inf: some round's epsilon is +inf (see reason)"
            if not result.reason:
                reason = _join(reason, "a round's epsilon is +inf: the accountant bounds no finite value there")
        else:
            total = TOTAL_OUT_OF_RANGE.format(delta=delta_total if delta_total is not None
                                              else result.delta_central_total)
    if reason == result.reason and total == result.total_reason:
        return result
    return dataclasses.replace(result, reason=reason, total_reason=total)


# AccountantResult field -> the suffix of its flat summary key "{name}_{suffix}" (in column order).
_SUMMARY_KEYS = (
    ("epsilon_local_max", "epsilon_local_max"),
    ("delta_local", "delta_local"),
    ("epsilon_central", "epsilon_central"),
    ("delta_central", "delta_central"),
    ("epsilon_local_total", "epsilon_local_total"),
    ("delta_local_total", "delta_local_total"),
    ("epsilon_central_total", "epsilon_central_total"),
    ("delta_central_total", "delta_central_total"),
    ("composition_central", "composition"),
    ("composition_local", "composition_local"),
    ("defined", "defined"),
    ("reason", "reason"),
    ("classic_valid", "classic_valid"),
    ("total_reason", "total_reason"),
    ("unit", "unit"),
)


@dataclass(frozen=True)
class AccountantResult:
    """One accountant's privacy of a run. Plain Python values; non-finite epsilons are +inf.

    Attributes
    ----------
    name : the accountant.
    epsilon_local_max, delta_local : LDP of the worst user in the worst round (max over
        rounds of each).
    epsilon_central, delta_central : central DP of the worst round (max over rounds of each).
    epsilon_local_total, delta_local_total : LDP composed over the rounds.
    epsilon_central_total, delta_central_total : central DP composed over the rounds.
    composition_central, composition_local : the composition that gave each total
        (basic | advanced | rdp | pld | none).
    defined : every round's bounds are defined; ``reason`` the texts of the reason bits
        set in any round ('' when defined).
    classic_valid : every round's classic Gaussian steps (central and local) are in
        their validity range (always True for accountants without one).
    epsilon_central_per_round, epsilon_local_per_round : [T] per round (local: worst user).
    total_reason : why a total is +inf although every round's bound is finite (its fixed
        per-round tails already reach the run's delta_total), or is 0; '' otherwise.
    unit : what the epsilons protect (:data:`otafl.privacy.units.UNITS`): ``user`` (all of one
        user's data) or ``record`` (one record, the local-steps accountants).
    """

    name: str
    epsilon_local_max: float
    delta_local: float
    epsilon_central: float
    delta_central: float
    epsilon_local_total: float
    delta_local_total: float
    epsilon_central_total: float
    delta_central_total: float
    composition_central: str
    composition_local: str
    defined: bool
    reason: str
    classic_valid: bool
    epsilon_central_per_round: tuple[float, ...]
    epsilon_local_per_round: tuple[float, ...]
    total_reason: str = ""
    unit: str = "user"

    def summary_fields(self) -> dict:
        """The flat run-summary columns ``"{name}_{suffix}"`` (no per-round values)."""
        return {f"{self.name}_{suffix}": getattr(self, field) for field, suffix in _SUMMARY_KEYS}

    def round_fields(self, t: int) -> dict:
        """Round t's record columns: ``"{name}_epsilon_central"``, ``"{name}_epsilon_local_max"``."""
        return {f"{self.name}_epsilon_central": self.epsilon_central_per_round[t],
                f"{self.name}_epsilon_local_max": self.epsilon_local_per_round[t]}


@dataclass(frozen=True, eq=False)
class PrivacyResult(Mapping):
    """The privacy of a run for several accountants: a read-only mapping name -> AccountantResult."""

    results: Mapping[str, AccountantResult]

    def __getitem__(self, name: str) -> AccountantResult:
        return self.results[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def summary_fields(self) -> dict:
        """Every accountant's :meth:`AccountantResult.summary_fields`, in accountant order."""
        out: dict = {}
        for result in self.results.values():
            out.update(result.summary_fields())
        return out

    def round_fields(self, t: int) -> dict:
        """Every accountant's :meth:`AccountantResult.round_fields` of round t."""
        out: dict = {}
        for result in self.results.values():
            out.update(result.round_fields(t))
        return out
