"""``otafl run`` as a library call: train a spec and write its results folder safely."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from otafl.config import Spec
from otafl.errors import OtaflInputError


def run_to_folder(spec: Spec, out_dir: str | Path, *, overwrite: bool = False, device: str | None = None,
                  on_round: Callable[[dict], None] | None = None):
    """Train ``spec`` (:func:`otafl.fl.loop.run_experiment`) and write ``out_dir/summary.json``
    and ``rounds.csv``.

    The folder is checked before training (:func:`otafl.results.prepare_run_dir`: an
    existing run is refused unless ``overwrite``); the files are written all or nothing when
    the run finishes, and a failed or interrupted run removes any folder it created. A new
    folder is written as a hidden sibling ``.NAME.partial-PID`` and renamed into place at the
    end, so no partial ``out_dir`` ever appears; if this process is killed outright (``kill
    -9``), a guard process (:class:`otafl.reaper.Reaper`) removes the stage and the parent
    folders this run created (should the guard be killed too, the next run into the same
    folder removes a dead process's stage).
    Returns the :class:`~otafl.fl.loop.RunResult`.
    """
    import shutil

    from otafl.fl.loop import run_experiment
    from otafl.reaper import Reaper
    from otafl.results import (discard_run_dir, prepare_run_dir, publish_run_dir, stage_path, stage_run_dir,
                               write_run)

    created = prepare_run_dir(str(out_dir), overwrite=overwrite)  # refused here, before any training
    stage = None
    guard = None
    try:
        if created and created[-1] == Path(out_dir):  # a new folder: written beside it, renamed at the end
            created.pop().rmdir()
            guard = Reaper()  # cleans up after a kill -9
            for folder in created:
                guard.remove_if_empty(folder)
            guard.remove(stage_path(out_dir))  # before it exists: no window without the guard
            stage = stage_run_dir(out_dir)
        result = run_experiment(spec, device=device, on_round=on_round)
        try:
            write_run(stage or out_dir, result.summary, result.rounds)  # all or nothing
            if stage is not None:
                publish_run_dir(stage, out_dir)
        except OSError as e:
            raise OtaflInputError(f"cannot write the results to {str(out_dir)!r}: {e.strerror or e}") from None
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        discard_run_dir(created)  # a failed or interrupted run leaves no folder of ours behind
        raise
    finally:
        if guard is not None:
            guard.close()  # published or cleaned up here: the guard exits doing nothing
    return result
