"""The registry of accountants by name: the single source of the accountant names.

Importing it is cheap (no torch, scipy, Opacus or dp_accounting: each accountant's module is
imported when its function is first used), so spec validation and the CLI's option choices
(``otafl --help``, a misspelt ``--accountant``) read the names from it without loading the math.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from otafl.errors import OtaflInputError

if TYPE_CHECKING:
    from otafl.privacy.accountants.base import RoundBound

__all__ = ["Accountant", "ACCOUNTANTS", "CSI_ACCOUNTANTS", "STEPS_ACCOUNTANTS", "get_accountant"]


@dataclass(frozen=True)
class Accountant:
    """A registered accountant: a name, its per-round function and a one-line summary.

    ``guaranteed`` false marks a value that is not an upper bound in general (``steps-sumdom``:
    shown for comparison with its source, flagged ``!``, never a default)."""

    name: str
    function: str
    """``"module:function"`` of its per-round function, imported on first use."""
    summary: str
    guaranteed: bool = True

    @property
    def round_bound(self) -> Callable[..., RoundBound]:
        """The per-round function (its module imported now, if it was not)."""
        module, _, attr = self.function.partition(":")
        return getattr(importlib.import_module(module), attr)

    def bound(self, **kwargs) -> RoundBound:
        """``round_bound(**kwargs)`` evaluated in grid chunks (:func:`evaluate_in_chunks`)."""
        from otafl.privacy.accountants.base import evaluate_in_chunks

        return evaluate_in_chunks(self.round_bound, **kwargs)


_M = "otafl.privacy.accountants."


ACCOUNTANTS: dict[str, Accountant] = {
    "paper": Accountant("paper", _M + "paper:paper_round",
                        "the paper's closed forms: Hoeffding quantile, classic Gaussian"),
    "tight": Accountant("tight", _M + "tight:tight_round",
                        "exact Poisson-binomial quantile, analytic Gaussian, channel noise included, unamplified LDP"),
    "exact": Accountant("exact", _M + "exact:exact_round",
                        "numerical hockey-stick bound of the over-the-air round (counts revealed, dimension-aware)"),
    "steps": Accountant("steps", _M + "steps:steps_round",
                        "local DP-SGD steps; the others' last-step, artificial and channel noise credited (add/remove)"),
    "steps-sumdom": Accountant("steps-sumdom", _M + "steps:steps_sumdom_round",
                               "the source's sum-domination of local DP-SGD steps; NOT a guaranteed bound (S > 1)",
                               guaranteed=False),
    "digital": Accountant("digital", _M + "digital:digital_round",
                          "secure aggregation, distributed noise, participation revealed"),
}
"""Accountants by name (``click.Choice(sorted(ACCOUNTANTS))``)."""

STEPS_ACCOUNTANTS = {"steps": "last-step", "steps-sumdom": "sum"}
"""The accountants of local DP-SGD steps and the noise each credits (``credit`` of
:func:`~otafl.privacy.accountants.steps.steps_round`); they take the steps' keywords."""

CSI_ACCOUNTANTS = ("exact", "tight", "paper")
"""The accountants that read estimated CSI's gain mismatch (:mod:`otafl.privacy.csi`); the others
are refused with ``channel.csi = "estimated"`` (docs/privacy/csi.md#csi)."""


def get_accountant(name: str) -> Accountant:
    """The registered accountant ``name``; OtaflInputError naming the choices otherwise."""
    if name not in ACCOUNTANTS:
        raise OtaflInputError(f"accountant = {name!r} is outside the allowed range {{{', '.join(sorted(ACCOUNTANTS))}}}")
    return ACCOUNTANTS[name]
