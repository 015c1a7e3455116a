"""``otafl run`` as a library call: train a spec and write its results folder safely."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from otafl.config import Spec


def run_to_folder(spec: Spec, out_dir: str | Path, *, overwrite: bool = False, device: str | None = None,
                  on_round: Callable[[dict], None] | None = None):
    """Train ``spec`` (:func:`otafl.fl.loop.run_experiment`) and write ``out_dir/summary.json``
    and ``rounds.csv``.

    The folder is checked before training (:func:`otafl.results.prepare_run_dir`: an
    existing run is refused unless ``overwrite``). The results are written into a hidden
    sibling ``.NAME.partial-PID`` and published in one rename when the run finishes
    (:class:`otafl.publish.RunFolder`): never over a folder another run filled meanwhile
    (:class:`otafl.publish.PublishConflict`, this run's results kept in ``NAME-2``), and with
    ``overwrite`` by swapping the old folder for the new one in one step. A failed or
    interrupted run removes any folder it created; if this process is killed outright (``kill
    -9``), a guard process (:class:`otafl.reaper.Reaper`) removes the stage and puts back an
    old folder set aside (should the guard be killed too, the next run into the same folder
    does it). Returns the :class:`~otafl.fl.loop.RunResult`.
    """
    from otafl.fl.loop import run_experiment
    from otafl.publish import RunFolder

    with RunFolder(out_dir, overwrite=overwrite) as folder:  # refused here, before any training
        result = run_experiment(spec, device=device, on_round=on_round)
        folder.publish(result.summary, result.rounds)
    return result
