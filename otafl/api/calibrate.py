"""Calibrate one spec value to a privacy target, without training (``otafl calibrate``).

In the spirit of Opacus' ``get_noise_multiplier``: given a spec, a target total epsilon
and one knob, find the knob's value that meets the target while leaking as much as the
target allows (the least noise, the most rounds, ...). Every evaluation is a bounds-only
run, ``run_experiment(spec, train=False)``: it draws the spec's fading and coins, so the
answer holds for the spec's ``train.seed``.

The total epsilon is the run's own ``{accountant}_epsilon_{scope}_total``
(:func:`otafl.privacy.accountants.account_run`), at the run's ``privacy.delta_total``
(default 1e-5; docs/privacy/composition.md#delta-total), the same delta whatever the knob;
``target_delta`` (``--delta-total``) sets another.

Leakage is not monotone in every knob (``tight``/``exact`` central eps in p jumps with the
participant quantile; channel noise and alignment interact with SNR and clip), so the
search brackets on a grid, refines every feasible/infeasible change by bisection
(:func:`solution_intervals`), and reports every interval where eps_total <= target. A
feasible island narrower than a grid step can be missed: more ``grid_points`` find more.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from otafl.config import Spec
from otafl.validation import validate
from otafl.errors import MAX_SCALE, OtaflInputError, check_range
from otafl.results import atomic_write_text, jsonable

__all__ = ["Knob", "KNOBS", "SCOPES", "CalibrationResult", "CalibrationInfeasible", "solution_intervals",
           "calibrate", "spec_toml", "write_spec"]

SCOPES = ("central", "local")


@dataclass(frozen=True)
class Knob:
    """A spec value ``calibrate`` can solve for.

    ``allowed`` is the knob's own range (``lo_open``/``hi_open`` exclusive ends, ``None``:
    unbounded); ``prefer`` the end of the feasible set that leaks most ("min" or "max"),
    explained by ``why``; ``log`` whether the grid and the tolerance are geometric.
    """

    name: str
    lo: float | None
    hi: float | None
    lo_open: bool
    hi_open: bool
    log: bool
    integer: bool
    prefer: str
    why: str
    default_range: Callable[[Spec], tuple[float, float]]

    @property
    def section(self) -> str:
        return self.name.split(".")[0]

    @property
    def key(self) -> str:
        return self.name.split(".")[1]

    def allowed_text(self) -> str:
        left = "(" if (self.lo_open or self.lo is None) else "["
        right = ")" if (self.hi_open or self.hi is None) else "]"
        lo = "-inf" if self.lo is None else f"{self.lo:g}"
        hi = "inf" if self.hi is None else f"{self.hi:g}"
        return f"{left}{lo}, {hi}{right}"

    def check(self, what: str, value: float) -> float:
        check_range(what, value, self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open)
        if self.integer and float(value) != int(value):
            raise OtaflInputError(f"{what} = {value!r} must be an integer")
        return value

    def apply(self, spec: Spec, value: float) -> Spec:
        """``spec`` with this knob set to ``value`` (validated)."""
        if self.integer:
            value = int(value)
        else:
            value = float(value)
            if self.name == "channel.snr_db" and spec.channel.group_sizes is not None:
                value = [value] * len(spec.channel.group_sizes)  # every SNR group at the same SNR
        section = dataclasses.replace(getattr(spec, self.section), **{self.key: value})
        out = dataclasses.replace(spec, **{self.section: section})
        validate(out)
        return out


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("transmit.sigma2", 1 / MAX_SCALE, MAX_SCALE, False, False, log=True, integer=False, prefer="min",
         why="more artificial noise is more private: the least noise that meets the target",
         default_range=lambda spec: (1e-4, 1e3)),
    Knob("sampling.p", 0.0, 1.0, True, False, log=False, integer=False, prefer="max",
         why="a larger p samples more often (weaker amplification): the largest p that meets the target",
         default_range=lambda spec: (0.01, 1.0)),
    Knob("train.rounds", 1, None, False, False, log=True, integer=True, prefer="max",
         why="every round leaks: the most rounds that meet the target",
         default_range=lambda spec: (1, max(10, 10 * spec.train.rounds))),
    Knob("channel.snr_db", -100.0, 100.0, False, False, log=False, integer=False, prefer="max",
         why="a higher SNR aligns at a larger gain c_t, so less channel noise N0/c_t^2 protects the "
             "users: the highest SNR that meets the target",
         default_range=lambda spec: (-20.0, 40.0)),
    Knob("transmit.clip", 1 / MAX_SCALE, MAX_SCALE, False, False, log=True, integer=False, prefer="max",
         why="a larger clip L raises the sensitivity 2L (partly offset by a smaller alignment gain): "
             "the largest clip that meets the target",
         default_range=lambda spec: (1e-3, 1e2)),
    Knob("digital.sigma2", 1 / MAX_SCALE, MAX_SCALE, False, False, log=True, integer=False, prefer="min",
         why="a digital run's noise (each user's share, secure aggregation adds them up): more is more "
             "private, the least noise that meets the target",
         default_range=lambda spec: (1e-4, 1e3)),
)}
"""The knobs ``calibrate`` solves for, by spec name. ``channel.snr_db`` puts every SNR
group at the one value; ``transmit.sigma2`` gives every user the one value (log grids are
in dB already for the SNR, so its grid and tolerance are linear in dB)."""


class CalibrationInfeasible(OtaflInputError):
    """No value in the searched range meets the target (the CLI exits 2 with this line)."""

    def __init__(self, message: str, *, best_epsilon: float, best_value: float | None):
        super().__init__(message)
        self.best_epsilon = best_epsilon
        self.best_value = best_value


@dataclass
class CalibrationResult:
    """What :func:`calibrate` found.

    ``value`` is the preferred solution (the leakiest end of the feasible set, see
    :attr:`Knob.prefer`); ``intervals`` every [lo, hi] with eps_total <= target found in
    ``value_range``, both ends evaluated and feasible; ``epsilon_round``/``delta_round``
    the worst round's per-round bound at ``value``; ``delta`` the total delta at which
    ``epsilon_total`` holds; ``spec`` the input spec with the knob set to ``value`` (and
    the accountant added to ``privacy.accountants`` if it was not listed);
    ``summary`` the bounds-only run's summary there; ``evaluations`` the bounds-only runs.
    """

    knob: str
    value: float
    intervals: list[tuple[float, float]]
    epsilon_total: float
    epsilon_round: float
    delta: float
    delta_round: float
    accountant: str
    scope: str
    target_epsilon: float
    target_delta: float | None
    value_range: tuple[float, float]
    evaluations: int
    prefer: str
    spec: Spec
    summary: dict = field(repr=False)

    @property
    def unit(self) -> str:
        """What the epsilons protect (:data:`otafl.privacy.units.UNITS`), as the run states it."""
        return str(self.summary.get(f"{self.accountant}_unit", "user"))

    def to_json(self) -> dict[str, Any]:
        """The ``--format json`` object (non-finite numbers as "inf"/"nan")."""
        return jsonable({
            "knob": self.knob, "value": self.value, "intervals": [list(iv) for iv in self.intervals],
            "epsilon_total": self.epsilon_total, "epsilon_round": self.epsilon_round, "delta": self.delta,
            "delta_round": self.delta_round, "unit": self.unit,
            "accountant": self.accountant, "scope": self.scope, "target_epsilon": self.target_epsilon,
            "evaluations": self.evaluations,
        })


# --------------------------------------------------------------------------- the search


def _close_enough(a: float, b: float, tol: float, *, log: bool, integer: bool) -> bool:
    if integer:
        return abs(b - a) <= 1
    if log:
        return max(a, b) <= min(a, b) * (1.0 + tol)
    return abs(b - a) <= tol


def _midpoint(a: float, b: float, *, log: bool, integer: bool) -> float:
    if integer:
        return float((int(a) + int(b)) // 2)
    return math.sqrt(a * b) if log else 0.5 * (a + b)


def solution_intervals(f: Callable[[float], float], grid: Sequence[float], target: float, tol: float, *,
                       log: bool = False, integer: bool = False) -> list[tuple[float, float]]:
    """Every interval of ``grid``'s span where ``f(x) <= target``, ends refined by bisection.

    ``grid`` is increasing. Consecutive grid points with f <= target form one interval;
    each end that lies between a feasible and an infeasible grid point is bisected until
    the two are within ``tol`` (relative when ``log``, absolute otherwise; adjacent
    integers when ``integer``), and the *feasible* one is kept, so f(lo) <= target and
    f(hi) <= target for every returned (lo, hi). NaN counts as infeasible. Feasible
    stretches narrower than a grid step are not seen. Each grid point and bisection
    midpoint is evaluated once; memoise ``f`` to re-read the ends cheaply afterwards.
    """
    xs = [float(x) for x in grid]
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise OtaflInputError(f"grid = {xs!r} must be increasing")
    ok = [bool(f(x) <= target) for x in xs]  # NaN <= target is False

    def edge(feasible: float, infeasible: float) -> float:
        while not _close_enough(feasible, infeasible, tol, log=log, integer=integer):
            mid = _midpoint(feasible, infeasible, log=log, integer=integer)
            if mid in (feasible, infeasible):  # float or integer resolution reached
                break
            if f(mid) <= target:
                feasible = mid
            else:
                infeasible = mid
        return feasible

    intervals = []
    i = 0
    while i < len(xs):
        if not ok[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(xs) and ok[j + 1]:
            j += 1
        lo = xs[i] if i == 0 else edge(xs[i], xs[i - 1])
        hi = xs[j] if j == len(xs) - 1 else edge(xs[j], xs[j + 1])
        intervals.append((lo, hi))
        i = j + 1
    return intervals


def make_grid(lo: float, hi: float, points: int, *, log: bool, integer: bool) -> list[float]:
    """``points`` values from lo to hi (both included): geometric when ``log``, else linear;
    rounded and de-duplicated when ``integer``."""
    import numpy as np

    grid = np.geomspace(lo, hi, points) if log else np.linspace(lo, hi, points)
    grid[0], grid[-1] = lo, hi
    if integer:
        return [float(v) for v in sorted({int(round(v)) for v in grid})]
    return [float(v) for v in grid]


def bounds_only_summary(spec: Spec, *, delta_target: float | None = None) -> dict:
    """The summary of ``run_experiment(spec, train=False)``; with ``delta_target``, its
    totals are composed at that total delta instead of the run's default."""
    from otafl.fl.loop import run_experiment

    return run_experiment(spec, train=False, delta_target=delta_target).summary


