"""Range checks of the local-steps knobs and the user-sampling reading, torch-free so that spec validation
(:mod:`otafl.validation`) runs before the accountants load; :mod:`otafl.privacy.accountants.steps`
re-exports them."""

from __future__ import annotations

from otafl.errors import OtaflInputError

MAX_LOCAL_STEPS = 100_000
"""Most local steps per round accepted (``train.local_steps``, ``bound --local-steps``)."""

MIN_STEP_NOISE = 1e-3
"""Smallest non-zero step noise multiplier accepted: below it a record's loss range spans
millions of units (no privacy to account; 0 means no noise, eps = inf)."""


def check_step_knobs(local_steps, step_noise, *, prefix: str = "") -> None:
    """Refuse local steps outside [1, MAX_LOCAL_STEPS] and a step noise outside 0 or
    [MIN_STEP_NOISE, 1e30] (``prefix``: ``train.`` / ``transmit.`` for spec keys)."""
    if isinstance(local_steps, bool) or int(local_steps) != local_steps or not 1 <= local_steps <= MAX_LOCAL_STEPS:
        raise OtaflInputError(f"{prefix and 'train.'}local_steps = {local_steps!r} is outside the allowed range "
                              f"[1, {MAX_LOCAL_STEPS}] (integers)")
    if step_noise is not None:
        z = float(step_noise)
        if not (z == 0.0 or MIN_STEP_NOISE <= z <= 1e30):
            raise OtaflInputError(f"{prefix and 'transmit.'}step_noise = {step_noise!r} is outside the allowed range "
                                  f"0 or [{MIN_STEP_NOISE:g}, 1e+30]")


def check_user_sampling(user_sampling: str) -> None:
    """Only the revealed reading of the user coin is sound at record level (a user's absence is
    not its presence without the record: its other records move its update visibly;
    docs/privacy/steps.md#steps-user-sampling)."""
    if user_sampling == "hidden":
        raise OtaflInputError("user_sampling = 'hidden' is refused: at record level a user's absence is visible "
                              "(its other records move its update), so the coin cannot amplify; use 'revealed' "
                              "(docs/privacy/steps.md#steps-user-sampling)")
    if user_sampling != "revealed":
        raise OtaflInputError(f"user_sampling = {user_sampling!r} is not one of: revealed")
