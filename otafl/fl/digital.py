r"""The ``digital`` aggregation strategy: orthogonal access + secure aggregation (docs/model.md#digital).

Every participant clips its gradient to norm L and privatises it with one registered
mechanism (:data:`MECHANISMS`); the server obtains only the sum (mod 2^bits for the
discrete ones, :mod:`otafl.fl.secagg`), decodes it and estimates as over the air (known
|K_t|). The uplink is orthogonal (:mod:`otafl.channel.orthogonal`): each user sends
D x bits bits over its own resource on the run's fading channel, at the rate its channel
supports; a user in outage sends nothing and its update is lost.

``gaussian``  continuous reference: user k adds N(0, sigma^2 I_d) to g_k; the server gets
              sum_k g_k + N(0, n sigma^2 I_d) (no quantisation, no field; bits only price the uplink).
``skellam``   rotate (x = R g, :mod:`otafl.fl.rotation`), scale by s, round stochastically,
              add Skellam(sigma^2 s^2) noise, sum mod 2^bits; decode centred, divide by s,
              rotate back (Agarwal, Kairouz & Liu 2021).
``ddg``       the same pipeline with discrete Gaussian shares N_Z(0, sigma^2 s^2) per user and
              coordinate (:mod:`otafl.fl.discrete_gaussian`; Kairouz, Liu & Steinke 2021).
``pbm``       rotate, clip each coordinate to the box [-c, c], send Binomial(m, 1/2 + theta x / c)
              per coordinate, sum mod 2^bits (never wraps: m = floor((2^bits - 1) / K); theta
              "auto" makes the per-user noise variance at most sigma^2, as for the others);
              estimate sum_k x_k = (c / (m theta)) (S - n m / 2), rotate back (Chen, Ozgur &
              Kairouz 2022).

``superposition = "aggregate"`` draws the summed Gaussian or Skellam noise once (equal in law
to the users' shares); ``"per-user"`` draws every share and reduces every message mod 2^bits
literally. The PBM always draws per user. A sum of discrete Gaussians is *not* a discrete
Gaussian: with ``"aggregate"`` DDG draws the sum of the n shares from its own law, tabulated
once per (n, variance) as the n-th convolution power of one share's pmf
(:func:`~otafl.fl.discrete_gaussian.discrete_gaussian_sum`, by FFT; about 1e-13 in total
variation from direct convolution at the preset's sizes), one draw per coordinate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from otafl.channel.orthogonal import uplink_cost
from otafl.errors import OtaflInputError
from otafl.fl.discrete_gaussian import discrete_gaussian, discrete_gaussian_sum
from otafl.fl.grads import UserGradients
from otafl.fl.rotation import coordinate_bound, fwht, padded_dim, random_signs, rotation_columns, unrotate
from otafl.fl.coins import GRID_BITS, CoinSource, coins_below
from otafl.fl.secagg import modular_sum, rounding_coins, secagg_decode
from otafl.fl.strategies import MECHANISMS, SCALED_MECHANISMS  # the names (digital.mechanism), re-exported
from otafl.privacy.facts import DigitalMechanism
from otafl.transmit import clip_factors

__all__ = ["MECHANISMS", "DigitalSetup", "build_digital", "binomial_counts", "digital_cost_only",
           "digital_aggregate"]

SCALED = SCALED_MECHANISMS  # otafl.fl.strategies, the registry of the names
"""The mechanisms that scale, round stochastically and add integer shares (same decoding)."""

OVERFLOW_SIGMAS = 6.0
"""``scale = "auto"`` (skellam, ddg) fits K c + 6 sqrt(K sigma^2) (in gradient units) plus the K
rounding steps into half the field."""


@dataclass(frozen=True)
class DigitalSetup:
    """What stays fixed over a digital run (built by :func:`build_digital`).

    power : [K] float64 P_k, the energy budget per d-dimensional block (as over the air).
    coordinates : D sent per user (2^k >= d when rotated, d for ``gaussian``).
    box : c, per-coordinate bound of the rotated vector (pbm; also sizes the auto scale).
    scale : s, integer levels per gradient unit (skellam, ddg).  trials : m (pbm).
    """

    mechanism: str
    bits: int
    noise_var: float
    scale: float
    rotation: bool
    theta: float
    trials: int
    box: float
    coordinates: int
    dim: int
    clip: float
    access: str
    min_rate: float
    power: Tensor
    n0: float
    users: int

    @property
    def bits_per_user(self) -> float:
        return float(self.coordinates * self.bits)

    def facts(self) -> DigitalMechanism:
        """The mechanism as the ``digital`` accountant reads it."""
        return DigitalMechanism(name=self.mechanism, noise_var=self.noise_var, scale=self.scale,
                                coordinates=self.coordinates, box=self.box, theta=self.theta,
                                trials=self.trials, bits=self.bits)


PBM_THETA_MAX = 0.25


def pbm_theta(*, box: float, trials: int, sigma2: float) -> float:
    """``theta = "auto"``: the theta whose PBM noise per user and coordinate,
    (c / (m theta))^2 m p (1 - p) <= c^2 / (4 m theta^2), equals sigma^2 (so that
    ``digital.sigma2`` means the same noise level for every mechanism), capped at 1/4."""
    if sigma2 <= 0:
        return PBM_THETA_MAX
    return min(PBM_THETA_MAX, box / (2.0 * math.sqrt(trials * sigma2)))


def build_digital(spec, *, dim: int, power: Tensor, n0: float) -> DigitalSetup:
    """The DigitalSetup of ``spec.digital`` for a model of ``dim`` parameters and budgets P_k."""
    dg, K, L = spec.digital, spec.data.users, spec.transmit.clip
    if dg.mechanism not in MECHANISMS:
        raise OtaflInputError(f"digital.mechanism = {dg.mechanism!r} is not one of: {', '.join(sorted(MECHANISMS))}")
    rotated = dg.mechanism != "gaussian" and dg.rotation
    D = padded_dim(dim) if rotated else int(dim)
    box = coordinate_bound(norm=L, coordinates=D, failure=dg.clip_prob) if rotated else L
    scale, trials = math.nan, 0
    if dg.mechanism in SCALED:
        if dg.scale == "auto":
            room = (1 << (dg.bits - 1)) - 1 - K
            scale = room / (K * box + OVERFLOW_SIGMAS * math.sqrt(K * dg.sigma2))
            if not scale > 0:
                raise OtaflInputError(f"digital.bits = {dg.bits} is too small for {dg.mechanism} with {K} users "
                                      f"(no room for the sum in 2^{dg.bits})")
        else:
            scale = float(dg.scale)
    theta = math.nan
    if dg.mechanism == "pbm":
        trials = ((1 << dg.bits) - 1) // K
        if trials < 1:
            raise OtaflInputError(f"digital.bits = {dg.bits} is outside the allowed range for pbm with {K} "
                                  f"users [{K.bit_length()}, 48] (2^bits - 1 >= K)")
        theta = pbm_theta(box=box, trials=trials, sigma2=dg.sigma2) if dg.theta == "auto" else float(dg.theta)
    return DigitalSetup(mechanism=dg.mechanism, bits=int(dg.bits), noise_var=float(dg.sigma2), scale=scale,
                        rotation=rotated, theta=theta, trials=trials, box=box, coordinates=D, dim=int(dim),
                        clip=float(L), access=dg.access, min_rate=float(dg.min_rate),
                        power=torch.as_tensor(power, dtype=torch.float64), n0=float(n0), users=int(K))


def digital_cost_only(h: Tensor, active: Tensor, digital: DigitalSetup):
    """(eligible [K] bool, transmitting [K] bool, UplinkCost) of a round without gradients."""
    cost = uplink_cost(h=h, power=digital.power.to(h.device), dim=digital.dim, n0=digital.n0,
                       access=digital.access, users=digital.users, transmitting=active,
                       bits_per_user=digital.bits_per_user, min_rate=digital.min_rate)
    eligible = ~cost.outage
    return eligible, active & eligible, cost


def _skellam_noise(shape, mu: float, generator: torch.Generator) -> Tensor:
    """Poisson(mu) - Poisson(mu) per element (variance 2 mu), float64."""
    if mu <= 0.0:
        return torch.zeros(shape, dtype=torch.float64, device=generator.device)
    rate = torch.full(shape, mu, dtype=torch.float64, device=generator.device)
    return torch.poisson(rate, generator=generator) - torch.poisson(rate, generator=generator)


BERNOULLI_SUM_MAX = 8
"""Binomial(m, p) is drawn as m Bernoulli comparisons up to this m (faster than
``torch.binomial`` there), by ``torch.binomial`` above it; both are exact."""


def binomial_counts(trials: int, threshold: Tensor, coins: CoinSource, generator: torch.Generator, *,
                    as_bool: bool = False) -> Tensor:
    """Binomial(trials, p) elementwise, exact, from the centred coin thresholds
    ``threshold`` = 2^24 (p - 1/2) (:func:`~otafl.fl.coins.coins_below`; used as scratch):
    ``trials`` coins on the 2^-24 grid up to BERNOULLI_SUM_MAX, ``torch.binomial`` above it.
    Float dtype of ``threshold``; bool (the coin itself) for one trial when ``as_bool``."""
    if trials > BERNOULLI_SUM_MAX:
        prob = threshold.add_(COIN_SCALE / 2).mul_(1.0 / COIN_SCALE)
        return torch.binomial(torch.full_like(prob, float(trials)), prob, generator=generator)
    counts = coins_below(threshold, coins, centred=True)
    if trials == 1 and as_bool:
        return counts
    counts = counts.to(threshold.dtype)
    for _ in range(trials - 1):
        counts.add_(coins_below(threshold, coins, centred=True))
    return counts


USER_CHUNK = 24
"""Users rotated, quantised and privatised together: a [24, D] float32 block (768 KiB at
D = 8192) stays in a 1 MiB L2 cache, which makes the round about three times faster than one
[n, D] pass; 24 measured 2-4% faster than 16 or 32 (benchmarks/bench_round.py, D = 8192)."""

FLOAT32_EXACT = float(1 << 24)
"""Integers up to 2^24 in magnitude are exact in float32."""

COIN_SCALE = float(1 << GRID_BITS)
"""Coin thresholds are kept as probabilities times 2^24 (:func:`~otafl.fl.coins.coins_below`)."""


class _Sums:
    """The exact integer sum [D] of the encoded messages, accumulated block by block without a
    float64 pass per block: integer-valued float32 blocks are summed in float32 while
    ``bound`` (a bound on the magnitude of the total) stays below 2^23 (half the exact range,
    a margin for the float32 norms and rotation behind the bound), else in float64;
    coins are summed as bytes into int32."""

    def __init__(self, size: int, device, dtype, bound: float):
        narrow = dtype == torch.float32 and bound < FLOAT32_EXACT / 2  # a factor 2 for rounding
        self.values = torch.zeros(size, dtype=dtype if narrow else torch.float64, device=device)
        self.coins = torch.zeros(size, dtype=torch.int32, device=device)

    def add_values(self, t: Tensor) -> None:
        self.values += t.sum(0, dtype=self.values.dtype)

    def add_coins(self, coins: Tensor) -> None:
        self.coins += coins.view(torch.uint8).sum(0, dtype=torch.int32)

    def total(self) -> Tensor:
        return self.values.to(torch.float64) + self.coins.to(torch.float64)


def _level(digital: DigitalSetup) -> float:
    """What the rotated gradient is multiplied by before encoding: s (skellam, ddg), or
    2^24 theta / c (pbm: the coin thresholds 2^24 p = 2^24 (1/2 + theta x / c), box [-c, c])."""
    return digital.scale if digital.mechanism in SCALED else COIN_SCALE * digital.theta / digital.box


def _encode_chunk(x: Tensor, digital: DigitalSetup, generator: torch.Generator, coins: CoinSource,
                  per_user: bool, sums: _Sums):
    """One block of users' messages: adds their true integer sum to ``sums``; returns (their
    messages' sum mod m [D] int64 when ``per_user`` else None, coordinates clipped to the box).

    ``x`` is the block's rotated vectors times :func:`_level`; it is used as scratch."""
    if digital.mechanism in SCALED:
        low, up = rounding_coins(x, coins, scratch=True)
        if not per_user:  # the noise shares' sum is drawn by _encode_sum
            sums.add_values(low)
            sums.add_coins(up)
            return None, 0
        q = low.add_(up)
        var = digital.noise_var * digital.scale ** 2  # per share
        share = (_skellam_noise(q.shape, var / 2.0, generator) if digital.mechanism == "skellam"
                 else discrete_gaussian(q.shape, var, generator))
        msgs = q.to(torch.float64) + share.to(q.device)
        sums.add_values(msgs)
        return modular_sum(msgs, digital.bits), 0
    # the box [-c, c] in threshold units, rounded down to an integer (exact in float32): every
    # realised probability ceil(2^23 + x) / 2^24 then lies in [1/2 - theta, 1/2 + theta]
    edge = float(math.floor(COIN_SCALE * digital.theta))
    lo, hi = torch.aminmax(x)  # one read; clip and count only when some coordinate is outside
    clipped = 0
    if float(hi) > edge or float(lo) < -edge:
        clipped = int((x.abs() > edge).sum())
        x.clamp_(-edge, edge)
    # x is now 2^24 (p - 1/2): the centred threshold of the coins
    counts = binomial_counts(digital.trials, x, coins, generator, as_bool=not per_user)
    if counts.dtype == torch.bool:
        sums.add_coins(counts)
    else:
        sums.add_values(counts)
    return (modular_sum(counts, digital.bits) if per_user else None), clipped


