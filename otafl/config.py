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

from otafl.errors import OtaflInputError
from otafl.validation import as_list, validate

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
    samples: int = 3000  # synthetic: samples drawn (train and test), so K up to (1 - test_fraction) samples


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
    csi: str = "perfect"  # perfect | estimated (docs/model.md#channel-state-information)
    pilot_snr_db: float | None = None  # estimated: pilot SNR, error variance 10^(-pilot_snr_db / 10)
    csi_error_var: float | None = None  # estimated: the estimate's error variance (instead of pilot_snr_db)


@dataclass(frozen=True)
class TransmitSpec:
    clip: float = 1.0  # L
    sigma2: float | list[float] = 0.1  # artificial noise variance; scalar, per group or per user
    alignment: str = "min"  # min | truncate
    threshold: float | None = None  # truncate: users with h below stay silent
    record_clip: float = 1.0  # C, per-example clipping of the local steps (fedavg, scaffold)
    step_noise: float = 1.0  # sigma, Gaussian noise per local step in units of C (fedavg, scaffold)
    update_scaling: str = "bound"  # fedavg, scaffold: bound (u L / B, the public norm bound) | clip (u clipped to L)
    power_control: str = "full"  # full | privacy-budget | cotaf | schedule (docs/model.md#power-control)
    power_schedule: list[float] = field(default_factory=list)  # schedule: s_t in (0, 1], one per round
    power_start: float = 1.0  # schedule without a list: geometric ramp of s_t from power_start ...
    power_end: float = 1.0  # ... to power_end (c_t = s_t times the alignment bound)


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
    algorithm: str = "fedsgd"  # fedsgd | fedavg | scaffold (docs/model.md#local-steps)
    local_steps: int = 1  # S, local DP-SGD steps per round (fedavg, scaffold; fedsgd takes one)
    local_lr: float = 0.1  # eta_l, the local steps' learning rate
    server_lr: float | None = None  # eta_g on the averaged update (default 1 for fedavg, scaffold)
    record_sampling: float = 0.5  # q, Poisson rate of a record per local step
    scaffold_warm_start: bool = False  # scaffold: c_k from one full noisy local gradient first


@dataclass(frozen=True)
class DigitalSpec:
    """Orthogonal access + secure aggregation, read when train.aggregation = "digital"
    (docs/model.md#digital)."""

    mechanism: str = "skellam"  # gaussian (continuous reference) | skellam | ddg | pbm
    bits: int = 16  # bits per coordinate: the field Z_{2^bits} of secure aggregation
    sigma2: float = 0.1  # per-user noise variance per coordinate, gradient units (gaussian, skellam, ddg)
    scale: float | str = "auto"  # integer levels per gradient unit (skellam, ddg); auto: fill the field
    rotation: bool = True  # random Walsh-Hadamard rotation before quantising (skellam, ddg, pbm)
    theta: float | str = "auto"  # pbm: p = 1/2 + theta x / c in (0, 1/2); auto: noise variance sigma2
    clip_prob: float = 1e-6  # probability that a rotated coordinate leaves [-c, c] (sets c)
    access: str = "tdma"  # tdma | ofdma
    min_rate: float = 0.1  # bits per channel use below which a user is in outage
    delta_total: float | str = "auto"  # delta of digital's composed epsilons; auto = privacy.delta_total


@dataclass(frozen=True)
class PrivacySpec:
    accountants: list[str] = field(default_factory=lambda: ["exact"])  # the tightest sound accountant
    delta_l: float = 1e-5  # per-round delta of the Gaussian step
    delta_prime: float | str = "auto"  # auto = 2 exp(-2 mu^2 / K) + 1e-5
    delta_total: float = 1e-5  # the one delta of every accountant's totals over the run (docs/privacy/index.md)
    target_epsilon: float | None = None  # power_control = privacy-budget: exact's central total at delta_total


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
NON_RUN_SECTIONS = ("sweep", "audit")  # read by other modules (otafl.sweep, load_audit_spec); ignored here


