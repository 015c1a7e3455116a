"""The ``ray`` sweep executor: every grid point a Ray task, on this machine or a cluster.

``otafl sweep SPEC --executor ray [--address auto|HOST:PORT]``. Ray is an optional extra
(``pip install -e ".[ray]"``); this module imports it only when a sweep uses it.

The driver (the ``otafl sweep`` process) alone writes the results file, as with the
process pool: it marks a point ``running`` just before submitting its task and commits
the ``(summary, rounds)`` the task returns (:func:`otafl.sweep.worker.run_point`) when
it arrives. Each task asks Ray for one CPU and runs one torch thread. At most
``workers`` tasks are in flight (default: the cluster's CPUs), so a large grid never
floods the cluster's queue and ``running`` rows are the points submitted now.

Failure behaviour (as the process pool):

* An exception in a run fails that run (one line in the store) and the sweep goes on.
* A task whose worker or node dies (out of memory, killed) fails its run and aborts the
  sweep with :class:`otafl.sweep.worker.SweepAborted`; finished runs are kept. Tasks
  are not retried (``max_retries = 0``): ``--resume`` reruns them.
* Ctrl-C cancels the outstanding tasks and re-raises :class:`KeyboardInterrupt`; further
  interrupts during that cleanup are absorbed.
* Without ``address`` (and no Ray already initialised in this process) ``ray.init()``
  starts a local instance owned by the driver: Ray starts its processes fate-shared with
  the driver (on Linux the kernel kills them when it dies), and :func:`ray.shutdown` ends
  them when the sweep ends, so nothing outlives a finished, interrupted or killed sweep.
  Ray's two agent processes (dashboard and runtime-env agents) are not fate-shared: after
  a ``kill -9`` of the driver they would wait out a 60 s timeout fixed in Ray, so a guard
  process (:class:`otafl.reaper.Reaper`) records the driver's descendants while it runs
  and ends those still alive when it dies (SIGTERM, SIGKILL 2 s later; measured: all gone
  2.1 s after the kill). With
  ``address`` the cluster is not ours: the outstanding tasks are cancelled best-effort
  (in a ``finally`` block and at exit) and the driver disconnects; Ray itself ends a dead
  driver's tasks. A Ray instance already initialised in this process (a notebook) is
  used as it is and left running.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import threading
from typing import Any, Callable

from otafl.errors import OtaflInputError
from otafl.limits import MEMORY_ENV
from otafl.reaper import Reaper
from otafl.sweep.worker import SweepAborted, _init_worker, _one_line, _sigint_deferred, run_point
from otafl.sweep.grid import GridPoint
from otafl.sweep.store import ResultStore

__all__ = ["INSTALL_HINT", "import_ray", "run_on_ray"]

INSTALL_HINT = 'pip install -e ".[ray]"'
PROBE_TIMEOUT_S = 5.0  # a cluster address must accept a connection within this
WAIT_S = 0.5  # ray.wait timeout: the driver loop stays responsive to Ctrl-C
_FORWARDED_ENV = (MEMORY_ENV,)  # driver settings a task must see (otafl --memory-limit)


def import_ray():
    """The ``ray`` module, or a one-line :class:`OtaflInputError` naming the extra to install."""
    try:
        import ray
    except ImportError as e:
        raise OtaflInputError(f"--executor ray needs Ray, which is not installed here ({e}); "
                              f"install the extra: {INSTALL_HINT}") from None
    return ray


def _ray_task(spec, train: bool, device: str | None, env: dict[str, str]) -> tuple[bool, Any]:
    """One grid point in a Ray worker: (True, (summary, rounds)) or (False, one-line error)."""
    os.environ.update(env)
    _init_worker()  # one torch thread: the task holds one CPU
    try:
        return True, run_point(spec, train, device)
    except Exception as e:  # noqa: BLE001 - reported as a failed run
        return False, _one_line(e)


def _probe(address: str) -> None:
    """Refuse at once a cluster address where nothing listens (``ray.init`` would retry for minutes).

    Best-effort: ``auto`` is resolved as Ray does (``RAY_ADDRESS``, then the address file
    of the last ``ray start`` on this machine); Ray Client addresses (``ray://``) and
    anything that cannot be resolved are left to ``ray.init``.
    """
    if address.startswith("ray://"):
        return
    resolved = address
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            resolved = canonicalize_bootstrap_address(address) or ""
        except Exception:  # noqa: BLE001 - a private helper; ray.init will say what is wrong
            return
    host, sep, port = resolved.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        via = f" (found by --address {address})" if resolved != address else ""
        raise OtaflInputError(f"no Ray cluster answers at {resolved}{via}: {e.strerror or e}; start one with "
                              f"`ray start --head` or check --address") from None


def _connect(ray, address: str | None, workers: int | None) -> None:
    """``ray.init``: join ``address``, or start a local instance owned by this process."""
    if address is not None:
        _probe(address)
    kwargs: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.ERROR)
    if address is None:  # a local instance, owned by this process
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports unless asked for
        kwargs.update(include_dashboard=False)
        if workers is not None:  # --workers N: N tasks at once, as N worker processes would
            kwargs.update(num_cpus=max(workers, os.cpu_count() or 1))
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise OtaflInputError(f"could not start or join {where}: {first.strip()}") from None


def _cancel(ray, refs) -> None:
    """Cancel tasks best-effort (force: their workers are killed); never raises."""
    for ref in list(refs):
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)


def run_on_ray(store: ResultStore, todo: list[GridPoint], finish: Callable[[GridPoint, int, Any], None], *,
               workers: int | None = None, device: str | None = None, address: str | None = None) -> None:
    """Run ``todo`` as Ray tasks, at most ``workers`` at a time; ``finish`` commits each result."""
    ray = import_ray()
    from ray.exceptions import RayError, RayTaskError, TaskCancelledError

    owned = not ray.is_initialized()  # else the caller's Ray (a notebook, a test): used, left running
    in_flight: dict[Any, tuple[GridPoint, int]] = {}  # ObjectRef -> (point, run id)
    cancel_at_exit = None
    graceful = False
    guard = None
    try:
        if owned:
            if address is None:  # our own instance: its processes must not outlive a killed driver
                guard = Reaper()
                guard.tree()
            main = threading.current_thread() is threading.main_thread()
            on_term = signal.getsignal(signal.SIGTERM) if main else None
            _connect(ray, address, workers)
            if on_term is not None:  # Ray's core installs a SIGTERM handler that prints a stack dump; keep ours
                signal.signal(signal.SIGTERM, on_term)
        cap = workers if workers else max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
        env.setdefault("OMP_NUM_THREADS", "1")
        cancel_at_exit = atexit.register(_cancel, ray, in_flight)  # if this frame never gets to its finally
        queue = list(reversed(todo))
        while queue or in_flight:
            while queue and len(in_flight) < cap:
                pt = queue.pop()
                run_id = store.mark_running(pt.params, pt.train, pt.values)
                in_flight[task.remote(pt.spec, pt.train, device, env)] = (pt, run_id)
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=WAIT_S)
            for ref in ready:
                pt, run_id = in_flight.pop(ref)
                try:
                    ok, payload = ray.get(ref)
                except RayTaskError as e:  # raised outside run_point, e.g. unpicklable results
                    finish(pt, run_id, f"the Ray task failed: {_one_line(getattr(e, 'cause', None) or e)}")
                    continue
                except TaskCancelledError:
                    finish(pt, run_id, "the Ray task was cancelled")
                    raise SweepAborted("a Ray task was cancelled from outside the sweep; finished runs are "
                                       "saved, rerun the same command with --resume") from None
                except RayError as e:  # the worker or its node died
                    why = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
                    finish(pt, run_id, f"the Ray worker died ({why})")
                    raise SweepAborted(f"a Ray task's worker died unexpectedly ({why}); finished runs are "
                                       f"saved, rerun the same command with --resume") from None
                finish(pt, run_id, payload if ok else str(payload))
        graceful = True
    finally:
        # Cancel what is still out and let go of Ray; a second Ctrl-C must not cut this short.
        with _sigint_deferred() as interrupted:
            if in_flight:
                _cancel(ray, in_flight)
            if cancel_at_exit is not None:
                atexit.unregister(cancel_at_exit)
            if owned:
                with contextlib.suppress(Exception):
                    ray.shutdown()  # a local instance ends here; a cluster is only disconnected from
            if guard is not None:
                guard.close()
        if interrupted and graceful:
            raise KeyboardInterrupt
