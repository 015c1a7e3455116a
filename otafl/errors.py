"""Errors that the CLI turns into one line on stderr and exit code 2.

Library code raises :class:`OtaflInputError` (a ``ValueError``) for bad input; the
message names the offending value and the allowed range, e.g.
``sampling.p = 1.5 is outside the allowed range (0, 1]``.
"""

from __future__ import annotations

import math


class OtaflInputError(ValueError):
    """Bad user input: an out-of-range value, a malformed spec, missing data."""


def out_of_range(name: str, value, allowed: str) -> OtaflInputError:
    """Build the standard error for a value outside its allowed range."""
    return OtaflInputError(f"{name} = {value!r} is outside the allowed range {allowed}")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False, finite: bool = False) -> float:
    """Return ``value`` if it lies in the interval, else raise :func:`out_of_range`.

    ``lo``/``hi`` of ``None`` mean unbounded; ``*_open`` makes that end exclusive.
    NaN is always rejected; ``finite`` rejects +-inf too (the range then reads "..., finite").
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise OtaflInputError(f"{name} = {value!r} is not a number") from None
    if finite and v in (math.inf, -math.inf):
        left = "(" if (lo_open or lo is None) else "["
        right = ")" if (hi_open or hi is None) else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise out_of_range(name, value, f"{left}{lo_s}, {hi_s}{right}, finite")
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


#: Largest (and 1 / smallest non-zero) magnitude accepted for the physical scales: the clip L,
#: the noise variances sigma^2 and N0, the large-scale gains. Within [1e-30, 1e30] the round's
#: derived quantities (L^2 + d sigma^2, the alignment gain c_t, N0 / c_t^2, (Delta / s)^2) stay
#: finite and non-zero in float64; beyond it L^2 overflows or c_t underflows to 0 and a round
#: would read as perfect privacy.
MAX_SCALE = 1e30


def check_scale(name: str, value, *, zero: bool = False) -> float:
    """Return ``value`` if it is a physical scale in [1e-30, 1e30] (or exactly 0 with
    ``zero``), else raise :func:`out_of_range` naming that range."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise OtaflInputError(f"{name} = {value!r} is not a number") from None
    if (zero and v == 0.0) or (1.0 / MAX_SCALE <= v <= MAX_SCALE):
        return v
    allowed = f"{'0 or ' if zero else ''}[{1.0 / MAX_SCALE:g}, {MAX_SCALE:g}]"
    raise out_of_range(name, value, allowed)


SNR_DB_RANGE = (-100.0, 100.0)
"""Allowed transmit SNRs in dB (``channel.snr_db``, ``--snr-db``). Beyond, the channel noise
variance N0 / c_t^2 (about 10^(-SNR/10) in gradient units) leaves float64's range in the
accountants' sums (it underflowed to 0 near 1540 dB and made a noiseless channel look
private); within it the power budget 10^(SNR/10) spans 1e-10 to 1e10, far inside it."""


def check_snr_db(name: str, value) -> float:
    """Return ``value`` if it is an SNR in dB within :data:`SNR_DB_RANGE`, else raise naming it."""
    lo, hi = SNR_DB_RANGE
    return check_range(name, value, lo, hi)

