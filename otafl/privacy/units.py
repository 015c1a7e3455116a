"""What an epsilon protects: the privacy unit of each accountant's statement (docs/privacy/index.md#neighbours).

Standard library only, so that every output layer can name the unit beside (epsilon, delta).

* ``user`` -- all of one user's data replaced. FedSGD clips the user's whole minibatch
  gradient to L, and DP-FedAvg / DP-SCAFFOLD send an update clipped (or normalised) into the
  L-ball, so whatever the user's data, its transmitted vector lies in that ball: sensitivity
  2L. The over-the-air accountants (``paper``, ``tight``, ``exact``) and ``digital`` bound
  exactly that, for every algorithm; a record-level guarantee follows.
* ``record`` -- one record of one user added or removed, the DP-SGD convention: the ``steps``
  accountants of local DP-SGD steps (sensitivity C per step). Their FedSGD reading (no step
  noise: one step of sensitivity 2L on the clipped gradient) is user level.
"""

from __future__ import annotations

__all__ = ["UNITS", "UNIT_LABELS", "unit_of", "units_note"]

UNITS = {
    "user": "user level: all of one user's data replaced (its clipped vector moves anywhere in the L-ball)",
    "record": "record level: one record of one user added or removed (local DP-SGD steps)",
}
"""The privacy units by name, with what a neighbouring data set is."""

UNIT_LABELS = {"user": "user level", "record": "record level"}
"""Short labels for lines, table cells and figure captions."""

_RECORD_LEVEL = ("steps", "steps-sumdom")


def unit_of(accountant: str, *, local_steps: bool = True) -> str:
    """The unit of ``accountant``'s epsilon: ``record`` for the local-steps accountants on local
    DP-SGD steps (``local_steps``: the facts carry step noise), ``user`` otherwise."""
    return "record" if accountant in _RECORD_LEVEL and local_steps else "user"


def units_note(units: dict[str, str]) -> str:
    """One legend line naming each accountant's unit, and saying so when they differ
    (a table or figure that mixes units compares different neighbour relations)."""
    by_unit: dict[str, list[str]] = {}
    for name, unit in units.items():
        by_unit.setdefault(unit, []).append(name)
    parts = [f"{', '.join(names)}: " + " / ".join(UNITS.get(u, u) for u in unit.split("/"))
             for unit, names in by_unit.items()]
    kinds = {u for unit in by_unit for u in unit.split("/")}
    mixed = "MIXED UNITS, not directly comparable; " if len(kinds) > 1 else ""
    return f"privacy unit: {mixed}" + "; ".join(parts)
