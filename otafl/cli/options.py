"""Options and parsing shared by the bound-style commands (``bound``, ``audit``, ``scaling``).

Decorators stack click options the commands share (rasterio's ``options`` module style),
so a grid axis or an output switch is declared once:

    @click.command("bound")
    @grid_options
    @delta_options(delta_l_help="delta of the Gaussian step.")
    ...
    @output_options
    def bound(users, p, sigma2, clip, snr_db, delta_l, delta_prime, ..., fmt, device): ...
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Callable, Sequence

import click

from otafl.errors import OtaflInputError


def parse_list(name: str, text: str | Sequence, cast=float) -> list:
    """'0.1,0.5' -> [0.1, 0.5]; an OtaflInputError naming the option for anything else."""
    items = [text] if not isinstance(text, str) else text.split(",")
    out = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        try:
            value = cast(item)
        except ValueError:
            raise OtaflInputError(f"{name} = {item!r} is not a {cast.__name__}") from None
        if cast is float and not math.isfinite(value):
            raise OtaflInputError(f"{name} = {item!r} is outside the allowed range (finite numbers)")
        out.append(value)
    if not out:
        raise OtaflInputError(f"{name} is empty; give a comma-separated list")
    return out


def parse_delta_prime(value: str) -> float | str:
    """``--delta-prime``: "auto" or a number (range-checked by the accountants)."""
    if value == "auto":
        return "auto"
    try:
        return float(value)
    except ValueError:
        raise OtaflInputError(f"delta_prime = {value!r} is outside the allowed range (0, 1) or 'auto'") from None


def json_safe(value):
    """Non-finite floats -> None, recursively (JSON has no inf/NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def rows_csv(rows: list[dict]) -> str:
    """One CSV line per row dict (header from the first), +inf written as ``inf``."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("inf" if isinstance(v, float) and v == math.inf else v) for k, v in row.items()})
    return buf.getvalue()


class CommaChoice(click.Choice):
    """A click.Choice that also accepts a comma-separated list (returned as a tuple)."""

    name = "comma_choice"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parent = super()  # (a bare super() does not work inside the generator below)
        return tuple(parent.convert(v.strip(), param, ctx) for v in str(value).split(",") if v.strip())


def _stack(*decorators: Callable) -> Callable:
    def apply(f):
        for decorator in reversed(decorators):
            f = decorator(f)
        return f
    return apply


grid_options = _stack(
    click.option("--users", default="200", show_default=True, help="Number of users K (comma list)."),
    click.option("--p", "p", default="0.5", show_default=True,
                 help="Participation probability in (0, 1] (comma list)."),
    click.option("--sigma2", default="0.1", show_default=True,
                 help="Artificial noise variance per coordinate, gradient units (comma list)."),
    click.option("--clip", default="1", show_default=True, help="Clipping norm L; sensitivity is 2L (comma list)."),
    click.option("--snr-db", "snr_db", default="10", show_default=True, help="Transmit SNR in dB (comma list)."),
)
"""``--users --p --sigma2 --clip --snr-db``: the axes of a bound grid, each a comma list."""


def delta_options(*, delta_l_help: str, delta_prime_help: str) -> Callable:
    """``--delta-l`` (float, 1e-5) and ``--delta-prime`` (number or auto)."""
    return _stack(
        click.option("--delta-l", "delta_l", type=float, default=1e-5, show_default=True, help=delta_l_help),
        click.option("--delta-prime", "delta_prime", default="auto", show_default=True, help=delta_prime_help),
    )


output_options = _stack(
    click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
                 show_default=True),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
)
"""``--format table|csv|json`` and ``--device auto|cpu|cuda``."""


def echo_result(result: dict, fmt: str, render_table: Callable[[dict], str]) -> None:
    """Print ``{"rows": [...], "meta": {...}}`` as JSON (inf -> null), CSV or the command's table."""
    if fmt == "json":
        click.echo(json.dumps(json_safe(result), indent=1, allow_nan=False))
    elif fmt == "csv":
        click.echo(rows_csv(result["rows"]), nl=False)
    else:
        click.echo(render_table(result), nl=False)
