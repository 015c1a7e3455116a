"""Options and parsing shared by the bound-style commands (``bound``, ``audit``, ``scaling``,
``plot-accountants``).

Decorators stack click options the commands share (rasterio's ``options`` module style),
so a grid axis or an output switch is declared once:

    @click.command("bound")
    @grid_options
    @delta_options(delta_l_help="delta of the Gaussian step.")
    ...
    @output_options
    @quiet_option
    def bound(users, p, sigma2, clip, snr_db, delta_l, delta_prime, ..., fmt, device, quiet): ...

The commands only parse: the work is one call into :mod:`otafl.api`, the printing is
:mod:`otafl.report.text` (:func:`echo_result`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import click

from otafl.api.defaults import accountant_names
from otafl.errors import OtaflInputError
from otafl.names import DEVICES


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


def delta_total_option(help: str = "") -> Callable:
    """``--delta-total`` (alias ``--delta-target``): the one delta of every accountant's totals."""
    from otafl.api.defaults import DELTA_TOTAL

    return click.option("--delta-total", "--delta-target", "delta_total", type=float, default=DELTA_TOTAL,
                        show_default=True, help=help or "The one delta at which every accountant states its "
                        "totals over the rounds (privacy.delta_total; docs/privacy/composition.md#delta-total); where an "
                        "accountant's fixed per-round tails already reach it, its total is inf.")


def max_delta_option() -> Callable:
    """``--max-delta``: the largest sane delta; deltas above it are flagged [default 1/K]."""
    return click.option("--max-delta", "max_delta", type=float, default=None,
                        help="Flag every per-round or total delta above this value [default: 1/K].")


def accountant_option(*, default: Sequence[str],
                      help: str = "Accountant(s), repeatable or comma-separated.") -> Callable:
    """``--accountant``: a :class:`CommaChoice` of the registered accountants, repeatable;
    the value is a tuple of tuples (flatten it with :func:`accountant_list`)."""
    return click.option("--accountant", "accountant", type=CommaChoice(accountant_names()), multiple=True,
                        default=tuple(default), show_default=True, help=help)


def accountant_list(groups) -> list[str]:
    """The ``--accountant`` values (repeated options, comma lists) as one list without
    repeats; empty for ``--accountant ''`` (the library then says "no accountant given")."""
    names = [n for group in groups for n in (group if isinstance(group, tuple) else (group,))]
    return list(dict.fromkeys(names))


output_options = _stack(
    click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
                 show_default=True, help='Output: an aligned text table, CSV rows, or JSON {"rows", "meta"} '
                                         '(non-finite numbers as the strings "inf", "-inf", "nan").'),
    click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
                 help="Where to compute: auto = cuda if available, else cpu."),
)
"""``--format table|csv|json`` and ``--device auto|cpu|cuda``."""

quiet_option = click.option(
    "--quiet", is_flag=True,
    help="No progress bar. The bar is drawn on stderr only when it is a terminal and the job takes more than "
         "half a second.")
"""``--quiet``: no progress bar (:func:`otafl.progress.progress_bar`)."""


def echo_result(result: dict, fmt: str, render_table: Callable[[dict], str]) -> None:
    """Print ``{"rows": [...], "meta": {...}}`` as JSON (:func:`otafl.report.text.json_text`:
    non-finite numbers as strings), CSV (the rows) or the command's text table."""
    from otafl.report.text import csv_text, json_text

    if fmt == "json":
        click.echo(json_text({"rows": result["rows"], "meta": result["meta"]}))
    elif fmt == "csv":
        click.echo(csv_text(result["rows"]), nl=False)
    else:
        click.echo(render_table(result), nl=False)


def forget_caught_interrupt() -> None:
    """Make ``python -m otafl`` exit with our code 130 after a caught Ctrl-C.

    CPython remembers a KeyboardInterrupt that ended code run through a string
    ``exec``/``eval`` (for example a dataclass being built by an import the interrupt
    hit), even after it is caught, and ``python -m`` then ends the process by SIGINT
    (status -2) instead of with the exit code. Every string ``exec`` clears that memory.
    """
    exec("pass")  # noqa: S102 - a constant string


def raise_interrupt_on(signum: int, caught: list[int]) -> Callable[[], None]:
    """Make ``signum`` (SIGTERM) end the command the way Ctrl-C does: the handler records
    it in ``caught``, ignores any repeat (so the cleanup is not cut short) and raises
    :class:`KeyboardInterrupt`. Returns the function that restores the previous handler;
    outside the main thread nothing is installed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(sig, frame):
        caught.append(sig)
        signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    old = signal.signal(signum, handler)
    return lambda: signal.signal(signum, old)