def _resolve_range(knob: Knob, spec: Spec, value_range: Sequence[float] | None) -> tuple[float, float]:
    if value_range is None:
        lo, hi = knob.default_range(spec)
    else:
        if len(value_range) != 2:
            raise OtaflInputError(f"range = {list(value_range)!r} must be two values LO,HI")
        lo, hi = (float(v) for v in value_range)
    knob.check(f"{knob.name} range low end", lo)
    knob.check(f"{knob.name} range high end", hi)
    if not hi > lo:
        raise OtaflInputError(f"range = [{lo:g}, {hi:g}] for {knob.name} must have LO < HI")
    return (int(lo), int(hi)) if knob.integer else (lo, hi)


def _check_inputs(spec: Spec, knob: str, target_epsilon: float, target_delta: float | None,
                  accountant: str | None, scope: str, grid_points: int, tol: float) -> tuple[Knob, str]:
    from otafl.api.defaults import check_accountants

    if knob not in KNOBS:
        raise OtaflInputError(f"knob = {knob!r} is outside the allowed range {{{', '.join(KNOBS)}}}")
    k = KNOBS[knob]
    if knob == "transmit.sigma2" and spec.train.aggregation == "digital":
        raise OtaflInputError("knob = 'transmit.sigma2' is outside the allowed range for train.aggregation = "
                              "'digital' (a digital run ignores it: its noise is digital.sigma2)")
    if knob == "digital.sigma2" and spec.train.aggregation != "digital":
        raise OtaflInputError(f"knob = 'digital.sigma2' needs train.aggregation = 'digital' (the spec has "
                              f"{spec.train.aggregation!r}, whose noise is transmit.sigma2)")
    check_range("target_epsilon", target_epsilon, 0.0, math.inf, lo_open=True, hi_open=True)
    if target_delta is not None:
        check_range("target_delta", target_delta, 0.0, 1.0, lo_open=True, hi_open=True)
    if accountant is None:
        if not spec.privacy.accountants:
            raise OtaflInputError("accountant = None: the spec lists no privacy.accountants; name one")
        accountant = spec.privacy.accountants[0]
    check_accountants([accountant])
    if scope not in SCOPES:
        raise OtaflInputError(f"scope = {scope!r} is outside the allowed range {{{', '.join(SCOPES)}}}")
    if isinstance(grid_points, bool) or int(grid_points) != grid_points:
        raise OtaflInputError(f"grid_points = {grid_points!r} must be an integer")
    check_range("grid_points", grid_points, 2, 1000)
    check_range("tol", tol, 0.0, 1.0, lo_open=True, hi_open=True)
    if knob == "sampling.p" and spec.sampling.scheme != "uniform":
        raise OtaflInputError(f"knob = 'sampling.p' needs sampling.scheme = 'uniform' (the spec has "
                              f"{spec.sampling.scheme!r}, which does not read sampling.p)")
    return k, accountant


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def calibrate(spec: Spec, *, knob: str, target_epsilon: float, target_delta: float | None = None,
              accountant: str | None = None, scope: str = "central", grid_points: int = 12,
              value_range: Sequence[float] | None = None, tol: float = 1e-3,
              progress=None) -> CalibrationResult:
    """Solve for ``knob`` so that the run's total epsilon is at most ``target_epsilon``.

    Parameters
    ----------
    spec : the run (its T = ``train.rounds``, seed, channel, ...).
    knob : a name in :data:`KNOBS`.
    target_epsilon : in (0, inf).
    target_delta : total delta in (0, 1) at which the totals are composed; default
        ``None``: the spec's ``privacy.delta_total``.
    accountant : a name in ``ACCOUNTANTS``; default the spec's first.
    scope : "central" or "local" (``epsilon_local_total``: the worst user's).
    grid_points : bracketing grid size (>= 2), geometric or linear per knob.
    value_range : (lo, hi) inside the knob's allowed range; default per knob.
    tol : bisection tolerance, relative for log knobs (sigma2, rounds, clip), absolute for
        linear ones (p; snr_db in dB); integers (rounds) are refined to adjacent values.
    progress : called as ``progress(done, total)`` after each bounds-only run (``total``
        grows past ``grid_points`` as the bisection goes on).

    Returns a :class:`CalibrationResult`; raises :class:`CalibrationInfeasible` when no
    value in the range meets the target and :class:`OtaflInputError` on bad input.
    """
    k, accountant = _check_inputs(spec, knob, target_epsilon, target_delta, accountant, scope, grid_points, tol)
    target_delta = spec.privacy.delta_total if target_delta is None else target_delta
    lo, hi = _resolve_range(k, spec, value_range)
    # after the checks: importing this module (for KNOBS) and a bad input need no torch
    from otafl.device import default_threads

    default_threads()  # the CLI's thread policy (otafl/device.py)
    base = dataclasses.replace(spec, privacy=dataclasses.replace(spec.privacy, accountants=[accountant]))
    eps_key = f"{accountant}_epsilon_{scope}_total"
    cache: dict[float, dict] = {}

    def summary_at(value: float) -> dict:
        if value not in cache:
            cache[value] = bounds_only_summary(k.apply(base, value), delta_target=target_delta)
            if progress is not None:  # the grid first, then each bisection step (total grows as it goes)
                progress(len(cache), max(int(grid_points), len(cache) + 1))
        return cache[value]

    def epsilon_at(value: float) -> float:
        return float(summary_at(value)[eps_key])

    grid = make_grid(lo, hi, int(grid_points), log=k.log, integer=k.integer)
    intervals = solution_intervals(epsilon_at, grid, target_epsilon, tol, log=k.log, integer=k.integer)
    if k.integer:
        intervals = [(int(a), int(b)) for a, b in intervals]
    if not intervals:
        finite = [(eps, v) for v, s in cache.items() for eps in [float(s[eps_key])] if not math.isnan(eps)]
        best_eps, best_v = min(finite) if finite else (math.nan, None)
        if math.isfinite(best_eps):
            best = f"the best found is {_fmt(best_eps)} at {knob} = {_fmt(best_v)}"
        else:
            best = f"the best found is {_fmt(best_eps)} (undefined everywhere searched"
            best += f"; do the per-round tails reach delta_total = {target_delta:g}?)"
        raise CalibrationInfeasible(
            f"no {knob} in [{_fmt(lo)}, {_fmt(hi)}] meets {accountant} {scope} epsilon_total <= "
            f"{_fmt(target_epsilon)}: {best} ({len(cache)} bounds-only runs); "
            f"widen the range or raise the target", best_epsilon=best_eps, best_value=best_v)
    value = intervals[0][0] if k.prefer == "min" else intervals[-1][1]
    s = summary_at(float(value))
    round_key = "epsilon_central" if scope == "central" else "epsilon_local_max"
    return CalibrationResult(
        knob=knob, value=value, intervals=intervals, epsilon_total=float(s[eps_key]),
        epsilon_round=float(s[f"{accountant}_{round_key}"]), delta=float(s[f"{accountant}_delta_{scope}_total"]),
        delta_round=float(s[f"{accountant}_delta_{scope}"]), accountant=accountant, scope=scope,
        target_epsilon=float(target_epsilon), target_delta=target_delta, value_range=(lo, hi),
        evaluations=len(cache), prefer=k.prefer, spec=k.apply(_listing(spec, accountant), value), summary=s)


