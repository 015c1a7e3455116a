"""The names a spec accepts, kept apart from the torch code behind them so that the CLI can
offer them as choices and spec validation (:mod:`otafl.validation`) can check them without
importing torch: ``otafl --help``, a misspelt option and a bad spec value stay fast
(tests/test_cli_startup.py).

These are the registries themselves, the single source of each key's names: a registry of
implementations (:class:`Registry`) maps a name to ``"module:attr"``, imported on first use;
each implementing module re-exports its registry from here (``otafl.models.MODELS is
otafl.names.MODELS``). A new model, data set or scheme is one function in its module plus
one entry here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any


class Registry(MutableMapping):
    """Name -> implementation, each entry given as ``"module:attr"`` and imported on first
    use (so listing and checking the names imports nothing). ``REGISTRY[name]`` is the
    implementation; an entry set to an object (``monkeypatch.setitem``) is used as is."""

    def __init__(self, where: str, entries: dict[str, str]):
        self.where = where  # the spec key, for messages
        self._targets: dict[str, Any] = {name: _Target(target) for name, target in entries.items()}

    def __getitem__(self, name: str) -> Any:
        value = self._targets[name]
        if isinstance(value, _Target):
            module, _, attr = value.partition(":")
            value = self._targets[name] = getattr(importlib.import_module(module), attr)
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        self._targets[name] = value

    def __delitem__(self, name: str) -> None:
        del self._targets[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def __repr__(self) -> str:
        return f"Registry({self.where!r}, {sorted(self._targets)!r})"


class _Target(str):
    """An entry not imported yet ("module:attr")."""


#: Accepted device names (``train.device``, ``--device``): ``auto`` = CUDA when present, CPU
#: otherwise (:func:`otafl.device.resolve_device`).
DEVICES = ("auto", "cpu", "cuda")

#: Dataset registry (``data.name``): name -> loader (:data:`otafl.data.load.DATASETS`).
DATASETS = Registry("data.name", {
    "mnist-embedded": "otafl.data.embedded:load_mnist_embedded",
    "digits": "otafl.data.embedded:load_digits",
    "mnist": "otafl.data.mnist:load_mnist",
    "synthetic": "otafl.data.synthetic:load_synthetic",
})

#: Split-scheme registry (``data.split``): name -> function(labels [N], users, *, alpha,
#: shards_per_user, generator) -> owner [N] int64 (:data:`otafl.data.splits.SPLITS`).
SPLITS = Registry("data.split", {
    "iid": "otafl.data.splits:_split_iid",
    "shards": "otafl.data.splits:_split_shards",
    "dirichlet": "otafl.data.splits:_split_dirichlet",
})

#: Model registry (``model.name``): name -> builder(in_features, num_classes, hidden, generator)
#: -> nn.Module (:data:`otafl.models.MODELS`).
MODELS = Registry("model.name", {
    "single-layer": "otafl.models:_single_layer",
    "two-layer": "otafl.models:_two_layer",
})

#: Fading models (``channel.fading``): every entry is :class:`otafl.channel.fading.ARRicianFading`
#: or a subclass of it.
FADING_MODELS = Registry("channel.fading", {
    "ar-rician": "otafl.channel.fading:ARRicianFading",
    "rayleigh": "otafl.channel.fading:RayleighFading",
    "static": "otafl.channel.fading:StaticFading",
})

#: Channel state information (``channel.csi``; :mod:`otafl.channel.csi`): which gains alignment inverts.
CSI_MODELS = Registry("channel.csi", {
    "perfect": "otafl.channel.csi:PerfectCSI",
    "estimated": "otafl.channel.csi:EstimatedCSI",
})

#: Sampling schemes (``sampling.scheme``; :mod:`otafl.sampling`).
SAMPLING_SCHEMES = Registry("sampling.scheme", {
    "uniform": "otafl.sampling:UniformSampling",
    "time-varying": "otafl.sampling:TimeVaryingSampling",
    "channel-aware": "otafl.sampling:ChannelAwareSampling",
})

#: Schedules of the time-varying scheme (``sampling.schedule``).
SCHEDULES = ("constant", "linear", "exponential", "cosine", "list")

#: Estimators (``estimator.kind``), one signature: ``fn(aligned, *, participants, mu) -> [d] | None``
#: (None: skip the round's update). ``known`` uses |K_t|, ``unknown`` uses mu_t.
ESTIMATORS = Registry("estimator.kind", {
    "known": "otafl.estimate:estimate_known",
    "unknown": "otafl.estimate:estimate_unknown",
})

#: Server optimizers (``train.optimizer``): ``fn(params, *, lr) -> Optimizer`` (:mod:`otafl.fl.optim`).
OPTIMIZERS = Registry("train.optimizer", {"adam": "otafl.fl.optim:_adam", "sgd": "otafl.fl.optim:_sgd"})

#: Alignment policies (``transmit.alignment``; :func:`otafl.transmit.alignment_gains`).
ALIGNMENT_POLICIES = ("min", "truncate")

#: Orthogonal access schemes of a digital round (``digital.access``; :mod:`otafl.channel.orthogonal`).
ACCESS_SCHEMES = ("tdma", "ofdma")