def _encode_sum(grads: UserGradients, rows: Tensor, factor: Tensor, digital: DigitalSetup,
                generator: torch.Generator, per_user: bool, signs: Tensor | None):
    """Every sender's message, block by block: (true sum [D] float64, SecAgg output [D] int64,
    clipped coordinates). rows : [n] the senders among the computed gradients, factor : [n]
    their clip factors. Each block's gradients, scaled by their clip factors, are written into
    one zero-padded [USER_CHUNK, D] buffer (views of the users' factors when the senders are
    all the computed users, a gather otherwise), signed and scaled, rotated and encoded."""
    n, d = rows.numel(), grads.dim
    D, m = digital.coordinates, 1 << digital.bits
    device, dtype = factor.device, grads.norms.dtype
    level = _level(digital)
    coins = CoinSource(generator)  # every coin of the round
    if signs is not None:
        coef = rotation_columns(signs, d, level, dtype)
    everyone = n == grads.norms.numel()  # rows = 0..n-1: blocks are slices
    buffer = torch.zeros(min(USER_CHUNK, n), D, dtype=dtype, device=device)  # columns d.. stay 0
    # |q| <= s L + 1 per user and coordinate (the rotation keeps the clipped norm); counts <= m
    bound = n * (digital.scale * digital.clip + 1.0 if digital.mechanism in SCALED else float(digital.trials))
    sums = _Sums(D, device, torch.float64 if per_user else dtype, bound)
    wrapped = torch.zeros(D, dtype=torch.int64, device=device) if per_user else None
    clipped = 0
    for i in range(0, n, USER_CHUNK):
        b = min(USER_CHUNK, n - i)
        take = slice(i, i + b) if everyone else rows[i:i + b]
        block = grads.materialise_rows(take, factor[i:i + b], out=buffer[:b],
                                       columns=coef if signs is not None else None)
        if signs is not None:
            x = fwht(block)
        else:
            x = block * level
        part_wrapped, part_clipped = _encode_chunk(x, digital, generator, coins, per_user, sums)
        clipped += part_clipped
        if per_user:
            wrapped = torch.remainder(wrapped + part_wrapped, m)
    true = sums.total()
    if not per_user:
        if digital.mechanism == "skellam":  # the summed shares, drawn once (equal in law)
            true += _skellam_noise((D,), n * digital.noise_var * digital.scale ** 2 / 2.0, generator).to(device)
        elif digital.mechanism == "ddg":  # the sum of n discrete Gaussian shares, from its tabulated law
            true += discrete_gaussian_sum((D,), n, digital.noise_var * digital.scale ** 2, generator).to(device)
        wrapped = torch.remainder(true.to(torch.int64), m)
    return true, wrapped, clipped