def _listing(spec: Spec, accountant: str) -> Spec:
    """``spec`` with ``accountant`` added to ``privacy.accountants`` if it is missing, so that
    ``otafl run`` on the calibrated spec reports the accountant it was calibrated for."""
    if accountant in spec.privacy.accountants:
        return spec
    names = [*spec.privacy.accountants, accountant]
    return dataclasses.replace(spec, privacy=dataclasses.replace(spec.privacy, accountants=names))


# --------------------------------------------------------------------------- writing the spec


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def spec_toml(spec: Spec, header: Sequence[str] = ()) -> str:
    """``spec`` as a TOML file that :func:`otafl.config.load_spec` reads back to the same
    spec: every section and key written out, ``None`` values left out, and the channel
    preset (already merged into ``[channel]``) dropped. ``header`` lines become comments."""
    lines = [f"# {h}" for h in header]
    for section, keys in spec.to_dict().items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(v)}" for key, v in keys.items()
                  if v is not None and (section, key) != ("channel", "preset")]
    return "\n".join(lines).lstrip("\n") + "\n"


def write_spec(path: str | Path, spec: Spec, header: Sequence[str] = (), *, overwrite: bool = False) -> Path:
    """Write :func:`spec_toml` to ``path`` atomically (temporary file + rename); an existing
    file is an OtaflInputError unless ``overwrite``."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise OtaflInputError(f"--write {str(p)!r} exists; pass --overwrite to replace it")
    if p.is_dir():
        raise OtaflInputError(f"--write {str(p)!r} is a directory")
    atomic_write_text(p, spec_toml(spec, header))
    return p


def calibration_header(result: CalibrationResult, source: str) -> list[str]:
    """Comment lines for a calibrated spec: what was solved, the target, the accountant."""
    at = "the run's total delta" if result.target_delta is None else f"total delta {result.target_delta:g}"
    return [
        f"Calibrated by `otafl calibrate` from {source}:",
        f"{result.knob} = {result.value!r} so that the {result.accountant} {result.scope} epsilon over "
        f"{result.spec.train.rounds} rounds (seed {result.spec.train.seed}) is <= {result.target_epsilon:g} at {at}:",
        f"epsilon_total = {result.epsilon_total:.6g} at delta {result.delta:.3g}; "
        f"solutions in [{_fmt(result.value_range[0])}, {_fmt(result.value_range[1])}]: "
        + ", ".join(f"[{_fmt(a)}, {_fmt(b)}]" for a, b in result.intervals),
    ]
