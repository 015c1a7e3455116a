"""Names the privacy code accepts that the CLI offers as choices, kept apart from the torch
code that implements them so that ``otafl --help`` and a misspelt option import no torch.
(The accountants' names are their registry's, :mod:`otafl.privacy.accountants.registry`,
which is just as light.)"""

#: What the Monte Carlo audit's adversary knows (:mod:`otafl.privacy.audit`): ``hidden`` only
#: the law of the participant count; ``others`` / ``total`` also the number of other / of all
#: participants (exact's two conditional bounds).
ADVERSARIES = ("hidden", "others", "total")

#: How rounds (and local steps) are composed and turned into (eps, delta)
#: (:mod:`otafl.privacy.analysis.steps`; ``otafl bound --composition``).
COMPOSITIONS = ("pld", "rdp", "rdp-classic")

#: ``otafl bound --user-sampling``: whether the adversary may see the record's user take part
#: (docs/privacy/steps.md#steps-user-sampling; "hidden" is refused at record level, with its reason).
USER_SAMPLING = ("revealed", "hidden")

CO_USERS = {
    "null": "co-users hold null records (x = 0): zero gradients, only their noise",
    "noise-cancelling": "co-users' steps undo the previous step's noise (local steps, q = 1)",
}
"""Co-user constructions of ``otafl audit-run`` by name (``audit.co_users``;
:mod:`otafl.fl.least_squares`)."""
