"""Errors that the CLI turns into one line on stderr and exit code 2.

Library code raises :class:`OtaflInputError` (a ``ValueError``) for bad input; the
message names the offending value and the allowed range, e.g.
``sampling.p = 1.5 is outside the allowed range (0, 1]``.
"""

from __future__ import annotations


class OtaflInputError(ValueError):
    """Bad user input: an out-of-range value, a malformed spec, missing data."""


def out_of_range(name: str, value, allowed: str) -> OtaflInputError:
    """Build the standard error for a value outside its allowed range."""
    return OtaflInputError(f"{name} = {value!r} is outside the allowed range {allowed}")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> float:
    """Return ``value`` if it lies in the interval, else raise :func:`out_of_range`.

    ``lo``/``hi`` of ``None`` mean unbounded; ``*_open`` makes that end exclusive.
    NaN is always rejected.
    """
    v = float(value)
    ok = v == v  # NaN check
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v < hi if hi_open else v <= hi
    if not ok:
        left = "(" if (lo_open or lo is None) else "["
        right = ")" if (hi_open or hi is None) else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise out_of_range(name, value, f"{left}{lo_s}, {hi_s}{right}")
    return v
