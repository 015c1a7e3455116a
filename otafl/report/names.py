"""The names the report commands accept (figure kinds, epsilon axes, image suffixes, table
formats), kept apart from the drawing code so that the CLI can offer them without
importing matplotlib."""

#: ``otafl plot --kind``: accuracy vs round, epsilon vs p, accuracy vs epsilon, channel traces,
#: accuracy and epsilon vs a swept key (K).
KINDS = ("accuracy", "privacy", "tradeoff", "channel", "scaling")
#: ``--epsilon``: the worst round's leakage or the total composed over the run.
EPSILONS = ("round", "total")
#: Image formats, by the output file's suffix.
SUFFIXES = (".png", ".svg", ".pdf")


def check_suffix(out) -> str:
    """The image format from the output suffix; other suffixes: OtaflInputError."""
    from pathlib import Path

    from otafl.errors import OtaflInputError

    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise OtaflInputError(f"--out {str(out)!r} has suffix {suffix or '(none)'!r}; allowed: {', '.join(SUFFIXES)}")
    return suffix[1:]
