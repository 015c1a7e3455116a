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
    end, so even ``kill -9`` leaves no partial ``out_dir`` (only that stage, removed by the
    next run into the same folder).
    Returns the :class:`~otafl.fl.loop.RunResult`.
    """
    import shutil

    from otafl.fl.loop import run_experiment
    from otafl.results import discard_run_dir, prepare_run_dir, publish_run_dir, stage_run_dir, write_run

    created = prepare_run_dir(str(out_dir), overwrite=overwrite)  # refused here, before any training
    stage = None
    try:
        if created and created[-1] == Path(out_dir):  # a new folder: written beside it, renamed at the end
            created.pop().rmdir()
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
    return result
