"""Experiment specs: TOML -> frozen dataclasses, validated, with ``--set`` overrides.

A spec has the sections ``[data] [model] [channel] [transmit] [sampling] [estimator]
[train] [privacy] [digital]`` (and ``[sweep]``, read by :mod:`otafl.sweep`). Every key has a default,
so an empty file is a valid spec. Unknown sections or keys are errors (they are typos far
more often than intent). ``[channel] preset = "NAME"`` reads a channel preset TOML (a
path, or a name in the repository's ``channels/`` folder); keys written in ``[channel]``
override the preset's. A preset's ``users`` fills ``data.users`` when the spec leaves it
unset. ``data.dir`` given without ``data.name`` selects the full MNIST (IDX files there).

Every validation failure raises :class:`otafl.errors.OtaflInputError` with one line that
names the key, the value and the allowed range.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from otafl.errors import OtaflInputError, check_range

CHANNELS_DIR = Path(__file__).resolve().parent.parent / "channels"


@dataclass(frozen=True)
class DataSpec:
    """Dataset, number of users K and how the training set is split over them."""

    name: str = "mnist-embedded"  # mnist-embedded | digits | mnist | synthetic
    dir: str | None = None  # IDX directory for `mnist`
    users: int = 200  # K
    split: str = "iid"  # iid | shards | dirichlet
    alpha: float = 0.5  # Dirichlet concentration (split = dirichlet)
    shards_per_user: int = 2  # split = shards
    batch_size: int = 32  # b_k, per user per round
    test_fraction: float = 0.2  # embedded sets: share held out for testing


@dataclass(frozen=True)
class ModelSpec:
    name: str = "single-layer"  # single-layer | two-layer
    hidden: int = 100


@dataclass(frozen=True)
class ChannelSpec:
    """AR(1) Rician block fading and the Gaussian MAC (docs/model.md#fading, #mac)."""

    preset: str | None = None
    fading: str = "ar-rician"  # ar-rician | rayleigh | static
    rician_k: float = 5.0  # G
    rho: float = 0.1  # AR(1) correlation
    n0: float = 1.0  # receiver noise variance N0
    snr_db: float | list[float] = 10.0  # one SNR, or one per group
    group_sizes: list[int] | None = None  # users per SNR group
    large_scale_gain: float | list[float] = 1.0  # amplitude; scalar, per group or per user


@dataclass(frozen=True)
class TransmitSpec:
    clip: float = 1.0  # L
    sigma2: float | list[float] = 0.1  # artificial noise variance; scalar, per group or per user
    alignment: str = "min"  # min | truncate
    threshold: float | None = None  # truncate: users with h below stay silent


@dataclass(frozen=True)
class SamplingSpec:
    scheme: str = "uniform"  # uniform | time-varying | channel-aware
    p: float = 0.5  # uniform
    h_th: float = 2.0  # channel-aware
    schedule: str = "linear"  # time-varying: constant | linear | exponential | cosine | list
    p_start: float = 0.9
    p_end: float = 0.3
    values: list[float] = field(default_factory=list)  # schedule = list


@dataclass(frozen=True)
class EstimatorSpec:
    kind: str = "known"  # known | unknown


@dataclass(frozen=True)
class TrainSpec:
    rounds: int = 100
    aggregation: str = "ota"  # ota | ideal (noiseless: every sampled gradient received exactly)
    superposition: str = "aggregate"  # aggregate: one N(0, sigma_z^2 I) draw (equal in law) | per-user: every x_k
    optimizer: str = "adam"  # adam | sgd
    lr: float = 1e-3
    weight_decay: float = 0.0  # Omega: loss + Omega/2 ||w||^2
    eval_every: int = 10
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda


@dataclass(frozen=True)
class DigitalSpec:
    """Orthogonal access + secure aggregation, read when train.aggregation = "digital"
    (docs/model.md#digital)."""

    mechanism: str = "skellam"  # gaussian (continuous reference) | skellam | pbm
    bits: int = 16  # bits per coordinate: the field Z_{2^bits} of secure aggregation
    sigma2: float = 0.1  # per-user noise variance per coordinate, gradient units (gaussian, skellam)
    scale: float | str = "auto"  # integer levels per gradient unit (skellam); auto: fill the field
    rotation: bool = True  # random Walsh-Hadamard rotation before quantising (skellam, pbm)
    theta: float | str = "auto"  # pbm: p = 1/2 + theta x / c in (0, 1/2); auto: noise variance sigma2
    clip_prob: float = 1e-6  # probability that a rotated coordinate leaves [-c, c] (sets c)
    access: str = "tdma"  # tdma | ofdma
    min_rate: float = 0.1  # bits per channel use below which a user is in outage
    delta_total: float | str = "auto"  # delta of the composed epsilons; auto = sum_t p_t delta_l + delta_l


@dataclass(frozen=True)
class PrivacySpec:
    accountants: list[str] = field(default_factory=lambda: ["paper", "tight"])
    delta_l: float = 1e-5
    delta_prime: float | str = "auto"  # auto = 2 exp(-2 mu^2 / K) + 1e-5


@dataclass(frozen=True)
class Spec:
    data: DataSpec = field(default_factory=DataSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    channel: ChannelSpec = field(default_factory=ChannelSpec)
    transmit: TransmitSpec = field(default_factory=TransmitSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    estimator: EstimatorSpec = field(default_factory=EstimatorSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    privacy: PrivacySpec = field(default_factory=PrivacySpec)
    digital: DigitalSpec = field(default_factory=DigitalSpec)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def canonical_json(self) -> str:
        """Sorted, compact JSON of the whole spec: a stable key for a run's parameters."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


SECTIONS: dict[str, type] = {f.name: f.default_factory().__class__ for f in dataclasses.fields(Spec)}
NON_RUN_SECTIONS = ("sweep",)  # read by other modules; ignored here


# --------------------------------------------------------------------------- loading


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or a syntax error becomes one clear line."""
    p = Path(path)
    if not p.is_file():
        raise OtaflInputError(f"spec file {str(path)!r} does not exist")
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise OtaflInputError(f"malformed TOML in {str(path)!r}: {e}") from None
    except UnicodeDecodeError:
        raise OtaflInputError(f"{str(path)!r} is not a UTF-8 TOML file") from None


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value); the value is read as a TOML literal
    (``0.5``, ``[2, 10]``, ``true``, ``"x"``), or kept as a bare string if it is not one."""
    if "=" not in text:
        raise OtaflInputError(f"--set {text!r} must look like section.key=value")
    dotted, raw = text.split("=", 1)
    if dotted.count(".") != 1:
        raise OtaflInputError(f"--set key {dotted!r} must look like section.key")
    section, key = (s.strip() for s in dotted.split("."))
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def resolve_preset(name: str, base_dir: Path | None) -> Path:
    """A channel preset: an existing path (relative to the spec's folder or the current
    folder), or ``NAME`` / ``NAME.toml`` in the repository's ``channels/`` folder."""
    candidates = []
    for root in ([base_dir] if base_dir else []) + [Path.cwd(), CHANNELS_DIR]:
        candidates += [root / name, root / f"{name}.toml"]
    for c in candidates:
        if c.is_file():
            return c
    known = sorted(p.stem for p in CHANNELS_DIR.glob("*.toml")) if CHANNELS_DIR.is_dir() else []
    raise OtaflInputError(f"channel.preset = {name!r} not found; known presets: {', '.join(known) or 'none'}")


PRESET_KEYS = {"users", "fading", "rician_k", "rho", "n0", "snr_db", "group_sizes", "large_scale_gain",
               "description"}


def load_preset(path: Path) -> dict[str, Any]:
    raw = read_toml(path)
    unknown = sorted(set(raw) - PRESET_KEYS)
    if unknown:
        raise OtaflInputError(
            f"unknown key {unknown[0]!r} in channel preset {str(path)!r}; allowed: {', '.join(sorted(PRESET_KEYS))}")
    return raw


def spec_from_mapping(raw: Mapping[str, Any], *, base_dir: Path | None = None,
                      overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Build and validate a :class:`Spec` from a parsed TOML mapping plus ``--set`` strings."""
    tree: dict[str, dict[str, Any]] = {}
    for section, body in raw.items():
        if section in NON_RUN_SECTIONS:
            continue
        if section not in SECTIONS:
            raise OtaflInputError(f"unknown section [{section}]; allowed: {', '.join(SECTIONS)}")
        if not isinstance(body, dict):
            raise OtaflInputError(f"[{section}] must be a table, found {body!r}")
        tree[section] = dict(body)
    for text in overrides:
        section, key, value = parse_override(text)
        if section not in SECTIONS:
            raise OtaflInputError(f"--set section {section!r} unknown; allowed: {', '.join(SECTIONS)}")
        tree.setdefault(section, {})[key] = value

    data = tree.get("data", {})
    if data.get("dir") and "name" not in data:
        data["name"] = "mnist"  # a data folder without a dataset name means the full MNIST

    channel = tree.setdefault("channel", {})
    if channel.get("preset"):
        preset = load_preset(resolve_preset(str(channel["preset"]), base_dir))
        users = preset.pop("users", None)
        preset.pop("description", None)
        tree["channel"] = {**preset, **channel}
        if users is not None:
            tree.setdefault("data", {}).setdefault("users", users)

    built = {}
    for section, cls in SECTIONS.items():
        body = tree.get(section, {})
        names = {f.name for f in dataclasses.fields(cls)}
        for key in body:
            if key not in names:
                raise OtaflInputError(f"unknown key {section}.{key}; allowed: {', '.join(sorted(names))}")
        built[section] = cls(**{k: _coerce(section, k, v, cls) for k, v in body.items()})
    spec = Spec(**built)
    validate(spec)
    return spec


def load_spec(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Read a spec file (``None``: all defaults) and apply ``--set`` overrides."""
    raw = read_toml(path) if path is not None else {}
    base = Path(path).resolve().parent if path is not None else None
    return spec_from_mapping(raw, base_dir=base, overrides=overrides)


def spec_from_dict(d: Mapping[str, Any]) -> Spec:
    """The inverse of :meth:`Spec.to_dict` (e.g. a stored run's ``params``): presets are
    already applied there, so ``channel.preset`` is ignored, and ``None`` means the default."""
    body = {section: {k: v for k, v in keys.items() if v is not None and (section, k) != ("channel", "preset")}
            for section, keys in d.items()}
    return spec_from_mapping(body)


# --------------------------------------------------------------------------- validation

_TYPES = {
    ("data", "users"): int, ("data", "shards_per_user"): int, ("data", "batch_size"): int,
    ("model", "hidden"): int, ("train", "rounds"): int, ("train", "eval_every"): int,
    ("train", "seed"): int, ("digital", "bits"): int,
}
_AUTO_NUMBERS = ("delta_prime", "scale", "delta_total", "theta")  # keys that take a number or "auto"


def _coerce(section: str, key: str, value: Any, cls: type) -> Any:
    """Check the TOML type against the field's default and convert ints to floats."""
    default = {f.name: f for f in dataclasses.fields(cls)}[key]
    want = _TYPES.get((section, key))
    where = f"{section}.{key}"
    if want is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise OtaflInputError(f"{where} = {value!r} must be an integer")
        return value
    proto = default.default if default.default is not dataclasses.MISSING else default.default_factory()
    if isinstance(proto, bool):
        if not isinstance(value, bool):
            raise OtaflInputError(f"{where} = {value!r} must be true or false")
        return value
    if isinstance(value, list):
        if not all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value):
            raise OtaflInputError(f"{where} = {value!r} must be a list of numbers or names")
        if key == "group_sizes":
            if not all(isinstance(v, int) for v in value):
                raise OtaflInputError(f"{where} = {value!r} must be a list of integers")
            return value
        return [float(v) if isinstance(v, (int, float)) else v for v in value]
    if isinstance(proto, float) or (proto is None and isinstance(value, (int, float))):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(proto, float) and key in _AUTO_NUMBERS and value == "auto":
                return value
            raise OtaflInputError(f"{where} = {value!r} must be a number")
        return float(value)
    if isinstance(proto, str) or proto is None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key in _AUTO_NUMBERS:
            return float(value)
        if not isinstance(value, str):
            raise OtaflInputError(f"{where} = {value!r} must be a string")
        return value
    return value


def _names(where: str, value: str, allowed) -> None:
    if value not in allowed:
        raise OtaflInputError(f"{where} = {value!r} is not one of: {', '.join(sorted(allowed))}")


def as_list(x) -> list:
    """A spec value that is a scalar or a list, as a list."""
    return list(x) if isinstance(x, (list, tuple)) else [x]


def registries() -> dict[str, Any]:
    """Every name a spec accepts, read from the registry that implements it: a name is
    valid exactly when some module can build it. Imported here, not at module level, so that
    reading a spec stays cheap and the registries' modules may import this one."""
    from otafl.channel.fading import FADING_MODELS
    from otafl.channel.orthogonal import ACCESS_SCHEMES
    from otafl.data import DATASETS, SPLITS
    from otafl.device import DEVICES
    from otafl.estimate import ESTIMATORS
    from otafl.fl.digital import MECHANISMS
    from otafl.fl.optim import OPTIMIZERS
    from otafl.fl.round import AGGREGATORS, SUPERPOSITIONS
    from otafl.models import MODELS
    from otafl.privacy.accountants import ACCOUNTANTS
    from otafl.sampling import SAMPLING_SCHEMES, SCHEDULES
    from otafl.transmit import ALIGNMENT_POLICIES

    return {
        "data.name": DATASETS, "data.split": SPLITS, "model.name": MODELS, "channel.fading": FADING_MODELS,
        "transmit.alignment": ALIGNMENT_POLICIES, "sampling.scheme": SAMPLING_SCHEMES,
        "sampling.schedule": SCHEDULES, "estimator.kind": ESTIMATORS, "train.aggregation": AGGREGATORS,
        "train.superposition": SUPERPOSITIONS, "train.optimizer": OPTIMIZERS, "train.device": DEVICES,
        "privacy.accountants": ACCOUNTANTS, "digital.mechanism": MECHANISMS, "digital.access": ACCESS_SCHEMES,
    }


def validate(spec: Spec) -> None:
    """Range and name checks that need no data; raises OtaflInputError on the first problem."""
    names = registries()
    d, m, c, tx, s, e, tr, pv = (spec.data, spec.model, spec.channel, spec.transmit, spec.sampling,
                                 spec.estimator, spec.train, spec.privacy)
    _names("data.name", d.name, names["data.name"])
    check_range("data.users", d.users, 1, None)
    _names("data.split", d.split, names["data.split"])
    check_range("data.alpha", d.alpha, 0, None, lo_open=True)
    check_range("data.shards_per_user", d.shards_per_user, 1, None)
    check_range("data.batch_size", d.batch_size, 1, None)
    check_range("data.test_fraction", d.test_fraction, 0, 1, lo_open=True, hi_open=True)
    _names("model.name", m.name, names["model.name"])
    check_range("model.hidden", m.hidden, 1, None)
    _names("channel.fading", c.fading, names["channel.fading"])
    check_range("channel.rician_k", c.rician_k, 0, None)
    check_range("channel.rho", c.rho, 0, 1)
    check_range("channel.n0", c.n0, 0, None)
    for v in as_list(c.snr_db):
        check_range("channel.snr_db", v, -100, 100)
    for v in as_list(c.large_scale_gain):
        check_range("channel.large_scale_gain", v, 0, None, lo_open=True)
    if c.group_sizes is not None:
        for v in c.group_sizes:
            check_range("channel.group_sizes", v, 1, None)
        if len(c.group_sizes) != len(as_list(c.snr_db)):
            raise OtaflInputError(
                f"channel.group_sizes has {len(c.group_sizes)} entries but channel.snr_db has "
                f"{len(as_list(c.snr_db))}; they must match")
    check_range("transmit.clip", tx.clip, 0, None, lo_open=True)
    for v in as_list(tx.sigma2):
        check_range("transmit.sigma2", v, 0, None)
    _names("transmit.alignment", tx.alignment, names["transmit.alignment"])
    if tx.alignment == "truncate":
        if tx.threshold is None:
            raise OtaflInputError("transmit.threshold must be set (a gain >= 0) when transmit.alignment = 'truncate'")
        check_range("transmit.threshold", tx.threshold, 0, None)
    _names("sampling.scheme", s.scheme, names["sampling.scheme"])
    check_range("sampling.p", s.p, 0, 1, lo_open=True)
    check_range("sampling.h_th", s.h_th, 0, None, lo_open=True)
    _names("sampling.schedule", s.schedule, names["sampling.schedule"])
    check_range("sampling.p_start", s.p_start, 0, 1, lo_open=True)
    check_range("sampling.p_end", s.p_end, 0, 1, lo_open=True)
    for v in s.values:
        check_range("sampling.values", v, 0, 1, lo_open=True)
    if s.scheme == "time-varying" and s.schedule == "list" and not s.values:
        raise OtaflInputError("sampling.values must list at least one p in (0, 1] when schedule = 'list'")
    _names("estimator.kind", e.kind, names["estimator.kind"])
    check_range("train.rounds", tr.rounds, 1, None)
    _names("train.aggregation", tr.aggregation, names["train.aggregation"])
    _names("train.superposition", tr.superposition, names["train.superposition"])
    _names("train.optimizer", tr.optimizer, names["train.optimizer"])
    check_range("train.lr", tr.lr, 0, None, lo_open=True)
    check_range("train.weight_decay", tr.weight_decay, 0, None)
    check_range("train.eval_every", tr.eval_every, 1, None)
    check_range("train.seed", tr.seed, 0, 2**32 - 1)
    _names("train.device", tr.device, names["train.device"])
    check_range("privacy.delta_l", pv.delta_l, 0, 1, lo_open=True, hi_open=True)
    if isinstance(pv.delta_prime, str):
        if pv.delta_prime != "auto":
            raise OtaflInputError(f"privacy.delta_prime = {pv.delta_prime!r} must be 'auto' or a number in (0, 1)")
    else:
        check_range("privacy.delta_prime", pv.delta_prime, 0, 1, lo_open=True, hi_open=True)
    for a in as_list(pv.accountants):  # [] is allowed: a run without privacy accounting
        if not isinstance(a, str):
            raise OtaflInputError(f"privacy.accountants entry {a!r} must be a name")
        _names("privacy.accountants", a, names["privacy.accountants"])
    validate_digital(spec, names)


def _auto_or(where: str, value, lo: float, hi: float | None, **kw) -> None:
    if isinstance(value, str):
        if value != "auto":
            raise OtaflInputError(f"{where} = {value!r} must be 'auto' or a number")
    else:
        check_range(where, value, lo, hi, **kw)


def validate_digital(spec: Spec, names: Mapping[str, Any]) -> None:
    """The [digital] section (checked whatever the aggregation, so a sweep fails early)."""
    dg, K = spec.digital, spec.data.users
    _names("digital.mechanism", dg.mechanism, names["digital.mechanism"])
    _names("digital.access", dg.access, names["digital.access"])
    check_range("digital.bits", dg.bits, 2, 48)
    if dg.mechanism == "pbm" and (1 << dg.bits) - 1 < K:
        raise OtaflInputError(f"digital.bits = {dg.bits} is outside the allowed range for pbm with {K} users "
                              f"[{K.bit_length()}, 48] (each sum of K counts must fit in 2^bits)")
    check_range("digital.sigma2", dg.sigma2, 0, None)
    _auto_or("digital.scale", dg.scale, 0, None, lo_open=True)
    _auto_or("digital.theta", dg.theta, 0, 0.5, lo_open=True, hi_open=True)
    check_range("digital.clip_prob", dg.clip_prob, 0, 1, lo_open=True, hi_open=True)
    check_range("digital.min_rate", dg.min_rate, 0, None)
    _auto_or("digital.delta_total", dg.delta_total, 0, 1, lo_open=True, hi_open=True)
