"""Pure, batched privacy math on float64 torch tensors.

This subpackage never imports the training code (``otafl.fl``, ``otafl.data``,
``otafl.models``): the FL loop emits per-round facts and the accountants read them.

- :mod:`~otafl.privacy.gaussian`: classic and analytic Gaussian mechanism, amplification by sampling.
- :mod:`~otafl.privacy.concentration`: the law of |K_t| (Poisson binomial), Hoeffding and exact quantiles.
- :mod:`~otafl.privacy.accountants`: per-round LDP / central DP (``paper``, ``tight``), the
  registry :data:`ACCOUNTANTS`, and :func:`account_run` over a run's :class:`RoundFacts`.
- :mod:`~otafl.privacy.compose`: basic, advanced and RDP (Opacus) composition over rounds.
"""

from otafl.privacy.accountants import (
    ACCOUNTANTS,
    REASONS,
    Accountant,
    RoundBound,
    account_run,
    get_accountant,
    paper_round,
    reason_text,
    tight_round,
)
from otafl.privacy.facts import RoundFacts

__all__ = [
    "ACCOUNTANTS",
    "REASONS",
    "Accountant",
    "RoundBound",
    "RoundFacts",
    "account_run",
    "get_accountant",
    "paper_round",
    "reason_text",
    "tight_round",
]
