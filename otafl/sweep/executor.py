"""Run a sweep's grid points in worker processes and commit each result as it arrives.

The parent process owns the results file: it marks a point ``running`` when it hands it
to a worker, and commits the worker's returned ``(summary, rounds)`` in one transaction
(:meth:`otafl.sweep.store.ResultStore.mark_done`). Workers never touch the file, so there
is no write contention and a killed worker or parent loses at most the runs in flight,
which stay ``running`` and are rerun by ``--resume``.

Workers are ``spawn``-ed processes, each talking to the parent over its own pipe: no
inherited locks or CUDA state, same behaviour on Linux, macOS and Windows. Each uses one
torch thread, so N workers fill N cores without oversubscription. At most N points are in
flight at a time, so ``running`` means "being computed now". ``workers = 0`` runs the
points in the calling process (debugging, notebooks).

Failure behaviour:

* Workers never outlive the parent. On Linux each asks the kernel for SIGKILL when its
  parent dies (``prctl(PR_SET_PDEATHSIG)``); everywhere a watchdog thread ends the worker
  within about a second once the parent is gone (its sentinel pipe closes or its pid
  changes), and an idle worker sees its pipe close. So ``kill -9`` of the sweep leaves
  no process behind holding the terminal or a ``| tee`` pipe open.
* Workers ignore SIGINT (they are started with it ignored, so a Ctrl-C sent to the whole
  process group reaches only the parent). On Ctrl-C the parent stops the workers at once
  (their runs stay ``running``) and re-raises :class:`KeyboardInterrupt`; further
  interrupts during that cleanup are absorbed, so there is no second traceback.
* A worker that dies (out of memory, killed) fails its run and aborts the sweep with
  :class:`SweepAborted`; finished runs are kept.

Executors: :data:`EXECUTORS` maps a name to the function that runs the pending points
(``otafl sweep --executor NAME``): ``process`` is the pool above, ``ray`` runs each point
as a Ray task on a local instance or a cluster (:mod:`otafl.sweep.ray_executor`, needs the
optional extra ``pip install -e ".[ray]"``). Whatever the executor, only this process
writes the results file.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for
from typing import Any, Callable, Sequence

from otafl.errors import OtaflInputError
from otafl.sweep.grid import GridPoint, point_label
from otafl.sweep.store import ResultStore
from otafl.sweep.worker import (  # noqa: F401 (SweepAborted, run_point: part of this module's interface)
    SweepAborted,
    _init_worker,
    _one_line,
    _sigint_deferred,
    _sigint_ignored,
    run_point,
)

__all__ = ["DEFAULT_EXECUTOR", "EXECUTORS", "SweepAborted", "SweepReport", "check_executor", "pending_points",
           "run_point", "run_sweep"]

STOP_TIMEOUT_S = 5.0  # how long a finished worker may take to exit before it is terminated
KILL_TIMEOUT_S = 2.0  # how long a terminated worker may take before SIGKILL
WATCHDOG_INTERVAL_S = 0.5  # how often a worker checks that its parent is alive


@dataclass
class SweepReport:
    """What a sweep did: counts of runs and the first failures (one line each)."""

    total: int  # grid points
    skipped: int = 0  # already done (``--resume``)
    done: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0


# --------------------------------------------------------------------------- worker side


def _set_parent_death_signal() -> bool:
    """Linux: have the kernel SIGKILL this process when its parent dies. True if set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        return libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc / no prctl: the watchdog still applies
        return False


def _watch_parent(parent_pid: int) -> None:
    """Watchdog thread: end this worker as soon as the parent is gone (portable fallback)."""
    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    while True:
        if sentinel is not None:
            try:
                gone = bool(wait_for([sentinel], timeout=WATCHDOG_INTERVAL_S))
            except OSError:
                gone = True
        else:
            time.sleep(WATCHDOG_INTERVAL_S)
            gone = False
        if gone or os.getppid() != parent_pid:
            os._exit(1)


def _guard_parent(parent_pid: int) -> None:
    """Make this worker die with its parent: PDEATHSIG (Linux) plus a watchdog thread."""
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="otafl-parent-watchdog", daemon=True).start()