@dataclass(frozen=True)
class AuditSpec:
    """``[audit]``: the end-to-end audit of ``otafl audit-run`` (docs/privacy/auditing.md#auditing); not
    part of a run's :class:`Spec` (a run ignores it)."""

    co_users: str = "null"  # null | noise-cancelling (local steps with q = 1)
    canary: int = 0  # the canary coordinate c in [0, dim)
    trials: int = 20000  # runs (of train.rounds rounds) per neighbouring data set
    scope: str = "central"  # central: the released update | local: what the server receives from the target
    seed: int = 0  # seed of the trials' coins, noise and record sampling (the channel comes from train.seed)
    dim: int = 4  # d, the least-squares model's dimension
    records: int = 50  # D_k, records per user (local steps; fedsgd users hold one)
    curvature: float = 0.0  # kappa: the target's other records have the loss (kappa / 2) w_c^2 (0: null records)


def load_audit_spec(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Spec, AuditSpec]:
    """The run spec and the ``[audit]`` section of a spec file; ``--set audit.KEY=VALUE`` overrides
    the latter, the other ``--set`` values the run spec (:func:`load_spec`)."""
    from otafl.validation import validate_audit

    raw = read_toml(path) if path is not None else {}
    body = raw.get("audit", {})
    if not isinstance(body, dict):
        raise OtaflInputError(f"[audit] must be a table, found {body!r}")
    body = dict(body)
    rest = []
    for text in overrides:
        section, key, value = parse_override(text)
        if section == "audit":
            body[key] = value
        else:
            rest.append(text)
    names = {f.name for f in dataclasses.fields(AuditSpec)}
    for key in body:
        if key not in names:
            raise OtaflInputError(f"unknown key audit.{key}; allowed: {', '.join(sorted(names))}")
    audit = AuditSpec(**{k: _coerce("audit", k, v, AuditSpec) for k, v in body.items()})
    base = Path(path).resolve().parent if path is not None else None
    spec = spec_from_mapping(raw, base_dir=base, overrides=rest)
    validate_audit(spec, audit)
    return spec, audit


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
    except RecursionError:  # tomllib recurses once per level of [[...]] / {a = {...}}
        raise OtaflInputError(f"malformed TOML in {str(path)!r}: lists or tables nested too deeply") from None
    except UnicodeDecodeError:
        raise OtaflInputError(f"{str(path)!r} is not a UTF-8 TOML file") from None


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value); the value is read as a TOML literal
    (``0.5``, ``[2, 10]``, ``true``, ``"x"``), or kept as a bare string if it is not one
    (``[exact,tight]``, whose quotes the shell stripped, as a list of bare strings)."""
    if "=" not in text:
        raise OtaflInputError(f"--set {text!r} must look like section.key=value")
    dotted, raw = text.split("=", 1)
    if any(ch in raw for ch in "\n\r\x00"):
        raise OtaflInputError(f"--set {text!r}: the value holds a line break or NUL; give it on one line")
    if dotted.count(".") != 1:
        raise OtaflInputError(f"--set key {dotted!r} must look like section.key")
    section, key = (s.strip() for s in dotted.split("."))
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = _bare_list(raw.strip())
    except RecursionError:
        raise OtaflInputError(f"--set {dotted.strip()}: the value nests lists or tables too deeply "
                              f"({len(raw)} characters); give a number, a string or a flat list") from None
    return section, key, value


def _bare_list(raw: str) -> Any:
    """A bare string, or ``[exact,tight]`` (a list whose quotes the shell stripped) as a list:
    each item a TOML literal or else a bare string, as a scalar value is."""
    inner = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else None
    if inner is None or any(ch in inner for ch in "[]{}\"'"):
        return raw
    items = [item.strip() for item in inner.split(",")]
    if items[-1] == "":  # a trailing comma
        items.pop()
    if not items or any(item == "" for item in items):
        return raw
    out = []
    for item in items:
        try:
            out.append(tomllib.loads(f"v = {item}")["v"])
        except tomllib.TOMLDecodeError:
            out.append(item)
    return out


def resolve_preset(name: str, base_dir: Path | None) -> Path:
    """A channel preset: a bare ``NAME`` is ``channels/NAME.toml`` of the repository and
    nothing else; anything else must be a path ending in ``.toml`` (relative to the spec's
    folder, then the current folder). Errors name the preset as given, never its contents."""
    known = sorted(p.stem for p in CHANNELS_DIR.glob("*.toml")) if CHANNELS_DIR.is_dir() else []
    if "/" not in name and "\\" not in name and not name.endswith(".toml"):
        path = CHANNELS_DIR / f"{name}.toml"
        if path.is_file():
            return path
        raise OtaflInputError(f"channel.preset = {name!r} not found; known presets: {', '.join(known) or 'none'} "
                              "(or a path to a .toml file)")
    if not name.endswith(".toml"):
        raise OtaflInputError(f"channel.preset = {name!r} is a path without the .toml suffix; "
                              f"allowed: a preset name ({', '.join(known) or 'none'}) or a path to a .toml file")
    for root in ([base_dir] if base_dir else []) + [Path.cwd()]:
        if (root / name).is_file():
            return root / name
    raise OtaflInputError(f"channel.preset = {name!r} not found (a .toml file relative to the spec or the "
                          "current folder, or a preset name)")


PRESET_KEYS = {"users", "fading", "rician_k", "rho", "n0", "snr_db", "group_sizes", "large_scale_gain",
               "description"}


def load_preset(path: Path, name: str | None = None) -> dict[str, Any]:
    """Read a preset file; errors name it as ``name`` (as the user gave it)."""
    name = name or path.name
    try:
        raw = read_toml(path)
    except OtaflInputError:
        raise OtaflInputError(f"channel preset {name!r} is not a valid TOML file") from None
    unknown = sorted(set(raw) - PRESET_KEYS)
    if unknown:
        raise OtaflInputError(
            f"unknown key {unknown[0]!r} in channel preset {name!r}; allowed: {', '.join(sorted(PRESET_KEYS))}")
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
        preset = load_preset(resolve_preset(str(channel["preset"]), base_dir), str(channel["preset"]))
        users = preset.pop("users", None)
        preset.pop("description", None)
        tree["channel"] = {**preset, **channel}
        if users is not None:
            tree.setdefault("data", {}).setdefault("users", users)

    channel = tree["channel"]
    groups, snr = channel.get("group_sizes"), channel.get("snr_db")
    if isinstance(groups, list) and len(groups) > 1 and (not isinstance(snr, list) or len(snr) == 1) \
            and snr is not None:
        # one SNR for a preset (or spec) of several groups: every group at it (docs/guides/spec.md)
        channel["snr_db"] = [snr[0] if isinstance(snr, list) else snr] * len(groups)

    if tree.get("train", {}).get("aggregation") == "digital":
        # A digital run's default accountant is ``digital``: the over-the-air ones model hidden
        # participation and channel noise, which orthogonal access does not have.
        tree.setdefault("privacy", {}).setdefault("accountants", ["digital"])

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
    return with_steps_accountant(spec)


def with_steps_accountant(spec: Spec) -> Spec:
    """Local-steps algorithms are accounted by ``steps`` (docs/privacy/steps.md#steps): add it to
    ``privacy.accountants`` when the spec does not list it."""
    accountants = as_list(spec.privacy.accountants)
    if spec.train.algorithm == "fedsgd" or "steps" in accountants:
        return spec
    return dataclasses.replace(spec, privacy=dataclasses.replace(spec.privacy, accountants=[*accountants, "steps"]))


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
    ("data", "users"): int, ("data", "samples"): int, ("data", "shards_per_user"): int, ("data", "batch_size"): int,
    ("model", "hidden"): int, ("train", "rounds"): int, ("train", "eval_every"): int,
    ("train", "seed"): int, ("train", "local_steps"): int, ("digital", "bits"): int,
    ("audit", "canary"): int, ("audit", "trials"): int, ("audit", "seed"): int, ("audit", "dim"): int,
    ("audit", "records"): int,
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
        if "list" not in str(default.type):
            raise OtaflInputError(f"{where} = {value!r} must be a single value, not a list")
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
