"""A sweep's identity: the canonical set of its runs, and the first key in which two differ.

A results file records the :class:`GridIdentity` of the sweep that made it; ``--resume``
compares it with the sweep asked for and refuses another one, naming the first differing
key (:func:`grid_difference`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from otafl.results import jsonable


_MISSING = object()


@dataclass(frozen=True)
class GridIdentity:
    """What makes a sweep: its grid points, plus a readable description for messages.

    Build it with :func:`otafl.sweep.grid.grid_identity`. Two sweeps are the same when
    they have the same set of (params, train) points (:attr:`digest`); the order of the
    points and how the spec file spelt them do not matter.
    """

    entries: tuple[tuple[str, bool, str], ...]  # (params, train, point JSON), in run order
    description: tuple[tuple[str, Any], ...] = ()  # (key, JSON-able value): sweep.* keys, then shared spec keys

    @functools.cached_property
    def digest(self) -> str:
        h = hashlib.sha256()
        for params, train in sorted((p, int(t)) for p, t, _ in self.entries):
            h.update(json.dumps([params, train]).encode())
            h.update(b"\n")
        return h.hexdigest()


def _show(value: Any, missing: str) -> str:
    """A value for a one-line message: JSON, shortened."""
    if value is _MISSING:
        return missing
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= 60 else text[:57] + "..."


def _first_key_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """``key: OLD in the store, NEW now`` for the first key whose value differs (sweep.* keys first)."""
    keys = list(old) + [k for k in new if k not in old]
    keys.sort(key=lambda k: not k.startswith("sweep."))  # stable: sweep keys first, each group in order
    for k in keys:
        a, b = old.get(k, _MISSING), new.get(k, _MISSING)
        if a != b:
            missing = "(none)" if k.startswith("sweep.") else "(varies by point)"
            return f"{k}: {_show(a, missing)} in the store, {_show(b, missing)} now"
    return None


def _flat_params(params: str) -> dict[str, Any]:
    """A run's canonical spec JSON -> {"section.key": value}."""
    tree = json.loads(params)
    return {f"{section}.{key}": v for section, body in tree.items() if isinstance(body, dict)
            for key, v in body.items()}


def grid_difference(old_desc: Sequence[Sequence[Any]] | None, new: GridIdentity,
                     old_entries: Sequence[tuple[str, bool, str]]) -> str:
    """One line saying how the stored sweep differs from ``new``, naming the first differing key."""
    if old_desc is not None:
        new_desc = json.loads(json.dumps(jsonable([list(kv) for kv in new.description])))
        why = _first_key_difference({k: v for k, v in old_desc}, {k: v for k, v in new_desc})
        if why:
            return why
    # Point by point: the first stored point that the new grid lacks, against its counterpart.
    new_ids = {(p, bool(t)) for p, t, _ in new.entries}
    by_point = {pt: (p, bool(t)) for p, t, pt in new.entries}
    for i, (params, train, point) in enumerate(old_entries):
        if (params, bool(train)) in new_ids:
            continue
        other = by_point.get(point) or ((new.entries[i][0], bool(new.entries[i][1])) if i < len(new.entries)
                                        else None)
        if other is None:
            break
        if bool(train) != other[1]:
            return f"sweep.train: {_show(bool(train), '')} in the store, {_show(other[1], '')} now"
        why = _first_key_difference(_flat_params(params), _flat_params(other[0]))
        if why:
            label = ", ".join(f"{k}={json.dumps(v)}" for k, v in json.loads(point or "{}").items()) or "(base spec)"
            return f"{why} (grid point {label})"
    return f"grid points: {len(old_entries)} in the store, {len(new.entries)} now"
