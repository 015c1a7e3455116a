"""Privacy of over-the-air federated learning: analysis plus accountants.

This subpackage never imports the training code (``otafl.fl``, ``otafl.data``,
``otafl.models``) nor the CLI or reports: the FL loop emits per-round
:class:`RoundFacts` and the accountants read them.

- :mod:`~otafl.privacy.analysis`: pure, batched float64 math (Gaussian mechanism,
  concentration, composition, the over-the-air round's numerical profile).
- :mod:`~otafl.privacy.accountants`: the per-round accountants ``paper``, ``tight`` and
  ``exact``, the registry :data:`ACCOUNTANTS`, and :func:`account_run` over a run.
- :mod:`~otafl.privacy.facts`: :class:`RoundFacts`, what one round reveals.
- :mod:`~otafl.privacy.audit`: Monte Carlo audit of one round's leakage.
"""

import importlib

#: Re-exported names, imported on first use (PEP 562): importing a light submodule (the
#: accountants' registry, :mod:`otafl.privacy.names`) runs no torch.
_LAZY = {**dict.fromkeys(["ACCOUNTANTS", "REASONS", "Accountant", "AccountantResult", "PrivacyResult", "RoundBound",
                          "account_run", "compose_round_bounds", "composition_name", "exact_round", "get_accountant",
                          "paper_round", "reason_text", "tight_round"], "otafl.privacy.accountants"),
         "RoundFacts": "otafl.privacy.facts"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'otafl.privacy' has no attribute {name!r}")


__all__ = [
    "ACCOUNTANTS",
    "REASONS",
    "Accountant",
    "AccountantResult",
    "PrivacyResult",
    "RoundBound",
    "RoundFacts",
    "account_run",
    "compose_round_bounds",
    "composition_name",
    "exact_round",
    "get_accountant",
    "paper_round",
    "reason_text",
    "tight_round",
]
