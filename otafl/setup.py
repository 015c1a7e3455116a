"""One run setup: everything a run needs, built from a :class:`~otafl.config.Spec`.

The training loop, ``otafl bound --channel``, the channel figure and the benchmarks all
get their random streams, SNR groups, power budgets, artificial-noise levels, large-scale
gains, fading draw h[T, K] and participation probabilities p[T, K] here, so that the same
spec and seed give the same channel everywhere (docs/model.md).

Two levels:

* :func:`build_channel` -- the physics only (no data, no model): groups, budgets, the
  :class:`~otafl.transmit.ChannelSetup`, h[T, K] and p[T, K]. Needs the model dimension d,
  which sets the power budgets P_k = SNR_k d N0.
* :func:`build_run` -- the whole run: streams, data set and user split, model, d, and the
  channel of :func:`build_channel`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from otafl.channel.csi import KnownGains, make_csi
from otafl.channel.fading import ARRicianFading, make_fading
from otafl.config import Spec, as_list
from otafl.device import resolve_device
from otafl.errors import OtaflInputError
from otafl.sampling import SAMPLING_SCHEMES, SamplingScheme, make_sampling
from otafl.transmit import ChannelSetup, assign_groups, max_power, resolve_noise_var, resolve_per_user

#: Independent random streams of a run, each a child of ``train.seed`` (:func:`make_generators`).
#: ``local`` (the local steps' DP noise) is last: the children before it do not depend on it.
STREAMS = ("data", "model", "fading", "coins", "noise", "local")


def make_generators(seed: int, device: torch.device | str = "cpu") -> dict[str, torch.Generator]:
    """One independent generator per stream of :data:`STREAMS`, all derived from ``seed``.

    Changing the aggregation strategy or the noise level therefore does not change which
    samples, coins or fading a round sees. Only ``noise`` lives on ``device``; the others
    draw on the CPU so that a CUDA run sees the same data, coins and fading as a CPU run.
    """
    device = torch.device(device)
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    gens = {}
    for name, child in zip(STREAMS, children):
        g = torch.Generator(device=device if name in ("noise", "local") else torch.device("cpu"))
        g.manual_seed(int(child.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
        gens[name] = g
    return gens


def sampling_law(spec: Spec) -> SamplingScheme:
    """The participation law of ``spec.sampling``: the registered scheme, given the spec
    fields its dataclass declares (``p``; ``schedule, p_start, p_end, values``; ``h_th``)."""
    sm = spec.sampling
    cls = SAMPLING_SCHEMES[sm.scheme]
    params = {f.name: getattr(sm, f.name) for f in fields(cls) if hasattr(sm, f.name)}
    return make_sampling(sm.scheme, **params)


@dataclass(frozen=True)
class ChannelPlan:
    """The channel of a run, fixed before its first round.

    setup : the transmitter budgets, noise levels and alignment policy (per user).
    groups : [K] int64, each user's SNR group.   snr_db : one SNR (dB) per group.
    large_scale_gain : [K] float64, the amplitude multiplying the small-scale fading.
    fading : the fading process.   h : [T, K] float64, the run's gains.
    p : [T, K] float64, participation probabilities p_{k,t} of the sampling law.
    """

    setup: ChannelSetup
    groups: Tensor
    snr_db: tuple[float, ...]
    large_scale_gain: Tensor
    fading: ARRicianFading
    h: Tensor
    p: Tensor

    @property
    def gain_floor(self) -> Tensor:
        """B_t = min_k h_{k,t} sqrt(P_k): [T] float64. With one L and sigma^2 for every
        user, the ``min`` alignment gain is c_t = B_t / sqrt(L^2 + d sigma^2)."""
        return (self.h * self.setup.power.sqrt().to(self.h.device)).amin(-1)


def build_channel(spec: Spec, *, dim: int, device: torch.device | str = "cpu",
                  generators: dict[str, torch.Generator] | None = None) -> ChannelPlan:
    """The channel of ``spec`` for a model of ``dim`` parameters (docs/model.md#fading).

    h[T, K] is drawn from the ``fading`` stream of ``train.seed`` (or of ``generators``,
    which must then come from :func:`make_generators`), so the same spec and seed give the
    same gains whoever calls this. Tensors are float64 on ``device``.
    """
    device = torch.device(device)
    gens = generators if generators is not None else make_generators(spec.train.seed, device)
    ch, tx, K, T = spec.channel, spec.transmit, spec.data.users, spec.train.rounds
    snr = [float(v) for v in as_list(ch.snr_db)]
    groups = assign_groups(K, ch.group_sizes, len(snr))
    snr_user = torch.as_tensor(snr, dtype=torch.float64)[groups]
    setup = ChannelSetup(power=max_power(snr_user, dim, ch.n0).to(device),
                         noise_var=resolve_noise_var(tx.sigma2, groups, K).to(device),
                         n0=ch.n0, clip=tx.clip, dim=dim, alignment=tx.alignment, threshold=tx.threshold)
    gain = resolve_per_user(ch.large_scale_gain, groups, K, name="channel.large_scale_gain")
    fading = make_fading(ch.fading, rician_k=ch.rician_k, rho=ch.rho)
    h = fading.sample(T, gain, gens["fading"])
    h_hat = make_csi(ch).estimates(h, gens["fading"])  # None: perfect CSI (nothing drawn)
    p = sampling_law(spec).probabilities(h if h_hat is None else h_hat.clamp(min=0.0))  # the users know h_hat
    h, p = h.to(device).contiguous(), p.to(device)
    if h_hat is not None:
        setup = dataclasses.replace(setup, csi=KnownGains(h, h_hat))
    from otafl.fl.power import plan_power  # the policy deciding c_t (docs/model.md#power-control)

    setup = plan_power(spec, setup, h, p)
    return ChannelPlan(setup=setup, groups=groups, snr_db=tuple(snr), large_scale_gain=gain, fading=fading,
                       h=h, p=p)


@dataclass
class RunSetup:
    """Everything a training run starts from (:func:`build_run`)."""

    spec: Spec
    device: torch.device
    generators: dict[str, torch.Generator]
    data: object  # otafl.data.Dataset
    split: object  # otafl.data.UserSplit
    model: torch.nn.Module
    dim: int
    channel: ChannelPlan


def build_run(spec: Spec, *, device: str | torch.device | None = None) -> RunSetup:
    """Streams, data set, user split, model (on ``device``), d and the channel of ``spec``."""
    from otafl.data import load_dataset, split_users
    from otafl.models import make_model, num_parameters

    dev = resolve_device(str(device or spec.train.device))
    gens = make_generators(spec.train.seed, dev)
    ds, K = spec.data, spec.data.users
    data = load_dataset(ds.name, data_dir=ds.dir, seed=spec.train.seed, test_fraction=ds.test_fraction,
                        synthetic_samples=ds.samples)
    n_train = data.x_train.shape[0]
    if K > n_train:
        raise OtaflInputError(f"data.users = {K} is outside the allowed range [1, {n_train}] "
                              f"(the training set has {n_train} samples)")
    split = split_users(data.y_train, K, scheme=ds.split, alpha=ds.alpha,
                        shards_per_user=ds.shards_per_user, generator=gens["data"])
    model = make_model(spec.model.name, data.num_features, data.num_classes,
                       hidden=spec.model.hidden, generator=gens["model"]).to(dev)
    dim = num_parameters(model)
    channel = build_channel(spec, dim=dim, device=dev, generators=gens)
    return RunSetup(spec=spec, device=dev, generators=gens, data=data, split=split, model=model, dim=dim,
                    channel=channel)
