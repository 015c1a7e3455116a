"""What a sweep worker runs, shared by the process pool (:mod:`otafl.sweep.executor`) and the
Ray executor (:mod:`otafl.sweep.ray_executor`): one grid point, its one-line failure message,
the one-thread set-up of a worker, and the SIGINT guards of the parent.

(A module of its own so that the two executors do not import each other.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import traceback
from typing import TYPE_CHECKING, Iterator

from otafl.errors import OtaflInputError

if TYPE_CHECKING:
    from otafl.config import Spec

__all__ = ["SweepAborted", "run_point"]


class SweepAborted(RuntimeError):
    """A worker process died (killed, e.g. out of memory); finished runs are kept."""


def _init_worker() -> None:
    """One torch thread per worker (N workers on N cores)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (or parallel work already started)
        pass


def run_point(spec: Spec, train: bool, device: str | None = None) -> tuple[dict, list[dict]]:
    """Run one grid point (in a worker): ``run_experiment`` -> (summary, per-round records)."""
    from otafl.fl.loop import run_experiment

    result = run_experiment(spec, device=device, train=train)
    return result.summary, result.rounds


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OtaflInputError):
        return " ".join(str(exc).split())
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}{where}"


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored (children started inside inherit that, so Ctrl-C reaches the parent only)."""
    if not _in_main_thread() or not hasattr(signal, "SIGINT"):
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Record SIGINTs instead of raising them (cleanup must not be interrupted half-way)."""
    seen: list[int] = []
    if not _in_main_thread():
        yield seen
        return
    old = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, old)
