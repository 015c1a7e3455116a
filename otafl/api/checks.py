"""The entry points' input checks, torch-free: :func:`~otafl.api.bound.bound_grid`,
:func:`~otafl.api.audit.audit_grid` and :func:`~otafl.api.curves.accountant_curves` call
them first, and the commands call them before importing those modules, so that a bad option
(``otafl bound --p 2``) is refused in one line before torch loads (tests/test_cli_startup.py).

Each raises :class:`otafl.errors.OtaflInputError` on the first problem, in the order the entry
point always checked them (the messages of tests/test_bad_input.py).
"""

from __future__ import annotations

import math
from typing import Sequence

from otafl.api.defaults import check_accountants
from otafl.errors import OtaflInputError, check_range, check_scale, check_snr_db
from otafl.limits import (COUNT_WINDOW_ACCOUNTANTS, MAX_EXACT_INT, bound_bytes, check_draws, check_exact_totals,
                          check_memory, count_window_bytes)
from otafl.privacy.accountants.registry import STEPS_ACCOUNTANTS
from otafl.privacy.knobs import check_step_knobs, check_user_sampling
from otafl.privacy.names import ADVERSARIES, COMPOSITIONS

CHUNK_ELEMENTS = 1 << 14
"""(grid point, round) pairs per chunk of :func:`~otafl.api.bound.bound_grid`: bounds the
accountants' temporaries."""

ROW_BYTES = 1024
"""Memory of one output row of ``bound_grid``, for the memory guard (a dict of ~20 Python values:
~0.7 KB measured without totals, ~0.9 KB with them)."""

MAX_AUDIT_USERS = 1e12
"""Largest K ``audit_grid`` draws for: its participant counts come from a window of ~7 sqrt(K)
categories, and torch.multinomial takes at most 2^24 (K = 10^12: 7 10^6)."""


