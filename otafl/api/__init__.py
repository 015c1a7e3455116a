"""Library entry points behind the bound-style commands: plain functions, no click.

Each takes keyword arguments in the units of the paper's system model (probabilities in
(0, 1], noise variances per coordinate in gradient units, SNR in dB, the model dimension
d as a parameter count) and returns plain Python data (lists, dicts, floats; +inf where a
bound is undefined), ready for :func:`otafl.results.jsonable`:

* :func:`otafl.api.bound.bound_grid` -- per-round (and composed) local / central DP
  bounds of the accountants on a product grid; ``{"rows", "meta"}``.
* :func:`otafl.api.audit.audit_grid` -- the Monte Carlo audit of the mechanism beside
  each accountant's (epsilon, delta); ``{"rows", "meta"}``.
* :func:`otafl.api.scaling.scaling_grid` / :func:`~otafl.api.scaling.scaling_curves` --
  central epsilon vs K for a fixed p and for p = a K^{-1/2}, with log-log slopes.
* :func:`otafl.api.curves.accountant_curves` -- per-round central epsilon vs p of
  ``paper``, ``tight`` and ``exact`` (the accountants figure).
* :func:`otafl.api.calibrate.calibrate` -- the value of one spec knob that meets a total
  (epsilon, delta) target over the run, from bounds-only runs; every solution interval.

Submodules are imported on first use: ``from otafl.api import bound_grid`` works.
"""

from __future__ import annotations

import importlib

from otafl.api.defaults import JSON_NON_FINITE, PAPER_DIM, accountant_names

__all__ = ["PAPER_DIM", "JSON_NON_FINITE", "accountant_names", "bound_grid", "channel_gain_floor", "audit_grid",
           "scaling_grid", "scaling_curves", "fit_loglog_slope", "accountant_curves"]

_LAZY = {"bound_grid": "bound", "channel_gain_floor": "bound", "audit_grid": "audit", "scaling_grid": "scaling",
         "scaling_curves": "scaling", "fit_loglog_slope": "scaling", "accountant_curves": "curves"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"otafl.api.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'otafl.api' has no attribute {name!r}")
