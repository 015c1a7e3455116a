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

import importlib

#: Each re-exported name -> its submodule, imported on first use (PEP 562): the CLI reads the
#: executors' and the grid's names without loading multiprocessing and sqlite3 for --help.
_LAZY = {**dict.fromkeys(["SweepAborted", "SweepReport", "run_sweep"], "executor"),
         **dict.fromkeys(["GridPoint", "SweepSpec", "expand_grid", "grid_identity", "grid_size", "load_grid",
                          "parse_sweep"], "grid"),
         "GridIdentity": "identity",
         **dict.fromkeys(["ResultStore", "StoredRun", "open_store", "read_store"], "store")}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"otafl.sweep.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'otafl.sweep' has no attribute {name!r}")


__all__ = ["GridIdentity", "GridPoint", "ResultStore", "StoredRun", "SweepAborted", "SweepReport", "SweepSpec",
           "expand_grid", "grid_identity", "grid_size", "load_grid", "open_store", "parse_sweep", "read_store",
           "run_sweep"]
