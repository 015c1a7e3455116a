"""Accountants: thin per-round privacy bounds on top of :mod:`otafl.privacy.analysis`.

- :mod:`~otafl.privacy.accountants.base`: the accountant interface (validated
  :class:`RoundInputs`, the :class:`RoundBound` result, reason codes, chunked evaluation);
- :mod:`~otafl.privacy.accountants.paper`, :mod:`~otafl.privacy.accountants.tight`,
  :mod:`~otafl.privacy.accountants.exact`: the three accountants;
- :mod:`~otafl.privacy.accountants.registry`: :data:`ACCOUNTANTS`, the names;
- :mod:`~otafl.privacy.accountants.run`: composition over rounds and :func:`account_run`.

Importing this package is cheap: scipy, Opacus and dp_accounting load on first use.
"""

from otafl.privacy.accountants.base import (
    CENTRAL_REASONS,
    GRID_CHUNK,
    REASON_DELTA_PRIME,
    REASON_HOEFFDING,
    REASON_NO_CENTRAL_NOISE,
    REASON_NO_LOCAL_NOISE,
    REASONS,
    RoundBound,
    RoundInputs,
    evaluate_in_chunks,
    prepare_round,
    reason_text,
)
from otafl.privacy.accountants.exact import compose_exact, exact_round
from otafl.privacy.accountants.paper import paper_round
from otafl.privacy.accountants.registry import ACCOUNTANTS, Accountant, get_accountant
from otafl.privacy.accountants.run import (
    AccountantResult,
    PrivacyResult,
    account_run,
    compose_round_bounds,
    composition_name,
    exact_total,
)
from otafl.privacy.accountants.tight import tight_round

__all__ = [
    "ACCOUNTANTS",
    "CENTRAL_REASONS",
    "GRID_CHUNK",
    "REASONS",
    "REASON_DELTA_PRIME",
    "REASON_HOEFFDING",
    "REASON_NO_CENTRAL_NOISE",
    "REASON_NO_LOCAL_NOISE",
    "Accountant",
    "AccountantResult",
    "PrivacyResult",
    "RoundBound",
    "RoundInputs",
    "account_run",
    "compose_exact",
    "compose_round_bounds",
    "composition_name",
    "evaluate_in_chunks",
    "exact_round",
    "exact_total",
    "get_accountant",
    "paper_round",
    "prepare_round",
    "reason_text",
    "tight_round",
]