def digital_aggregate(grads: UserGradients, h: Tensor, active: Tensor, setup, generator: torch.Generator, *,
                      superposition: str = "aggregate", digital: DigitalSetup | None = None):
    """One digital round (module docstring); the :data:`otafl.fl.round.AGGREGATORS` signature plus
    ``digital`` (the loop binds it). ``setup`` (the over-the-air ChannelSetup) is unused."""
    from otafl.fl.round import Aggregate, _check_superposition

    if digital is None:
        raise OtaflInputError("train.aggregation = 'digital' needs the [digital] setup (build_digital)")
    _check_superposition(superposition)
    eligible, transmitting, cost = digital_cost_only(h, active, digital)
    n = int(transmitting.sum())
    d = grads.dim
    extras = {"channel_uses": cost.channel_uses, "energy": cost.energy, "outages": cost.outages,
              "bits": cost.bits, "overflow": 0, "clipped": 0}
    if n == 0:
        return Aggregate(grads.norms.new_zeros(d), transmitting, eligible, math.nan, math.inf, 0.0, 0,
                         extras=extras)
    keep = eligible[active]  # which of the computed (active) gradients are sent
    factor = clip_factors(grads.norms, digital.clip) * keep.to(grads.norms.dtype)
    per_user = superposition == "per-user"
    if digital.mechanism == "gaussian":
        noise_std = math.sqrt(digital.noise_var)
        if per_user:
            g = grads.materialise()[keep] * factor[keep, None]
            z = torch.randn(g.shape, generator=generator, dtype=g.dtype, device=generator.device)
            aligned = (g + noise_std * z.to(g.device)).sum(0)
        else:
            aligned = grads.weighted_sum(factor)
            if noise_std > 0:
                z = torch.randn(d, generator=generator, dtype=aligned.dtype, device=generator.device)
                aligned.add_(z.to(aligned.device), alpha=noise_std * math.sqrt(n))
        return Aggregate(aligned, transmitting, eligible, math.nan, n * digital.noise_var, 1.0, n, extras=extras)
    rows = keep.nonzero().view(-1)
    dtype = grads.norms.dtype
    signs = random_signs(digital.coordinates, generator, dtype).to(factor.device) if digital.rotation else None
    true, wrapped, clipped = _encode_sum(grads, rows, factor.index_select(0, rows), digital, generator, per_user,
                                         signs)
    if digital.mechanism in SCALED:
        dec = secagg_decode(wrapped, digital.bits, lo=-(1 << (digital.bits - 1)), true_sum=true)
        total = dec.decoded / digital.scale
        noise_var = n * digital.noise_var
    else:
        dec = secagg_decode(wrapped, digital.bits, lo=0, true_sum=true)
        m, c = digital.trials, digital.box
        total = (c / (m * digital.theta)) * (dec.decoded - n * m / 2.0)
        noise_var = n * c * c / (4.0 * m * digital.theta ** 2)  # at most, per coordinate
    overflow = int(dec.overflow.sum())
    extras.update(overflow=overflow, clipped=clipped)
    total = total.to(dtype)
    aligned = unrotate(total, signs, d) if signs is not None else total[:d]
    if overflow:  # never wrap a sum into the model: the round carries no update
        return Aggregate(torch.zeros_like(aligned), transmitting, eligible, math.nan, noise_var, 1.0, n,
                         extras=extras, skip=True)
    return Aggregate(aligned, transmitting, eligible, math.nan, noise_var, 1.0, n, extras=extras)
