"""The check every ``audit-run`` test makes of its result (shared by the audit tests)."""


def assert_sound(result: dict, skip: tuple[str, ...] = ()) -> None:
    """The audit's lower bounds (fitted and threshold) stay below every accountant's claim."""
    assert result["accountants"], result
    for name, row in result["accountants"].items():
        if name in skip:
            continue
        assert row["epsilon_lower"] is not None
        ci = row["epsilon_lower_threshold_ci"]
        assert row["epsilon_lower_threshold"] == ci[0] <= ci[1]
        assert row["epsilon_lower"] <= row["epsilon"], (name, row)
        assert row["epsilon_lower_threshold"] <= row["epsilon"], (name, row)
        assert not row["exceeded"], (name, row)
