"""``otafl sweep SPEC --out RESULTS.sqlite``: run a spec's ``[sweep]`` grid into an SQLite file."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import click

from otafl.cli.options import forget_caught_interrupt as _forget_caught_interrupt
from otafl.cli.options import raise_interrupt_on
from otafl.names import DEVICES
from otafl.sweep.executor import DEFAULT_EXECUTOR, EXECUTORS
from otafl.sweep.grid import DEFAULT_MAX_POINTS


def check_devices(points, device: str | None) -> None:
    """Refuse, before the results file exists, a device some point cannot use (cuda without CUDA)."""
    from otafl.device import resolve_device

    for name in sorted({device or pt.spec.train.device for pt in points}):
        resolve_device(name)


@click.command("sweep")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Results file (SQLite) [default: runs/<spec name>.sqlite].")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="Worker processes, one torch thread each; 0 runs in this process [default: 1]. "
                   "With --executor ray: at most this many Ray tasks at once [default: the cluster's CPUs].")
@click.option("--executor", type=click.Choice(list(EXECUTORS)), default=DEFAULT_EXECUTOR, show_default=True,
              help="process: a pool of worker processes on this machine; ray: one Ray task per run, on a "
                   "local Ray instance or the cluster at --address (needs pip install -e \".[ray]\").")
@click.option("--address", default=None, metavar="auto|HOST:PORT",
              help="With --executor ray: the Ray cluster to join (auto: $RAY_ADDRESS, else the cluster that "
                   "`ray start` started on this machine) [default: start a local Ray instance for this sweep].")
@click.option("--resume", is_flag=True,
              help="Continue a sweep in an existing results file: skip done runs, rerun running/failed ones.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a spec value for every point, e.g. --set train.rounds=50, or a sweep key, "
                   "e.g. --set sweep.train=false (repeatable).")
@click.option("--device", type=click.Choice(DEVICES), default=None,
              help="Where tensors live [default: each spec's train.device].")
@click.option("--dry-run", is_flag=True, help="Validate the grid and list its points; run nothing.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--max-points", type=click.IntRange(min=1), default=DEFAULT_MAX_POINTS, show_default=True,
              help="Refuse a larger grid (counted from the axis lengths before any point is built).")
@click.pass_context
def sweep(ctx, spec, out, workers, executor, address, resume, overrides, device, dry_run, quiet, max_points):
    """Run every point of the [sweep] grid in SPEC and store each finished run in OUT.

    The grid is the product of [sweep.axes] (any section.key of the spec) plus the
    [[sweep.points]], each crossed with sweep.seeds. Every point is validated before
    anything runs. Each finished run is committed at once (with its per-round rows), so
    an interrupted sweep loses only the runs in flight: rerun with --resume. The results
    file remembers its sweep: --resume with another spec, axes, seeds or --set values is
    refused.

    With --executor ray each run is a Ray task (one CPU, one torch thread) on a local Ray
    instance started for the sweep, or on the cluster at --address; this process alone
    writes OUT. Every machine of a cluster needs otafl installed and the data available.
    """
    from otafl.sweep.executor import SweepAborted, check_executor, pending_points, run_sweep
    from otafl.sweep.grid import grid_identity, load_grid, point_label
    from otafl.sweep.store import discard_if_empty, open_store

    sweep_spec, points = load_grid(spec, overrides, max_points=max_points)
    if dry_run:
        for pt in points:
            click.echo(f"{pt.index:4d}  {point_label(pt.values)}")
        click.echo(f"{len(points)} runs ({'trained' if sweep_spec.train else 'bounds only, train = false'})")
        return
    check_executor(executor, workers=workers, address=address)  # before OUT is created
    check_devices(points, device)
    if out is None:
        out = os.path.join("runs", f"{Path(spec).stem}.sqlite")
    store = open_store(out, resume=resume, grid=grid_identity(sweep_spec, points))
    interrupted = False
    terms: list[int] = []  # SIGTERM stops the sweep as Ctrl-C does, with its own line and exit code 143
    restore_term = raise_interrupt_on(signal.SIGTERM, terms)
    main_thread = threading.current_thread() is threading.main_thread()
    try:
        try:
            report = run_sweep(store, points, workers=workers, device=device, progress=not quiet,
                               executor=executor, address=address)
            store.check_intact()
        except SweepAborted as e:  # a worker died (e.g. out of memory): a failure, not bad input
            click.echo(f"error: {' '.join(str(e).split())}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            interrupted = True  # its runs in flight stay `running` for --resume
            if main_thread:  # a second Ctrl-C or SIGTERM: this same line and exit code
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _forget_caught_interrupt()
            if terms:
                click.echo(f"error: terminated by {signal.Signals(terms[0]).name}; finished runs are in {out}, "
                           f"rerun with --resume", err=True)
                ctx.exit(128 + terms[0])
            click.echo(f"error: interrupted; finished runs are in {out}, rerun with --resume", err=True)
            ctx.exit(130)
        done = len(points) - len(pending_points(store, points))  # grid points done: never above the grid size
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # closing the file is not cut short
        try:
            if interrupted:
                store.close()
            else:
                discard_if_empty(store)  # a sweep that failed before its first result leaves no file
        finally:
            restore_term()
    click.echo(f"{report.done} runs done, {report.skipped} skipped (already done), {report.failed} failed "
               f"in {report.wall_seconds:.1f} s; {done} of {report.total} grid points done -> {out}")
    if report.failed:
        click.echo(f"error: {report.failed} run(s) failed, first: {report.errors[0]}; "
                   f"fix and rerun with --resume", err=True)
        ctx.exit(1)
