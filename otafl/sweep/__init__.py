"""Parameter sweeps: grid expansion (``grid``), the SQLite results store (``store``) and
the process-pool executor (``executor``), behind ``otafl sweep``.

In a notebook::

    from otafl.sweep import load_grid, open_store, run_sweep
    sweep, points = load_grid("experiments/quickstart-sweep.toml")
    with open_store("results.sqlite", resume=True, grid=grid_identity(sweep, points)) as store:
        report = run_sweep(store, points, workers=2)

``grid`` makes the file remember its sweep, so resuming it with a different grid is
refused instead of mixing two sweeps in one file.
"""

from otafl.sweep.executor import SweepAborted, SweepReport, run_sweep
from otafl.sweep.grid import GridPoint, SweepSpec, expand_grid, grid_identity, grid_size, load_grid, parse_sweep
from otafl.sweep.identity import GridIdentity
from otafl.sweep.store import ResultStore, StoredRun, open_store, read_store

__all__ = ["GridIdentity", "GridPoint", "ResultStore", "StoredRun", "SweepAborted", "SweepReport", "SweepSpec",
           "expand_grid", "grid_identity", "grid_size", "load_grid", "open_store", "parse_sweep", "read_store",
           "run_sweep"]
