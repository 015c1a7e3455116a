"""Sizes checked before memory is allocated.

Every command estimates what it is about to allocate from the sizes it was given (rounds,
users, model width, grid points, Monte-Carlo draws) and refuses, with one line naming the
estimate and the limit, anything above :func:`memory_limit_bytes`. The limit is 8 GiB by
default; ``otafl --memory-limit GB`` or the environment variable ``OTAFL_MEMORY_LIMIT_GB``
raises (or lowers) it. Estimates are upper-bound-ish orders of magnitude, not exact sizes.
"""

from __future__ import annotations

import math
import os

from otafl.errors import OtaflInputError

MEMORY_ENV = "OTAFL_MEMORY_LIMIT_GB"
DEFAULT_MEMORY_GB = 8.0
#: Largest model dimension / grid axis value that float64 arithmetic represents exactly.
MAX_EXACT_INT = 2**53


def memory_limit_bytes() -> float:
    """The memory limit in bytes: ``$OTAFL_MEMORY_LIMIT_GB`` GiB, default 8 GiB."""
    raw = os.environ.get(MEMORY_ENV)
    if raw is None or raw == "":
        return DEFAULT_MEMORY_GB * 2**30
    try:
        gb = float(raw)
    except ValueError:
        raise OtaflInputError(f"{MEMORY_ENV} = {raw!r} must be a number of GiB > 0") from None
    if not gb > 0:
        raise OtaflInputError(f"{MEMORY_ENV} = {raw!r} is outside the allowed range (0, inf)")
    return gb * 2**30


def human_bytes(n: float) -> str:
    """``3.2 TiB``, ``512 MiB``: a size for an error message."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n / 2**10:.3g} KiB"


def check_memory(what: str, nbytes: float) -> None:
    """Refuse ``what`` (e.g. ``"train.rounds = 1000000000 with data.users = 200"``) when its
    estimated ``nbytes`` exceed the limit; the message names both and how to raise it."""
    limit = memory_limit_bytes()
    if nbytes > limit:
        raise OtaflInputError(
            f"{what} needs about {human_bytes(nbytes)}, over the memory limit of {human_bytes(limit)} "
            f"(raise it with otafl --memory-limit GB or {MEMORY_ENV})")


#: Largest input width of a built-in data set (MNIST's 28 x 28 pixels).
MAX_FEATURES = 784
MAX_CLASSES = 10


def model_dim_upper(model: str, hidden: int, features: int = MAX_FEATURES, classes: int = MAX_CLASSES) -> int:
    """An upper bound on d for the built-in models, without building them."""
    if model == "two-layer":
        return features * hidden + hidden + hidden * classes + classes
    return features * classes + classes


def run_bytes(*, rounds: int, users: int, dim: int, batch: int) -> float:
    """Estimated peak bytes of a run: h and p [T, K] float64 and the per-round facts (another
    [T, K] pair), the model with gradient and Adam moments (4 d float32), and one round's
    per-user work (a [K, d] float32 tensor on the per-user paths, K b features)."""
    per_round = 4 * 8 * rounds * users + 600 * rounds
    model = 4 * 4 * dim
    round_work = 4 * users * (dim + batch * MAX_FEATURES)
    return float(per_round + model + round_work)


#: Accountants whose per-round bound sums the law of the participant count K_t over a window
#: of ~sqrt(K) counts around K p (tight, digital, steps: the binomial quantile; exact: the
#: count law); paper and the closed forms need no such window.
COUNT_WINDOW_ACCOUNTANTS = ("tight", "exact", "digital", "steps", "steps-sumdom")


def count_window_bytes(users: float, delta_prime: float | str = "auto") -> float:
    """Estimated peak bytes of the count window of K = ``users``: the binomial quantile sums
    sqrt(K ln(1 / (1e-12 delta')) / 2) counts below K p, the exact count law ~7 sqrt(K)
    around it; about 64 bytes a count (float64 pmf, cdf, steps, indices). Measured: 2.1 GB
    (tight) and 3.0 GB (exact) at K = 1e14. A delta' of 1/2 or more (possible with "auto")
    also sums sqrt(K ln(1 / (1e-12 (1 - delta'))) / 2) counts above K p."""
    auto = isinstance(delta_prime, str)
    dp = 1e-5 if auto else max(float(delta_prime), 1e-300)
    k = max(float(users), 1.0)
    window = math.sqrt(k * math.log(1.0 / (1e-12 * dp)) / 2.0)
    if auto or dp >= 0.5:
        window += math.sqrt(k * math.log(1.0 / (1e-12 * max(1.0 - dp, 2.0**-53))) / 2.0)
    return 64.0 * max(window, 7.0 * math.sqrt(k))


def exact_totals_bytes(users: float, rounds: int) -> float:
    """Estimated peak bytes of ``exact``'s totals over ``rounds`` rounds of ``users`` identical
    users (``bound``/``audit --rounds``): its per-user facts, stacked over the rounds.
    Measured: ~25 bytes a user and round (K = 1e6, T = 20); estimated 32 (+16 a user)."""
    return 8.0 * float(users) * (4 * int(rounds) + 2)


def check_exact_totals(users: float, rounds: int | None) -> None:
    """Refuse, before any allocation, ``exact``'s totals at a ``users`` x ``rounds`` beyond the limit."""
    if rounds is not None:
        check_memory(f"users = {users} with the exact accountant's totals over {rounds} rounds (per-user facts)",
                     exact_totals_bytes(users, rounds))


def synthetic_bytes(samples: int, features: int = 20) -> float:
    """Estimated peak bytes of drawing the ``synthetic`` data set of ``samples`` points: the
    float32 features (drawn, shifted by the class means, split into train and test: ~4
    copies of [N, F]) and the int64 labels and permutations (~4 of [N])."""
    return float(samples) * (4 * 4 * features + 4 * 8)


def bound_bytes(*, points: int, rounds: int, accountants: int) -> float:
    """Estimated peak bytes of a bound grid: each accountant's ~48 float64 fields per point
    and round (the rounds axis is materialised for the composed totals)."""
    return float(points) * max(1, rounds) * 8 * 48 * max(1, accountants)


#: Monte Carlo draws an audit may take without being asked (``--max-draws``).
DEFAULT_MAX_DRAWS = 10**9


def check_draws(what: str, draws: int, limit: int = DEFAULT_MAX_DRAWS) -> None:
    """Refuse a Monte Carlo audit of more than ``limit`` draws in all (a time limit: the
    draws are chunked, so memory stays small)."""
    if draws > limit:
        raise OtaflInputError(f"{what} = {draws:.3g} draws in all, over the limit of {limit:.3g} "
                              f"(raise it with --max-draws)")
