"""Defaults shared by the library entry points of :mod:`otafl.api` and the commands on top.

PAPER_DIM is the model dimension d of the paper's single-layer MNIST model; the power
budgets P = 10^(SNR/10) d N0 and the ``exact`` accountant depend on it.
"""

from __future__ import annotations

PAPER_DIM = 784 * 10 + 10
"""d = 7850: the paper's single-layer MNIST model (784 x 10 weights + 10 biases)."""

DELTA_TOTAL = 1e-5
"""The default ``privacy.delta_total`` / ``--delta-total``: the one delta at which every
accountant states its totals over a run (docs/privacy/composition.md#delta-total)."""

JSON_NON_FINITE = 'JSON writes non-finite numbers as the strings "inf", "-inf" and "nan"'
"""How ``--format json`` writes +inf / -inf / NaN (:func:`otafl.results.jsonable`)."""

NO_ACCOUNTANT = "no accountant given"
"""The one-line error when the list of accountants is empty (e.g. ``--accountant ''``)."""

# The entry points' names and defaults that the commands offer as option choices and defaults,
# here (no torch) so that ``otafl --help`` and a misspelt option load none of the math; each
# entry point's module re-exports its own under its own name.

AUDIT_ACCOUNTANTS = ("paper", "tight", "exact")
"""``audit_grid``'s default accountants (``otafl.api.audit.DEFAULT_ACCOUNTANTS``): all three, to compare them."""

AUDIT_SCOPES = ("central", "local", "both")
"""``audit_grid``'s scopes (``otafl.api.audit.SCOPES``)."""

DEFAULT_CHANNEL_ROUNDS = 1000
"""Fading rounds a channel preset draws in ``bound_grid`` without ``rounds`` (the per-round worst case)."""

CURVES_PRESET = dict(users=200, sigma2=0.1, clip=1.0, delta_l=1e-5, n0=0.0, dim=PAPER_DIM)
"""The paper's preset: the defaults of ``accountant_curves`` (``otafl.api.curves.PRESET``)."""

CURVES_P = tuple(round(0.05 * i, 2) for i in range(1, 21))
"""p = 0.05, 0.10, ..., 1: ``accountant_curves``' default grid (``otafl.api.curves.DEFAULT_P``)."""

SCALING_SCHEMES = ("fixed_p", "sqrt_p")
"""``scaling_grid``'s schemes (``otafl.api.scaling.SCHEMES``): fixed_p: p constant; sqrt_p: p = a K^{-1/2}."""


def accountant_names() -> list[str]:
    """The registered accountants (``otafl.privacy.accountants.ACCOUNTANTS``), sorted."""
    from otafl.privacy.accountants import ACCOUNTANTS

    return sorted(ACCOUNTANTS)


def check_accountants(names) -> list[str]:
    """``names`` as a list without repeats (first-seen order); OtaflInputError if empty or
    if a name is not registered."""
    from otafl.errors import OtaflInputError

    out = list(dict.fromkeys(names))
    if not out:
        raise OtaflInputError(NO_ACCOUNTANT)
    known = accountant_names()
    for name in out:
        if name not in known:
            raise OtaflInputError(f"accountant = {name!r} is outside the allowed range {{{', '.join(known)}}}")
    return out
