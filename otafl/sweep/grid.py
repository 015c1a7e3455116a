"""Sweep grids: the ``[sweep]`` table of a spec -> a validated list of run specs.

A spec file may carry a ``[sweep]`` table (``otafl.config`` ignores it; it is read here)::

    [sweep]
    seeds = [0, 1]          # train.seed values; default: the spec's train.seed
    train = true            # false: bounds only (no gradients, accuracy NaN)

    [sweep.axes]            # the grid is the Cartesian product of these axes
    "sampling.p" = [0.1, 0.5, 0.9]
    "channel.snr_db" = [0.0, 10.0, 20.0]

    [[sweep.points]]        # extra points, appended to the product (each crossed with seeds)
    "sampling.scheme" = "channel-aware"
    "sampling.h_th" = 2.0

Axis keys are any ``section.key`` of the run spec (``sampling.p``, ``channel.snr_db``,
``transmit.sigma2``, ``transmit.clip``, ``sampling.scheme``, ``estimator.kind``,
``data.users``, ...). An axis value may itself be a list where the key takes one (for
example ``"channel.snr_db" = [[2, 10, 30], [5, 15, 35]]`` sweeps two per-group SNR
vectors). ``points`` entries are literal: a list value is one value, not an axis.

Expansion order: the product of the axes in the order written (the last axis varies
fastest), then the points, each of those crossed with the seeds (seed fastest). Values
apply in this order: the spec file, then ``--set`` overrides, then the grid point, so a
grid value always wins. Every point's spec is built and validated by
:func:`otafl.config.spec_from_mapping` before anything runs; a bad axis stops the sweep
with one line that names the point. Points whose full spec is identical are kept once.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from otafl.config import SECTIONS, Spec, parse_override, read_toml, spec_from_mapping
from otafl.errors import OtaflInputError

__all__ = ["SweepSpec", "GridPoint", "parse_sweep", "expand_grid", "load_grid", "point_label"]

SWEEP_KEYS = ("axes", "points", "seeds", "train")


@dataclass(frozen=True)
class SweepSpec:
    """The ``[sweep]`` table, checked: axes (ordered), extra points, seeds, train flag."""

    axes: dict[str, list[Any]] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    seeds: list[int] | None = None  # None: the base spec's train.seed
    train: bool = True


@dataclass(frozen=True)
class GridPoint:
    """One run of a sweep.

    ``values`` holds what the grid set (``{"sampling.p": 0.1, "train.seed": 0}``);
    ``spec`` is the full validated run spec; ``params`` is its canonical JSON, the run's
    identity in the results store (together with ``train``).
    """

    index: int
    values: dict[str, Any]
    spec: Spec
    train: bool

    @property
    def params(self) -> str:
        return self.spec.canonical_json()


def _check_key(where: str, dotted: Any) -> tuple[str, str]:
    """``section.key`` -> (section, key), or a one-line error listing what is allowed."""
    if not isinstance(dotted, str) or dotted.count(".") != 1:
        raise OtaflInputError(f"{where} key {dotted!r} must look like section.key, e.g. 'sampling.p'")
    section, key = dotted.split(".")
    if section not in SECTIONS:
        raise OtaflInputError(f"{where} key {dotted!r}: unknown section {section!r}; allowed: {', '.join(SECTIONS)}")
    names = sorted(f.name for f in dataclasses.fields(SECTIONS[section]))
    if key not in names:
        raise OtaflInputError(f"{where} key {dotted!r}: unknown key {key!r} in [{section}]; allowed: {', '.join(names)}")
    if dotted == "train.seed":
        raise OtaflInputError(f"{where} key 'train.seed': list seeds in sweep.seeds = [...] instead")
    return section, key


def parse_sweep(table: Any) -> SweepSpec:
    """Check a parsed ``[sweep]`` table (``None`` or ``{}``: a single point) -> :class:`SweepSpec`."""
    if table is None:
        return SweepSpec()
    if not isinstance(table, dict):
        raise OtaflInputError(f"[sweep] must be a table, found {table!r}")
    unknown = sorted(set(table) - set(SWEEP_KEYS))
    if unknown:
        raise OtaflInputError(f"unknown key sweep.{unknown[0]}; allowed: {', '.join(SWEEP_KEYS)}")

    axes_raw = table.get("axes", {})
    if not isinstance(axes_raw, dict):
        raise OtaflInputError(f"sweep.axes must be a table of 'section.key' = [values], found {axes_raw!r}")
    axes: dict[str, list[Any]] = {}
    for dotted, values in axes_raw.items():
        _check_key("sweep axis", dotted)
        if not isinstance(values, list):
            raise OtaflInputError(f"sweep axis {dotted!r} = {values!r} must be a list of values")
        if not values:
            raise OtaflInputError(f"sweep axis {dotted!r} is empty; give at least one value")
        axes[dotted] = list(values)

    points_raw = table.get("points", [])
    if not isinstance(points_raw, list) or not all(isinstance(p, dict) for p in points_raw):
        raise OtaflInputError(f"sweep.points must be a list of tables {{ 'section.key' = value, ... }}, found {points_raw!r}")
    points = []
    for i, pt in enumerate(points_raw):
        if not pt:
            raise OtaflInputError(f"sweep.points[{i}] is empty; give at least one 'section.key' = value")
        for dotted in pt:
            _check_key(f"sweep.points[{i}]", dotted)
        points.append(dict(pt))

    seeds = table.get("seeds")
    if seeds is not None:
        if not isinstance(seeds, list):
            raise OtaflInputError(f"sweep.seeds = {seeds!r} must be a list of integers >= 0")
        if not seeds:
            raise OtaflInputError("sweep.seeds is empty; give at least one seed (an integer >= 0)")
        for s in seeds:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise OtaflInputError(f"sweep.seeds entry {s!r} must be an integer >= 0")
        if len(set(seeds)) != len(seeds):
            raise OtaflInputError(f"sweep.seeds = {seeds!r} lists a seed twice")

    train = table.get("train", True)
    if not isinstance(train, bool):
        raise OtaflInputError(f"sweep.train = {train!r} must be true or false")
    return SweepSpec(axes=axes, points=points, seeds=list(seeds) if seeds is not None else None, train=train)


def point_label(values: Mapping[str, Any]) -> str:
    """``{"sampling.p": 0.1, "train.seed": 0}`` -> ``sampling.p=0.1, train.seed=0`` (error messages, logs)."""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items()) or "(base spec)"


def expand_grid(raw: Mapping[str, Any], *, base_dir: Path | None = None,
                overrides: list[str] | tuple[str, ...] = ()) -> tuple[SweepSpec, list[GridPoint]]:
    """Expand a parsed spec file (with its ``[sweep]`` table) into validated grid points.

    Parameters
    ----------
    raw : mapping
        The parsed TOML (``read_toml``), ``[sweep]`` included.
    base_dir : Path, optional
        Folder of the spec file (channel presets are looked up relative to it).
    overrides : sequence of ``section.key=value``
        ``--set`` strings; ``sweep.KEY=VALUE`` overrides a key of the ``[sweep]`` table
        (``--set sweep.train=false``, ``--set 'sweep.seeds=[0,1,2]'``).

    Returns
    -------
    (SweepSpec, list of GridPoint), the points in run order, duplicates removed.

    Raises
    ------
    OtaflInputError
        Bad ``[sweep]`` table, or the first grid point whose spec does not validate
        (the message names that point's values).
    """
    base: dict[str, Any] = {k: copy.deepcopy(v) for k, v in raw.items() if k != "sweep"}
    sweep_table = copy.deepcopy(raw.get("sweep", {}))
    for text in overrides:
        section, key, value = parse_override(text)
        if section == "sweep":
            if not isinstance(sweep_table, dict):
                raise OtaflInputError(f"[sweep] must be a table, found {sweep_table!r}")
            sweep_table[key] = value
        else:
            body = base.setdefault(section, {})
            if not isinstance(body, dict):
                raise OtaflInputError(f"[{section}] must be a table, found {body!r}")
            body[key] = value
    sweep = parse_sweep(sweep_table)

    combos: list[dict[str, Any]] = []
    names = list(sweep.axes)
    if names or not sweep.points:
        combos += [dict(zip(names, vals)) for vals in itertools.product(*(sweep.axes[n] for n in names))]
    combos += [dict(p) for p in sweep.points]

    points: list[GridPoint] = []
    seen: set[str] = set()
    for combo in combos:
        tree = copy.deepcopy(base)
        for dotted, value in combo.items():
            section, key = dotted.split(".")
            body = tree.setdefault(section, {})
            if not isinstance(body, dict):
                raise OtaflInputError(f"[{section}] must be a table, found {body!r}")
            body[key] = value
        try:
            first = spec_from_mapping(tree, base_dir=base_dir)
        except OtaflInputError as e:
            raise OtaflInputError(f"sweep point {point_label(combo)}: {e}") from None
        seeds = sweep.seeds if sweep.seeds is not None else [first.train.seed]
        for seed in seeds:
            spec = dataclasses.replace(first, train=dataclasses.replace(first.train, seed=seed))
            key = spec.canonical_json()
            if key in seen:
                continue
            seen.add(key)
            points.append(GridPoint(index=len(points), values={**combo, "train.seed": seed},
                                    spec=spec, train=sweep.train))
    return sweep, points


def load_grid(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[SweepSpec, list[GridPoint]]:
    """Read a spec file and expand its ``[sweep]`` table (see :func:`expand_grid`)."""
    raw = read_toml(path)
    return expand_grid(raw, base_dir=Path(path).resolve().parent, overrides=overrides)
