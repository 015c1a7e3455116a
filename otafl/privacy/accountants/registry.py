"""The registry of accountants by name: the single source of the accountant names.

Importing it is cheap (torch only; scipy, Opacus and dp_accounting are imported when an
accountant first needs them), so spec validation can check names against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from otafl.errors import OtaflInputError
from otafl.privacy.accountants.base import RoundBound, evaluate_in_chunks
from otafl.privacy.accountants.digital import digital_round
from otafl.privacy.accountants.exact import exact_round
from otafl.privacy.accountants.paper import paper_round
from otafl.privacy.accountants.steps import steps_round, steps_sumdom_round
from otafl.privacy.accountants.tight import tight_round

__all__ = ["Accountant", "ACCOUNTANTS", "STEPS_ACCOUNTANTS", "get_accountant"]


@dataclass(frozen=True)
class Accountant:
    """A registered accountant: a name, its per-round function and a one-line summary.

    ``guaranteed`` false marks a value that is not an upper bound in general (``steps-sumdom``:
    shown for comparison with its source, flagged ``!``, never a default)."""

    name: str
    round_bound: Callable[..., RoundBound]
    summary: str
    guaranteed: bool = True

    def bound(self, **kwargs) -> RoundBound:
        """``round_bound(**kwargs)`` evaluated in grid chunks (:func:`evaluate_in_chunks`)."""
        return evaluate_in_chunks(self.round_bound, **kwargs)


ACCOUNTANTS: dict[str, Accountant] = {
    "paper": Accountant("paper", paper_round, "the paper's closed forms: Hoeffding quantile, classic Gaussian"),
    "tight": Accountant("tight", tight_round,
                        "exact Poisson-binomial quantile, analytic Gaussian, channel noise included, unamplified LDP"),
    "exact": Accountant("exact", exact_round,
                        "numerical hockey-stick bound of the over-the-air round (counts revealed, dimension-aware)"),
    "steps": Accountant("steps", steps_round,
                        "local DP-SGD steps; the others' last-step, artificial and channel noise credited (add/remove)"),
    "steps-sumdom": Accountant("steps-sumdom", steps_sumdom_round,
                               "the source's sum-domination of local DP-SGD steps; NOT a guaranteed bound (S > 1)",
                               guaranteed=False),
    "digital": Accountant("digital", digital_round, "secure aggregation, distributed noise, participation revealed"),
}
"""Accountants by name (``click.Choice(sorted(ACCOUNTANTS))``)."""

STEPS_ACCOUNTANTS = {"steps": "last-step", "steps-sumdom": "sum"}
"""The accountants of local DP-SGD steps and the noise each credits (``credit`` of
:func:`~otafl.privacy.accountants.steps.steps_round`); they take the steps' keywords."""


def get_accountant(name: str) -> Accountant:
    """The registered accountant ``name``; OtaflInputError naming the choices otherwise."""
    if name not in ACCOUNTANTS:
        raise OtaflInputError(f"accountant = {name!r} is outside the allowed range {{{', '.join(sorted(ACCOUNTANTS))}}}")
    return ACCOUNTANTS[name]
