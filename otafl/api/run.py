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
    the run finishes, and a failed or interrupted run removes any folder it created.
    Returns the :class:`~otafl.fl.loop.RunResult`.
    """
    from otafl.fl.loop import run_experiment
    from otafl.results import discard_run_dir, prepare_run_dir, write_run

    created = prepare_run_dir(str(out_dir), overwrite=overwrite)  # refused here, before any training
    try:
        result = run_experiment(spec, device=device, on_round=on_round)
        try:
            write_run(out_dir, result.summary, result.rounds)  # all or nothing
        except OSError as e:
            raise OtaflInputError(f"cannot write the results to {str(out_dir)!r}: {e.strerror or e}") from None
    except BaseException:
        discard_run_dir(created)  # a failed or interrupted run leaves no folder of ours behind
        raise
    return result
