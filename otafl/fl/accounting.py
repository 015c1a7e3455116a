"""A run's privacy from the facts its rounds revealed, per accountant of the spec.

Shared by the training loop (:func:`otafl.fl.loop.run_experiment`) and ``otafl audit-run``
(:mod:`otafl.api.audit_run`), so that both account the same facts the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otafl.limits import memory_limit_bytes
from otafl.privacy.accountants import PrivacyResult, account_run
from otafl.privacy.accountants.registry import STEPS_ACCOUNTANTS
from otafl.privacy.analysis.pld import set_memory_budget, take_notes
from otafl.privacy.facts import RoundFacts

if TYPE_CHECKING:
    from otafl.config import Spec

__all__ = ["account_facts"]


def account_facts(spec: Spec, facts: list[RoundFacts], digital=None, delta_target: float | None = None,
                  extra: tuple[str, ...] = ()) -> tuple[PrivacyResult, str]:
    """The run's privacy, per accountant of the spec (and of ``extra``), by :func:`account_run`
    (``steps`` and ``digital`` first; ``digital`` always for a digital round, whose mechanism
    ``digital`` is, None otherwise). The over-the-air accountants
    never reach a digital run (spec validation refuses them there: they model hidden
    participation and channel noise); the note below only guards direct callers."""
    listed = list(spec.privacy.accountants)
    own = [a for a in (*STEPS_ACCOUNTANTS, "digital") if a in listed or (a == "digital" and digital is not None)]
    others = [a for a in listed if a not in own]
    note = ""
    if digital is not None and digital.mechanism != "gaussian" and others:
        note = f"{', '.join(others)} not run: they model Gaussian noise, not the {digital.mechanism} mechanism"
        others = []
    names = own + others + [a for a in extra if a not in own + others]  # the run-level composers first
    dg = spec.digital
    target = spec.privacy.delta_total if delta_target is None else delta_target  # the one delta of the totals
    take_notes()  # drop notes left by an earlier caller
    set_memory_budget(memory_limit_bytes())  # caps the steps accountant's PLDs (rdp beyond, noted)
    result = account_run(facts, accountants=names, delta_l=spec.privacy.delta_l,
                         delta_prime=spec.privacy.delta_prime, delta_target=target,
                         digital_delta_total=target if dg.delta_total == "auto" else float(dg.delta_total))
    return result, "; ".join(n for n in [note, *take_notes()] if n)
