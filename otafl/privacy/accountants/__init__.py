"""Accountants: thin per-round privacy bounds on top of :mod:`otafl.privacy.analysis`.

- :mod:`~otafl.privacy.accountants.base`: the accountant interface (validated
  :class:`RoundInputs`, the :class:`RoundBound` result, reason codes, chunked evaluation);
- :mod:`~otafl.privacy.accountants.paper`, :mod:`~otafl.privacy.accountants.tight`,
  :mod:`~otafl.privacy.accountants.exact`: the three accountants;
- :mod:`~otafl.privacy.accountants.registry`: :data:`ACCOUNTANTS`, the names;
- :mod:`~otafl.privacy.accountants.run`: composition over rounds and :func:`account_run`.

Importing this package is cheap: its names load their submodules on first use (torch with
them; scipy, Opacus and dp_accounting later still, when an accountant first needs them).
"""

import importlib

#: Each re-exported name -> the submodule that defines it; imported on first use (PEP 562), so
#: that importing the registry (:mod:`~otafl.privacy.accountants.registry`, the names) needs
#: no torch: ``otafl --help`` lists the accountants without loading the math.
_LAZY = {
    **dict.fromkeys(["CENTRAL_REASONS", "GRID_CHUNK", "REASON_DELTA_PRIME", "REASON_HOEFFDING",
                     "REASON_NO_CENTRAL_NOISE", "REASON_NO_LOCAL_NOISE", "REASONS", "RoundBound", "RoundInputs",
                     "evaluate_in_chunks", "prepare_round", "reason_text"], "base"),
    "compose_exact": "exact", "exact_round": "exact", "paper_round": "paper", "tight_round": "tight",
    **dict.fromkeys(["ACCOUNTANTS", "Accountant", "get_accountant"], "registry"),
    **dict.fromkeys(["AccountantResult", "PrivacyResult", "account_run", "compose_round_bounds",
                     "composition_name", "exact_total"], "run"),
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"otafl.privacy.accountants.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'otafl.privacy.accountants' has no attribute {name!r}")


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
