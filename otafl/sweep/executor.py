"""Run a sweep's grid points in worker processes and commit each result as it arrives.

The parent process owns the results file: it marks a point ``running`` when it hands it
to a worker, and commits the worker's returned ``(summary, rounds)`` in one transaction
(:meth:`otafl.sweep.store.ResultStore.mark_done`). Workers never touch the file, so there
is no write contention and a killed worker or parent loses at most the runs in flight,
which stay ``running`` and are rerun by ``--resume``.

Workers are ``spawn``-ed processes (:class:`concurrent.futures.ProcessPoolExecutor`):
no inherited locks or CUDA state, same behaviour on Linux, macOS and Windows. Each uses
one torch thread, so N workers fill N cores without oversubscription. At most N points
are in flight at a time, so ``running`` means "being computed now". ``workers = 0`` runs
the points in the calling process (debugging, notebooks).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable, Sequence

from otafl.config import Spec
from otafl.errors import OtaflInputError
from otafl.sweep.grid import GridPoint, point_label
from otafl.sweep.store import ResultStore

__all__ = ["SweepAborted", "SweepReport", "pending_points", "run_point", "run_sweep"]


class SweepAborted(RuntimeError):
    """The worker pool died (a worker was killed, e.g. out of memory); finished runs are kept."""


@dataclass
class SweepReport:
    """What a sweep did: counts of runs and the first failures (one line each)."""

    total: int  # grid points
    skipped: int = 0  # already done (``--resume``)
    done: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0


def _init_worker() -> None:
    """Process initializer: one torch thread per worker (N workers on N cores)."""
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


def pending_points(store: ResultStore, points: Sequence[GridPoint]) -> list[GridPoint]:
    """The points that still need a run: never started, ``running`` (interrupted) or ``failed``."""
    todo = []
    for pt in points:
        st = store.status_of(pt.params, pt.train)
        if st is None or st[1] != "done":
            todo.append(pt)
    return todo


def run_sweep(store: ResultStore, points: Sequence[GridPoint], *, workers: int = 1, device: str | None = None,
              progress: bool = True, on_done: Callable[[GridPoint, dict], None] | None = None) -> SweepReport:
    """Run every not-yet-``done`` point of ``points`` and commit each result to ``store``.

    Parameters
    ----------
    store : ResultStore
        Opened for writing (:func:`otafl.sweep.store.open_store`).
    points : sequence of GridPoint
        The whole grid (:func:`otafl.sweep.grid.expand_grid`); ``done`` points are skipped.
    workers : int >= 0
        Worker processes; 0 runs in this process.
    device : str, optional
        ``cpu`` / ``cuda`` / ``auto`` for every run (default: each spec's ``train.device``).
    progress : bool
        A tqdm progress bar on stderr (runs done / total, rate and ETA).
    on_done : callable, optional
        Called in the parent with (point, summary) after each commit.

    Returns
    -------
    SweepReport. A failed run is recorded as ``failed`` with its error and the sweep goes
    on; Ctrl-C stops it, leaving the runs in flight ``running`` for ``--resume``.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise OtaflInputError(f"workers = {workers!r} is outside the allowed range [0, inf) (an integer)")
    from tqdm import tqdm

    t0 = time.perf_counter()
    todo = pending_points(store, points)
    report = SweepReport(total=len(points), skipped=len(points) - len(todo))
    bar = tqdm(total=len(todo), desc="sweep", unit="run", disable=not progress, dynamic_ncols=True,
               smoothing=0.0)  # smoothing 0: ETA from the average run time so far

    def finish(pt: GridPoint, run_id: int, outcome: tuple[dict, list[dict]] | BaseException) -> None:
        if isinstance(outcome, BaseException):
            msg = f"{point_label(pt.values)}: {_one_line(outcome)}"
            store.mark_failed(run_id, msg)
            report.failed += 1
            if len(report.errors) < 5:
                report.errors.append(msg)
        else:
            summary, rounds = outcome
            store.mark_done(run_id, summary, rounds)
            report.done += 1
            if on_done is not None:
                on_done(pt, summary)
        bar.set_postfix(done=report.done, failed=report.failed, refresh=False)
        bar.update(1)

    try:
        if workers == 0:
            for pt in todo:
                run_id = store.mark_running(pt.params, pt.train, pt.values)
                try:
                    outcome = run_point(pt.spec, pt.train, device)
                except Exception as e:  # noqa: BLE001 - recorded as a failed run
                    outcome = e
                finish(pt, run_id, outcome)
        elif todo:
            ctx = multiprocessing.get_context("spawn")
            queue = list(reversed(todo))
            in_flight: dict[Future, tuple[GridPoint, int]] = {}
            workers = min(workers, len(todo))
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker) as pool:
                try:
                    while queue or in_flight:
                        while queue and len(in_flight) < workers:
                            pt = queue.pop()
                            run_id = store.mark_running(pt.params, pt.train, pt.values)
                            try:
                                fut = pool.submit(run_point, pt.spec, pt.train, device)
                            except BrokenProcessPool:
                                store.mark_failed(run_id, "worker pool broken before the run started")
                                raise SweepAborted(
                                    "a worker process died unexpectedly (out of memory?); finished runs are "
                                    "saved, rerun the same command with --resume") from None
                            in_flight[fut] = (pt, run_id)
                        finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            pt, run_id = in_flight.pop(fut)
                            try:
                                outcome = fut.result()
                            except Exception as e:  # noqa: BLE001 - includes a crashed worker
                                outcome = e
                            finish(pt, run_id, outcome)
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    finally:
        bar.close()
        report.wall_seconds = time.perf_counter() - t0
    return report
