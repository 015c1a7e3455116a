"""Progress of long jobs: a callback for the library, a tqdm bar for the command line.

The library (:mod:`otafl.api`) never draws anything. Its long functions take
``progress: Callable[[int, int], None] | None`` and call it with ``(done, total)`` work
units as they go (grid points, rounds, Monte Carlo batches: each function says which),
ending with exactly ``(total, total)``; :class:`Tally` is their bookkeeping. The commands
pass the callback of :func:`progress_bar`: a tqdm bar on stderr, drawn only when stderr is
a terminal, not with ``--quiet``, and only once the job has run for ``delay`` seconds, so
short jobs print nothing. tqdm is imported by :func:`progress_bar` only.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, TextIO

__all__ = ["Progress", "Tally", "progress_bar"]

Progress = Callable[[int, int], None]
"""``progress(done, total)``: ``done`` of ``total`` work units are finished."""


class Tally:
    """Counts the work units of one job and reports them to a :data:`Progress` (or to nobody).

    Reports ``(0, total)`` when made; ``advance(n)`` after each piece of work; ``part(units)``
    gives a callback for a sub-job worth ``units`` of this tally (its own (d, t) scaled into
    them); ``finish()`` reports ``(total, total)``.
    """

    def __init__(self, progress: Progress | None, total: int):
        self.progress = progress
        self.total = max(0, int(total))
        self.done = 0
        self._report()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)

    def advance(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + int(n))
        self._report()

    def part(self, units: int) -> Progress:
        base, units = self.done, int(units)

        def report(done: int, total: int) -> None:
            new = base + (units if total <= 0 else units * min(done, total) // total)
            if new != self.done:
                self.done = min(self.total, new)
                self._report()
        return report

    def finish(self) -> None:
        self.done = self.total
        self._report()


@contextlib.contextmanager
def progress_bar(desc: str, *, quiet: bool = False, unit: str = "it", delay: float = 0.5,
                 file: TextIO | None = None, enabled: bool | None = None) -> Iterator[Progress]:
    """A :data:`Progress` callback drawing a tqdm bar on ``file`` (default: stderr).

    The bar is drawn when ``enabled`` (default: ``file`` is a terminal) and not ``quiet``,
    once ``delay`` seconds have passed, and is removed when the block ends. The total is
    the one of the latest call.
    """
    out = sys.stderr if file is None else file
    show = not quiet and (bool(getattr(out, "isatty", lambda: False)()) if enabled is None else enabled)
    bars: list = []

    def update(done: int, total: int) -> None:
        if not show:
            return
        if not bars:
            from tqdm import tqdm

            bars.append(tqdm(total=total, desc=desc, unit=unit, file=out, delay=delay, leave=False,
                             dynamic_ncols=True))
        bar = bars[0]
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()