def check_bound_grid(*, users: Sequence[int], p: Sequence[float], sigma2: Sequence[float], clip: Sequence[float],
                     snr_db: Sequence[float], accountants: Sequence[str], delta_l: float,
                     delta_prime: float | str, n0: float | None, dim: int, rounds: int | None,
                     channel: str | None, delta_target: float | None, composition: str, user_sampling: str,
                     max_delta: float | None, local_steps: int = 1, record_sampling: float = 1.0,
                     step_noise: float | None = None) -> list[str]:
    """``bound_grid``'s inputs (its docstring); returns the accountants as a list without
    repeats. With a ``channel`` preset the grid's size is checked once the fading is drawn
    (:func:`check_grid_memory`); without, here. The steps knobs' ranges are checked whatever
    the accountants (a bad value is refused, not ignored); that local steps and record sampling
    need a step noise, only where a steps accountant reads them."""
    accountants = check_accountants(accountants)
    check_user_sampling(user_sampling)
    check_step_knobs(local_steps, step_noise)
    check_range("record_sampling", record_sampling, lo=0.0, hi=1.0, lo_open=True)
    if step_noise is None and (local_steps != 1 or record_sampling != 1.0) and any(
            a in STEPS_ACCOUNTANTS for a in accountants):
        raise OtaflInputError("local_steps and record_sampling need step_noise (the per-step noise multiplier)")
    for value in p:
        check_range("p", value, lo=0.0, hi=1.0, lo_open=True)
    for value in sigma2:
        check_scale("sigma2", value, zero=True)
    for value in clip:
        check_scale("clip", value)
    for value in snr_db:
        check_snr_db("snr_db", value)
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if not isinstance(delta_prime, str):
        check_range("delta_prime", delta_prime, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    elif delta_prime != "auto":
        raise OtaflInputError(f"delta_prime = {delta_prime!r} is outside the allowed range (0, 1) or 'auto'")
    if delta_target is not None:
        check_range("delta_total", delta_target, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if max_delta is not None:
        check_range("max_delta", max_delta, lo=0.0, hi=1.0, lo_open=True)
    check_range("dim", dim, lo=1, hi=MAX_EXACT_INT)
    if rounds is not None:
        check_range("rounds", rounds, lo=1)
    if composition not in COMPOSITIONS:
        raise OtaflInputError(f"composition = {composition!r} is outside the allowed range "
                              f"{{{', '.join(COMPOSITIONS)}}}")
    if composition == "rdp-classic" and rounds is not None and any(a not in STEPS_ACCOUNTANTS for a in accountants):
        raise OtaflInputError("composition = 'rdp-classic' is for the steps accountant only (steps, steps-sumdom); "
                              f"{', '.join(a for a in accountants if a not in STEPS_ACCOUNTANTS)} compose with pld "
                              "or rdp")
    if channel is not None:
        if users or snr_db:
            raise OtaflInputError("--users and --snr-db come from the channel preset; leave them out with --channel")
        if n0 is not None:
            check_scale("n0", n0, zero=True)
        return accountants
    check_grid_memory(users=users, p=p, sigma2=sigma2, clip=clip, snr_db=snr_db, accountants=accountants,
                      delta_prime=delta_prime, rounds=rounds, evaluated_rounds=1, n0=1.0 if n0 is None else n0)
    return accountants


def check_grid_memory(*, users, p, sigma2, clip, snr_db, accountants: Sequence[str], delta_prime,
                      rounds: int | None, evaluated_rounds: int, n0: float,
                      chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """The users' range, N0, and the grid's memory (the count window of ``exact``, the chunk and
    the rows) against the memory limit; returns the chunk (grid points evaluated at a time)."""
    for value in users:
        check_range("users", value, lo=1, hi=MAX_EXACT_INT)
    window = [a for a in accountants if a in COUNT_WINDOW_ACCOUNTANTS]
    if window and users:
        check_memory(f"users = {max(users)} with the {window[0]} accountant (its participant-count window)",
                     count_window_bytes(max(users), delta_prime))
    if "exact" in accountants and users:  # its totals state every user of every round
        check_exact_totals(max(users), rounds)
    check_scale("n0", n0, zero=True)
    points = math.prod((len(users), len(p), len(sigma2), len(clip), len(snr_db)))
    span = max(evaluated_rounds, rounds or 1)  # the rounds axis a chunk materialises
    chunk = max(1, min(points, chunk_elements // span))
    check_memory(f"a grid of {points} points x {rounds or 1} rounds x {len(accountants)} accountants",
                 bound_bytes(points=chunk, rounds=span, accountants=1) + points * len(accountants) * ROW_BYTES)
    return chunk


def check_audit_grid(*, users, p, sigma2, clip, snr_db, accountants: Sequence[str], samples: int, dim: int,
                     rounds: int | None, scope: str, adversary: str, confidence: float, max_draws: int,
                     delta_l: float, delta_prime, n0: float, delta_total: float | None) -> list[str]:
    """``audit_grid``'s inputs, then those of the ``bound_grid`` call it makes; returns the
    accountants as a list without repeats."""
    from otafl.api.defaults import AUDIT_SCOPES

    accountants = check_accountants(accountants)
    check_range("samples", samples, lo=1)
    check_range("dim", dim, lo=1, hi=MAX_EXACT_INT)
    for value in users:  # the draws pick a count from a window of ~7 sqrt(K) (torch.multinomial: < 2^24)
        check_range("users", value, lo=1, hi=MAX_AUDIT_USERS)
    if "exact" in accountants and users:  # exact's totals state every user of every round
        check_exact_totals(max(users), rounds)
    grid_points = math.prod(len(axis) for axis in (users, p, sigma2, clip, snr_db))
    horizons_n = 1 + (rounds is not None)
    check_draws(f"{grid_points} grid points x {2 if scope == 'both' else 1} scopes x {horizons_n} horizons x "
                f"--samples {samples}", grid_points * (2 if scope == "both" else 1) * horizons_n * samples,
                max_draws)
    if scope not in AUDIT_SCOPES:
        raise OtaflInputError(f"scope = {scope!r} is outside the allowed range {{{', '.join(AUDIT_SCOPES)}}}")
    if adversary not in ADVERSARIES:
        raise OtaflInputError(f"adversary = {adversary!r} is outside the allowed range "
                              f"{{{', '.join(ADVERSARIES)}}}")
    check_range("confidence", confidence, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    via_bound = [a for a in accountants if a != "exact"]
    check_bound_grid(users=users, p=p, sigma2=sigma2, clip=clip, snr_db=snr_db, accountants=via_bound or ["paper"],
                     delta_l=delta_l, delta_prime=delta_prime, n0=n0, dim=dim, rounds=rounds, channel=None,
                     delta_target=None if rounds is None else delta_total, composition="pld",
                     user_sampling="revealed", max_delta=None)
    return accountants


def check_curves(*, p, users, sigma2, clip, delta_l, n0, dim) -> None:
    """``accountant_curves``' inputs."""
    for value in p:
        check_range("p", value, lo=0.0, hi=1.0, lo_open=True)
    check_range("users", users, lo=1)
    check_scale("sigma2", sigma2, zero=True)
    check_scale("clip", clip)
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    check_scale("n0", n0, zero=True)
    check_range("dim", dim, lo=1)


MAX_USERS = 1e12
"""Largest number of users K of a scaling grid (K is an integer; inf is refused)."""


def check_log_users(k_min: float, k_max: float, points: int) -> None:
    """The log grid of K of ``scaling_grid`` (:func:`otafl.api.scaling.log_users`)."""
    check_range("k_min", k_min, lo=1, hi=MAX_USERS, finite=True)
    check_range("k_max", k_max, lo=k_min, hi=MAX_USERS, lo_open=True, finite=True)
    check_range("points", points, lo=2)


def check_scaling_grid(*, k_min, k_max, points, exact_points, p, a, sigma2, clip, delta_l, accountants, dim, n0,
                       snr_db) -> list[str]:
    """``scaling_grid``'s inputs that need no K values (those of ``scaling_curves`` with them
    are checked there); returns the accountants as a list without repeats."""
    check_range("exact_points", exact_points, lo=2)
    check_log_users(k_min, k_max, points)
    return check_scaling_inputs(p=p, a=a, sigma2=sigma2, clip=clip, delta_l=delta_l, accountants=accountants,
                                dim=dim, n0=n0, snr_db=snr_db)


def check_scaling_inputs(*, p, a, sigma2, clip, delta_l, accountants, dim, n0, snr_db) -> list[str]:
    """The inputs ``scaling_grid`` and ``scaling_curves`` share (not the K values); returns the
    accountants as a list without repeats."""
    accountants = check_accountants(accountants)
    check_range("p", p, lo=0.0, hi=1.0, lo_open=True)
    check_range("a", a, lo=0.0, lo_open=True)
    check_scale("sigma2", sigma2)
    check_scale("clip", clip)
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    check_range("dim", dim, lo=1)
    check_scale("n0", n0, zero=True)
    check_snr_db("snr_db", snr_db)
    return accountants
