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

Size: the number of points is counted from the axis lengths first (:func:`grid_size`), and
a grid of more than ``max_points`` (default :data:`DEFAULT_MAX_POINTS`, ``otafl sweep
--max-points``) is refused before a single point is built.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from otafl.config import SECTIONS, Spec, parse_override, read_toml, spec_from_mapping
from otafl.errors import OtaflInputError
from otafl.results import jsonable
from otafl.sweep.identity import GridIdentity

__all__ = ["DEFAULT_MAX_POINTS", "SweepSpec", "GridPoint", "check_grid_size", "expand_grid", "grid_identity",
           "grid_size", "load_grid", "parse_sweep", "point_label"]

SWEEP_KEYS = ("axes", "points", "seeds", "train")
DEFAULT_MAX_POINTS = 100_000  # larger grids are refused before any point is built (--max-points)


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

    @functools.cached_property
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


def grid_size(sweep: SweepSpec) -> int:
    """Number of grid points from the axis lengths, without building any of them.

    (product of the axis lengths, if there are axes or no extra points) + extra points,
    times the number of seeds. An upper bound: points whose full spec is identical are
    kept once by :func:`expand_grid`.
    """
    combos = math.prod(len(v) for v in sweep.axes.values()) if (sweep.axes or not sweep.points) else 0
    return (combos + len(sweep.points)) * (len(sweep.seeds) if sweep.seeds is not None else 1)


def check_grid_size(sweep: SweepSpec, max_points: int | None = DEFAULT_MAX_POINTS) -> int:
    """:func:`grid_size`, or a one-line :class:`OtaflInputError` if it exceeds ``max_points``."""
    n = grid_size(sweep)
    if max_points is not None and n > max_points:
        parts = []
        if sweep.axes:
            parts.append(" x ".join(str(len(v)) for v in sweep.axes.values()) + " axis values")
        if sweep.points:
            parts.append(f"{len(sweep.points)} extra point(s)")
        how = " + ".join(parts) or "the base spec"
        if sweep.seeds is not None:
            how = f"{f'({how})' if len(parts) > 1 else how} x {len(sweep.seeds)} seed(s)"
        raise OtaflInputError(f"the sweep grid has {n} points ({how}), over the limit of {max_points} points; "
                              f"narrow sweep.axes or pass --max-points {n} to run it anyway")
    return n


def _split_overrides(raw: Mapping[str, Any], overrides: list[str] | tuple[str, ...]) -> tuple[dict[str, Any], Any]:
    """The run sections and the ``[sweep]`` table of ``raw``, with ``--set`` overrides applied."""
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
    return base, sweep_table


def expand_grid(raw: Mapping[str, Any], *, base_dir: Path | None = None,
                overrides: list[str] | tuple[str, ...] = (),
                max_points: int | None = DEFAULT_MAX_POINTS) -> tuple[SweepSpec, list[GridPoint]]:
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
    max_points : int or None
        Refuse a grid of more points than this (counted from the axis lengths, before
        anything is built; :func:`grid_size`); None: no limit.

    Returns
    -------
    (SweepSpec, list of GridPoint), the points in run order, duplicates removed.

    Raises
    ------
    OtaflInputError
        Bad ``[sweep]`` table, a grid over ``max_points``, or the first grid point whose
        spec does not validate (the message names that point's values).
    """
    base, sweep_table = _split_overrides(raw, overrides)
    sweep = parse_sweep(sweep_table)
    check_grid_size(sweep, max_points)

    names = list(sweep.axes)
    combos: Iterable[dict[str, Any]] = ()
    if names or not sweep.points:
        combos = (dict(zip(names, vals)) for vals in itertools.product(*(sweep.axes[n] for n in names)))
    combos = itertools.chain(combos, (dict(p) for p in sweep.points))

    points: list[GridPoint] = []
    seen: set[bytes] = set()
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
            pt = GridPoint(index=len(points), values={**combo, "train.seed": seed}, spec=spec, train=sweep.train)
            key = hashlib.sha256(pt.params.encode()).digest()
            if key in seen:
                continue
            seen.add(key)
            points.append(pt)
    return sweep, points


def grid_identity(sweep: SweepSpec, points: Sequence[GridPoint]) -> GridIdentity:
    """The sweep's identity for its results file: every point's (params, train, values), and
    a description (``sweep.*`` keys, then the spec values all points share) from which a
    mismatch is explained as ``train.rounds: 3 in the store, 4 now``."""
    entries = []
    shared: dict[str, Any] | None = None
    for pt in points:
        params = pt.params
        entries.append((params, pt.train, json.dumps(jsonable(dict(pt.values)), sort_keys=True)))
        flat = {f"{section}.{key}": v for section, body in json.loads(params).items() for key, v in body.items()}
        if shared is None:
            shared = flat
        else:
            shared = {k: v for k, v in shared.items() if k in flat and flat[k] == v}
    seeds = sweep.seeds if sweep.seeds is not None else sorted({pt.spec.train.seed for pt in points})
    desc: list[tuple[str, Any]] = [("sweep.train", sweep.train), ("sweep.seeds", list(seeds))]
    desc += [(f"sweep.axes.{name}", values) for name, values in sweep.axes.items()]
    if sweep.points:
        desc.append(("sweep.points", sweep.points))
    desc += [(k, v) for k, v in (shared or {}).items() if k != "train.seed"]
    return GridIdentity(entries=tuple(entries), description=tuple(desc))


def load_grid(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *,
              max_points: int | None = DEFAULT_MAX_POINTS) -> tuple[SweepSpec, list[GridPoint]]:
    """Read a spec file and expand its ``[sweep]`` table (see :func:`expand_grid`). A file
    without one (and no ``--set sweep.KEY=...``) is refused: a sweep of it would silently be
    one run."""
    raw = read_toml(path)
    if "sweep" not in raw and not any(str(o).strip().startswith("sweep.") for o in overrides):
        raise OtaflInputError(f"{str(path)!r} has no [sweep] table, so there is no grid to sweep; add one with "
                              f"[sweep.axes] (docs/guides/sweeps.md), or train this one spec with otafl run")
    return expand_grid(raw, base_dir=Path(path).resolve().parent, overrides=overrides, max_points=max_points)
