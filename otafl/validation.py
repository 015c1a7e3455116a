"""Spec validation: range and name checks that need no data, run before anything loads.

Every accepted name is read from the registry that implements it (:func:`registries`);
sizes are checked against the memory limit before allocation (:func:`check_run_size`).
Each failure raises :class:`otafl.errors.OtaflInputError` with one line naming the key,
the value and the allowed range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import functools

from otafl.errors import OtaflInputError, check_scale, check_snr_db
from otafl.errors import check_range as _check_range

#: Every numeric spec key must be finite: an infinite rate, clip, noise or count makes no sense
#: (an inf learning rate diverges, an inf noise or clip breaks the accounting).
check_range = functools.partial(_check_range, finite=True)

if TYPE_CHECKING:
    from otafl.config import Spec


def _names(where: str, value: str, allowed) -> None:
    if value not in allowed:
        raise OtaflInputError(f"{where} = {value!r} is not one of: {', '.join(sorted(allowed))}")


def as_list(x) -> list:
    """A spec value that is a scalar or a list, as a list."""
    return list(x) if isinstance(x, (list, tuple)) else [x]


def registries() -> dict[str, Any]:
    """Every name a spec accepts, read from the registry that implements it: a name is
    valid exactly when some module can build it. The registries are torch-free (:mod:`otafl.names`,
    :mod:`otafl.fl.strategies`, the accountants' registry), so a bad spec value is refused before
    torch loads; imported here, not at module level, so that the registries' modules may import
    this one."""
    from otafl.fl.strategies import AGGREGATIONS, ALGORITHMS, MECHANISMS, POWER_CONTROLS, SUPERPOSITIONS, UPDATE_SCALINGS
    from otafl.names import (ACCESS_SCHEMES, ALIGNMENT_POLICIES, CSI_MODELS, DATASETS, DEVICES, ESTIMATORS,
                             FADING_MODELS, MODELS, OPTIMIZERS, SAMPLING_SCHEMES, SCHEDULES, SPLITS)
    from otafl.privacy.accountants.registry import ACCOUNTANTS

    return {
        "data.name": DATASETS, "data.split": SPLITS, "model.name": MODELS, "channel.fading": FADING_MODELS,
        "transmit.alignment": ALIGNMENT_POLICIES, "sampling.scheme": SAMPLING_SCHEMES,
        "sampling.schedule": SCHEDULES, "estimator.kind": ESTIMATORS, "train.aggregation": AGGREGATIONS,
        "train.superposition": SUPERPOSITIONS, "train.optimizer": OPTIMIZERS, "train.device": DEVICES,
        "privacy.accountants": ACCOUNTANTS, "train.algorithm": ALGORITHMS, "digital.mechanism": MECHANISMS,
        "digital.access": ACCESS_SCHEMES, "transmit.update_scaling": UPDATE_SCALINGS, "channel.csi": CSI_MODELS,
        "transmit.power_control": POWER_CONTROLS,
    }


def _validate_local_steps(spec: Spec, algorithms, scalings=None) -> None:
    """The local-steps keys (docs/model.md#local-steps); fedsgd takes one step and ignores the rest."""
    tr, tx = spec.train, spec.transmit
    _names("train.algorithm", tr.algorithm, algorithms)
    if scalings is not None:
        _names("transmit.update_scaling", tx.update_scaling, scalings)
    from otafl.privacy.knobs import check_step_knobs

    check_step_knobs(tr.local_steps, tx.step_noise, prefix="spec")
    check_range("train.local_lr", tr.local_lr, 0, None, lo_open=True)
    if tr.server_lr is not None:
        check_range("train.server_lr", tr.server_lr, 0, None, lo_open=True)
    check_range("train.record_sampling", tr.record_sampling, 0, 1, lo_open=True)
    check_range("transmit.record_clip", tx.record_clip, 0, None, lo_open=True)
    if tr.algorithm == "fedsgd":
        if tr.local_steps != 1:
            raise OtaflInputError(f"train.local_steps = {tr.local_steps} needs train.algorithm = 'fedavg' or "
                                  "'scaffold' (fedsgd takes one step per round)")
        if tr.server_lr is not None:
            raise OtaflInputError("train.server_lr is for fedavg and scaffold; fedsgd steps with train.optimizer "
                                  "at train.lr")
        if tx.update_scaling != "bound":
            raise OtaflInputError(f"transmit.update_scaling = {tx.update_scaling!r} is for fedavg and scaffold "
                                  "(fedsgd always clips its gradient to transmit.clip)")
    elif tr.weight_decay:
        raise OtaflInputError(f"train.weight_decay = {tr.weight_decay!r} is outside the allowed range [0, 0] "
                              f"for train.algorithm = {tr.algorithm!r} (no weight decay in the local steps)")
    if tr.scaffold_warm_start and tr.algorithm != "scaffold":
        raise OtaflInputError(f"train.scaffold_warm_start = true needs train.algorithm = 'scaffold' "
                              f"(found {tr.algorithm!r})")


def _validate_power_control(spec: Spec, policies) -> None:
    """``transmit.power_control`` and its keys (docs/model.md#power-control); the policy's own needs
    come from its registry entry."""
    tx, pv = spec.transmit, spec.privacy
    _names("transmit.power_control", tx.power_control, policies)
    for key in ("power_start", "power_end"):
        check_range(f"transmit.{key}", getattr(tx, key), 0, 1, lo_open=True)
    for v in tx.power_schedule:
        check_range("transmit.power_schedule", v, 0, 1, lo_open=True)
    if tx.power_schedule and len(tx.power_schedule) != spec.train.rounds:
        raise OtaflInputError(f"transmit.power_schedule has {len(tx.power_schedule)} values; the allowed length is "
                              f"train.rounds = {spec.train.rounds} (one per round)")
    if pv.target_epsilon is not None:
        if isinstance(pv.target_epsilon, str):
            raise OtaflInputError(f"privacy.target_epsilon = {pv.target_epsilon!r} is outside the allowed range "
                                  "(0, inf)")
        check_range("privacy.target_epsilon", pv.target_epsilon, 0, None, lo_open=True)
    for key in policies[tx.power_control].needs:
        section, name = key.split(".")
        if getattr(getattr(spec, section), name) is None:
            raise OtaflInputError(f"{key} must be set when transmit.power_control = {tx.power_control!r}")


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
    if d.name == "synthetic":  # two samples per class of its 10 (the size is checked in check_run_size)
        check_range("data.samples", d.samples, 2 * SYNTHETIC_CLASSES, None)
    _names("model.name", m.name, names["model.name"])
    check_range("model.hidden", m.hidden, 1, None)
    _names("channel.fading", c.fading, names["channel.fading"])
    check_range("channel.rician_k", c.rician_k, 0, None)
    check_range("channel.rho", c.rho, 0, 1)
    check_scale("channel.n0", c.n0, zero=True)
    for v in as_list(c.snr_db):
        check_snr_db("channel.snr_db", v)
    for v in as_list(c.large_scale_gain):
        check_scale("channel.large_scale_gain", v)
    if c.group_sizes is not None:
        for v in c.group_sizes:
            check_range("channel.group_sizes", v, 1, None)
        if len(c.group_sizes) != len(as_list(c.snr_db)):
            raise OtaflInputError(
                f"channel.group_sizes has {len(c.group_sizes)} entries but channel.snr_db has "
                f"{len(as_list(c.snr_db))}; they must match")
    check_scale("transmit.clip", tx.clip)
    for v in as_list(tx.sigma2):
        check_scale("transmit.sigma2", v, zero=True)
    groups = len(as_list(c.snr_db))
    for key, value in (("channel.large_scale_gain", c.large_scale_gain), ("transmit.sigma2", tx.sigma2)):
        n = len(as_list(value))
        if n not in (1, groups, d.users):
            raise OtaflInputError(f"{key} has {n} values; allowed lengths are 1 (all users), {groups} (one per "
                                  f"SNR group) or {d.users} (one per user)")
    _names("transmit.alignment", tx.alignment, names["transmit.alignment"])
    if tx.alignment == "truncate" and tx.threshold is None:
        raise OtaflInputError("transmit.threshold must be set (a gain >= 0) when transmit.alignment = 'truncate'")
    if tx.threshold is not None:  # checked even where unused: nan and inf are never a threshold
        check_range("transmit.threshold", tx.threshold, 0, None, finite=True)
    _validate_power_control(spec, names["transmit.power_control"])
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
    if tr.optimizer == "sgd" and tr.lr > FLOAT32_MAX:
        raise OtaflInputError(f"train.lr = {tr.lr!r} is outside the allowed range (0, {FLOAT32_MAX:.6g}] for "
                              "train.optimizer = 'sgd' (its step w - lr g is taken in float32)")
    # Omega multiplies the float32 weights in the loss: beyond float32 the penalty is inf at once.
    check_range("train.weight_decay", tr.weight_decay, 0, FLOAT32_MAX)
    check_range("train.eval_every", tr.eval_every, 1, None)
    check_range("train.seed", tr.seed, 0, 2**32 - 1)
    _names("train.device", tr.device, names["train.device"])
    _validate_local_steps(spec, names["train.algorithm"], names["transmit.update_scaling"])
    check_range("privacy.delta_l", pv.delta_l, 0, 1, lo_open=True, hi_open=True)
    if isinstance(pv.delta_prime, str):
        if pv.delta_prime != "auto":
            raise OtaflInputError(f"privacy.delta_prime = {pv.delta_prime!r} must be 'auto' or a number in (0, 1)")
    else:
        check_range("privacy.delta_prime", pv.delta_prime, 0, 1, lo_open=True, hi_open=True)
    if not isinstance(pv.accountants, (list, tuple)):
        raise OtaflInputError(f"privacy.accountants = {pv.accountants!r} must be a list of names, e.g. "
                              f"{[a.strip() for a in pv.accountants.strip('[]').split(',') if a.strip()]!r}"
                              if isinstance(pv.accountants, str) else
                              f"privacy.accountants = {pv.accountants!r} must be a list of names, e.g. ['paper']")
    if isinstance(pv.delta_total, str):
        raise OtaflInputError(f"privacy.delta_total = {pv.delta_total!r} is outside the allowed range (0, 1)")
    check_range("privacy.delta_total", pv.delta_total, 0, 1, lo_open=True, hi_open=True)
    for a in as_list(pv.accountants):  # [] is allowed: a run without privacy accounting
        if not isinstance(a, str):
            raise OtaflInputError(f"privacy.accountants entry {a!r} must be a name")
        _names("privacy.accountants", a, names["privacy.accountants"])

    validate_digital(spec, names)
    _validate_csi(spec, names["channel.csi"])
    _validate_aggregation_accountants(spec)
    check_run_size(spec)


#: Largest finite float32: torch's SGD step takes its learning rate as a float32 scalar.
FLOAT32_MAX = 3.4028234663852886e38
#: Classes of the ``synthetic`` data set (otafl.data.load_dataset's default).
SYNTHETIC_CLASSES = 10

#: Smallest pbm theta (p = 1/2 + theta x / c): its noise variance grows as 1 / theta^2.
MIN_PBM_THETA = 1e-30

OVER_THE_AIR_ACCOUNTANTS = ("paper", "tight", "exact")
"""Accountants of the over-the-air round: hidden participation (amplification by sampling) and
channel noise N0 / c_t^2, neither of which a digital (orthogonal-access) round has."""


def _validate_aggregation_accountants(spec: Spec) -> None:
    """Each accountant only where its model applies: a digital run is accounted by ``digital``."""
    if spec.train.aggregation != "digital":
        return
    listed = as_list(spec.privacy.accountants)
    ota = [a for a in listed if a in OVER_THE_AIR_ACCOUNTANTS]
    if ota:
        verb = "models" if len(ota) == 1 else "model"
        raise OtaflInputError(
            f"privacy.accountants = {listed!r} is outside the allowed range for train.aggregation = 'digital': "
            f"{', '.join(ota)} {verb} over-the-air aggregation (hidden participation, channel noise), but "
            "orthogonal access shows the server who transmits; use ['digital'] (the default of a digital run)")


def _validate_csi(spec: Spec, models) -> None:
    """``channel.csi`` and its error level: exactly one of ``pilot_snr_db`` or ``csi_error_var``
    with ``estimated``, neither with ``perfect``; estimated CSI only over the air with FedSGD,
    accounted by ``exact``, ``tight`` or ``paper``."""
    c = spec.channel
    _names("channel.csi", c.csi, models)
    if c.csi_error_var is not None:
        check_range("channel.csi_error_var", c.csi_error_var, 0, None)
    if c.pilot_snr_db is not None:
        check_snr_db("channel.pilot_snr_db", c.pilot_snr_db)
    if c.csi == "perfect":
        for key in ("pilot_snr_db", "csi_error_var"):
            if getattr(c, key) is not None:
                raise OtaflInputError(f"channel.{key} needs channel.csi = 'estimated' (found 'perfect')")
        return
    if (c.pilot_snr_db is None) == (c.csi_error_var is None):
        raise OtaflInputError("channel.csi = 'estimated' needs exactly one of channel.pilot_snr_db (dB) or "
                              "channel.csi_error_var (>= 0)")
    if spec.train.aggregation != "ota":
        raise OtaflInputError(f"channel.csi = 'estimated' needs train.aggregation = 'ota' "
                              f"(found {spec.train.aggregation!r}: no alignment to estimate)")
    if spec.train.algorithm != "fedsgd":  # local steps are accounted by `steps`, which does not read the mismatch
        raise OtaflInputError(f"channel.csi = 'estimated' needs train.algorithm = 'fedsgd' (found "
                              f"{spec.train.algorithm!r}: its steps accountant does not read the gain mismatch)")
    from otafl.privacy.accountants.registry import CSI_ACCOUNTANTS

    refused = [a for a in as_list(spec.privacy.accountants) if a not in CSI_ACCOUNTANTS]
    if refused:
        raise OtaflInputError(f"privacy.accountants = {refused!r} is outside the allowed range for channel.csi = "
                              "'estimated' (exact, tight, paper read the gain mismatch; these do not)")


def check_run_size(spec: Spec) -> None:
    """Refuse, before anything is allocated, a run whose sizes (rounds, users, model width,
    minibatch) would need more memory than :func:`otafl.limits.memory_limit_bytes`."""
    from otafl.limits import check_memory, model_dim_upper, run_bytes, synthetic_bytes

    d, m, tr = spec.data, spec.model, spec.train
    if d.name == "synthetic":
        check_memory(f"data.samples = {d.samples} (the synthetic data set)", synthetic_bytes(d.samples))
    dim = model_dim_upper(m.name, m.hidden)
    check_memory(f"train.rounds = {tr.rounds} with data.users = {d.users}, model.name = {m.name!r}, "
                 f"model.hidden = {m.hidden}",
                 run_bytes(rounds=tr.rounds, users=d.users, dim=dim, batch=d.batch_size))


def _auto_or(where: str, value, lo: float, hi: float | None, **kw) -> None:
    if isinstance(value, str):
        if value != "auto":
            raise OtaflInputError(f"{where} = {value!r} must be 'auto' or a number")
    else:
        check_range(where, value, lo, hi, **kw)


def validate_digital(spec: Spec, names: Mapping[str, Any]) -> None:
    """The [digital] section: names and ranges whatever the aggregation (so a sweep fails
    early); whether digital.bits can hold the sum of K users only for a digital run, the
    only kind that sums in 2^bits (an over-the-air run with many users ignores the bits)."""
    dg, K = spec.digital, spec.data.users
    digital = spec.train.aggregation == "digital"
    _names("digital.mechanism", dg.mechanism, names["digital.mechanism"])
    _names("digital.access", dg.access, names["digital.access"])
    check_range("digital.bits", dg.bits, 2, 48)
    if digital and dg.mechanism == "pbm" and (1 << dg.bits) - 1 < K:
        raise OtaflInputError(f"digital.bits = {dg.bits} is outside the allowed range for pbm with {K} users "
                              f"[{K.bit_length()}, 48] (each sum of K counts must fit in 2^bits)")
    check_scale("digital.sigma2", dg.sigma2, zero=True)
    from otafl.fl.strategies import SCALED_MECHANISMS

    if digital and dg.mechanism in SCALED_MECHANISMS and dg.scale == "auto" and (1 << (dg.bits - 1)) - 1 - K <= 0:
        raise OtaflInputError(f"digital.bits = {dg.bits} is outside the allowed range for {dg.mechanism} with {K} "
                              f"users [{(K + 1).bit_length() + 1}, 48] (the sum of K values needs 2^(bits-1) > K + 1)")
    if isinstance(dg.scale, str):
        _auto_or("digital.scale", dg.scale, 0, None)  # 'auto', else refused
    else:  # levels per gradient unit: scale^2 sigma2 stays finite within [1e-30, 1e30]
        check_scale("digital.scale", dg.scale)
    # theta^2 divides the pbm noise: below 1e-30 it underflows (and the noise is infinite)
    _auto_or("digital.theta", dg.theta, MIN_PBM_THETA, 0.5, hi_open=True)
    check_range("digital.clip_prob", dg.clip_prob, 0, 1, lo_open=True, hi_open=True)
    check_range("digital.min_rate", dg.min_rate, 0, None)
    _auto_or("digital.delta_total", dg.delta_total, 0, 1, lo_open=True, hi_open=True)


AUDIT_SCOPES = ("central", "local")
MAX_AUDIT_TRIALS = 10_000_000
MAX_AUDIT_ROUNDS = 100


def validate_audit(spec: Spec, audit) -> None:
    """The ``[audit]`` section of ``otafl audit-run`` against its run spec (docs/privacy/auditing.md#auditing)."""
    from otafl.privacy.names import CO_USERS

    _names("audit.co_users", audit.co_users, CO_USERS)
    _names("audit.scope", audit.scope, AUDIT_SCOPES)
    check_range("audit.trials", audit.trials, 2, MAX_AUDIT_TRIALS)
    check_range("audit.seed", audit.seed, 0, 2**32 - 1)
    check_range("audit.dim", audit.dim, 1, 4096)
    check_range("audit.canary", audit.canary, 0, audit.dim - 1)
    check_range("audit.records", audit.records, 1, 100_000)
    check_range("audit.curvature", audit.curvature, 0.0, 1e6)
    check_range("train.rounds", spec.train.rounds, 1, MAX_AUDIT_ROUNDS)
    if audit.curvature > 0 and spec.train.algorithm == "fedsgd":
        raise OtaflInputError("audit.curvature > 0 needs train.algorithm = 'fedavg' or 'scaffold' "
                              "(FedSGD's target holds the canary only)")
    local = spec.train.algorithm != "fedsgd"
    if audit.co_users == "noise-cancelling":
        if not local:
            raise OtaflInputError("audit.co_users = 'noise-cancelling' needs train.algorithm = 'fedavg' or 'scaffold'")
        if spec.train.record_sampling != 1.0:
            raise OtaflInputError(f"train.record_sampling = {spec.train.record_sampling!r} is outside the allowed "
                                  "range [1, 1] for audit.co_users = 'noise-cancelling' (every step sees every record)")