def _worker_main(conn, parent_pid: int) -> None:
    """A worker: receive (job id, spec, train, device), send back (job id, ok, payload)."""
    _guard_parent(parent_pid)
    with contextlib.suppress(ValueError, OSError):  # started with SIGINT ignored; keep it so
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _init_worker()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if msg is None:
            return
        job_id, spec, train, device = msg
        try:
            reply = (job_id, True, run_point(spec, train, device))
        except Exception as e:  # noqa: BLE001 - reported as a failed run
            reply = (job_id, False, _one_line(e))
        try:
            conn.send(reply)
        except (BrokenPipeError, EOFError, OSError):
            return
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable summary value
            try:
                conn.send((job_id, False, f"the run's results could not be sent back: {_one_line(e)}"))
            except (BrokenPipeError, EOFError, OSError):
                return


# --------------------------------------------------------------------------- parent side


class _Worker:
    """One worker process, its end of the pipe and the run it is computing (if any)."""

    def __init__(self, ctx, index: int):
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child_conn, os.getpid()),
                                   name=f"otafl-sweep-worker-{index}")
        with _sigint_ignored():  # the child inherits SIG_IGN from the fork
            self.process.start()
        child_conn.close()
        self.job: tuple[GridPoint, int] | None = None

    def stop(self) -> None:
        """Ask an idle worker to exit (no effect if it is already gone)."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)


def _shut_down(pool: list[_Worker], graceful: bool) -> None:
    """End every worker: ask politely and wait (``graceful``), else terminate at once."""
    if graceful:
        for w in pool:
            w.stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for w in pool:
            w.process.join(max(0.0, deadline - time.monotonic()))
    for w in pool:
        if w.process.is_alive():
            w.process.terminate()
    deadline = time.monotonic() + KILL_TIMEOUT_S
    for w in pool:
        w.process.join(max(0.0, deadline - time.monotonic()))
        if w.process.is_alive():
            w.process.kill()
            w.process.join(KILL_TIMEOUT_S)
        with contextlib.suppress(OSError):
            w.conn.close()
        with contextlib.suppress(ValueError):
            w.process.close()


def pending_points(store: ResultStore, points: Sequence[GridPoint]) -> list[GridPoint]:
    """The points that still need a run: never started, ``running`` (interrupted) or ``failed``."""
    todo = []
    for pt in points:
        st = store.status_of(pt.params, pt.train)
        if st is None or st[1] != "done":
            todo.append(pt)
    return todo


def _died(process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_sweep(store: ResultStore, points: Sequence[GridPoint], *, workers: int | None = 1, device: str | None = None,
              progress: bool = True, on_done: Callable[[GridPoint, dict], None] | None = None,
              executor: str = "process", address: str | None = None) -> SweepReport:
    """Run every not-yet-``done`` point of ``points`` and commit each result to ``store``.

    Parameters
    ----------
    store : ResultStore
        Opened for writing (:func:`otafl.sweep.store.open_store`).
    points : sequence of GridPoint
        The whole grid (:func:`otafl.sweep.grid.expand_grid`); ``done`` points are skipped.
    workers : int >= 0, optional
        Worker processes (``process``; 0 runs in this process, None means 1) or at most
        this many Ray tasks at a time (``ray``; None: the cluster's CPUs).
    device : str, optional
        ``cpu`` / ``cuda`` / ``auto`` for every run (default: each spec's ``train.device``).
    progress : bool
        A tqdm progress bar on stderr (runs done / total, rate and ETA).
    on_done : callable, optional
        Called in the parent with (point, summary) after each commit.
    executor : str
        A key of :data:`EXECUTORS`: ``process`` (default) or ``ray``.
    address : str, optional
        ``ray`` only: the cluster to join (``auto``, ``HOST:PORT``); None starts a local
        Ray instance owned by this process (or uses the one already initialised).

    Returns
    -------
    SweepReport. A failed run is recorded as ``failed`` with its error and the sweep goes
    on; Ctrl-C stops it (and its workers), leaving the runs in flight ``running`` for
    ``--resume``. A worker (or Ray task) that dies raises :class:`SweepAborted` after
    recording its run as ``failed``.
    """
    check_executor(executor, workers=workers, address=address)
    from tqdm import tqdm

    t0 = time.perf_counter()
    todo = pending_points(store, points)
    report = SweepReport(total=len(points), skipped=len(points) - len(todo))
    bar = tqdm(total=len(todo), desc="sweep", unit="run", disable=not progress, dynamic_ncols=True,
               smoothing=0.0)  # smoothing 0: ETA from the average run time so far

    def finish(pt: GridPoint, run_id: int, outcome: tuple[dict, list[dict]] | str | BaseException) -> None:
        if isinstance(outcome, (str, BaseException)):
            msg = f"{point_label(pt.values)}: {outcome if isinstance(outcome, str) else _one_line(outcome)}"
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
                    outcome: Any = run_point(pt.spec, pt.train, device)
                except Exception as e:  # noqa: BLE001 - recorded as a failed run
                    outcome = e
                finish(pt, run_id, outcome)
        elif todo:
            EXECUTORS[executor](store, todo, finish, workers=workers, device=device, address=address)
    finally:
        bar.close()
        report.wall_seconds = time.perf_counter() - t0
    return report


def _run_in_workers(store: ResultStore, todo: list[GridPoint], n: int, device: str | None,
                    finish: Callable[[GridPoint, int, Any], None]) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = list(reversed(todo))
    pool: list[_Worker] = []
    graceful = False
    try:
        for i in range(n):
            pool.append(_Worker(ctx, i))
        while True:
            for w in pool:
                if w.job is None and queue:
                    pt = queue.pop()
                    run_id = store.mark_running(pt.params, pt.train, pt.values)
                    w.job = (pt, run_id)
                    try:
                        w.conn.send((run_id, pt.spec, pt.train, device))
                    except (BrokenPipeError, EOFError, OSError):
                        pass  # the worker is dead: its sentinel is ready, handled below
            busy = [w for w in pool if w.job is not None]
            if not busy:
                break
            ready = set(wait_for([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for w in busy:
                pt, run_id = w.job
                if w.conn in ready or w.process.sentinel in ready:
                    try:
                        got = w.conn.recv() if w.conn.poll() else None
                    except (EOFError, OSError):
                        got = None
                    if got is None:  # no answer and the process ended: it died
                        w.process.join(KILL_TIMEOUT_S)
                        why = _died(w.process)
                        finish(pt, run_id, f"the worker process died ({why}; out of memory?)")
                        raise SweepAborted(f"a worker process died unexpectedly ({why}; out of memory?); finished "
                                           f"runs are saved, rerun the same command with --resume")
                    job_id, ok, payload = got
                    w.job = None
                    finish(pt, run_id, payload)
        graceful = True
    finally:
        # Stop the workers whatever happened; a second Ctrl-C must not cut this short.
        with _sigint_deferred() as interrupted:
            _shut_down(pool, graceful)
        if interrupted and graceful:
            raise KeyboardInterrupt


# --------------------------------------------------------------------------- executors

Finish = Callable[[GridPoint, int, Any], None]  # (point, run id, (summary, rounds) | error) -> None
Executor = Callable[..., None]  # (store, todo, finish, *, workers, device, address) -> None


def _run_in_processes(store: ResultStore, todo: list[GridPoint], finish: Finish, *, workers: int | None,
                      device: str | None, address: str | None = None) -> None:
    """The ``process`` executor: a pool of ``workers`` spawned processes on this machine."""
    _run_in_workers(store, todo, min(1 if workers is None else workers, len(todo)), device, finish)


def _run_on_ray(store: ResultStore, todo: list[GridPoint], finish: Finish, *, workers: int | None,
                device: str | None, address: str | None = None) -> None:
    """The ``ray`` executor: each point a Ray task (:func:`otafl.sweep.ray_executor.run_on_ray`)."""
    from otafl.sweep.ray_executor import run_on_ray

    run_on_ray(store, todo, finish, workers=workers, device=device, address=address)


EXECUTORS: dict[str, Executor] = {"process": _run_in_processes, "ray": _run_on_ray}
DEFAULT_EXECUTOR = "process"


def check_executor(name: str, *, workers: int | None = None, address: str | None = None) -> None:
    """Refuse, in one line, an unknown executor, options it does not take, or a missing Ray.

    Cheap enough to call before a results file is opened (``otafl sweep`` does), so a bad
    combination writes nothing.
    """
    if name not in EXECUTORS:
        raise OtaflInputError(f"executor = {name!r} is not one of {', '.join(EXECUTORS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise OtaflInputError(f"workers = {workers!r} is outside the allowed range [0, inf) (an integer)")
    if name == "ray":
        if workers == 0:
            raise OtaflInputError("--workers 0 (run in this process) does not apply to --executor ray; "
                                  "give --workers N >= 1, or leave it out to use the cluster's CPUs")
        from otafl.sweep.ray_executor import import_ray

        import_ray()
    elif address is not None:
        raise OtaflInputError(f"--address {address} is for --executor ray (a Ray cluster); "
                              f"--executor {name} runs on this machine")
