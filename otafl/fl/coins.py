r"""The coins of the digital quantisers: exact Bernoulli draws on a 2^-24 probability grid.

Stochastic rounding (skellam) and the PBM's binomial encoding each flip one coin per user and
coordinate: n D = 1.6 million coins in a round of the paper preset, more random numbers than
anything else in a round. A coin with probability p is 1[U < 2^24 p] for U uniform on
{0, ..., 2^24 - 1}, so that P(1) = ceil(2^24 p) / 2^24: the law of
``torch.rand(dtype=torch.float32) < p`` (torch's float32 uniforms are that grid), off from p by
less than 2^-24.

Where the integers U come from (:class:`CoinSource`, one per round): on the CPU, numpy's SFC64
bit generator (Doty-Humphrey's small fast chaotic generator, which passes BigCrush and
PractRand), seeded with 128 bits drawn from the run's torch generator, two 24-bit integers per
64-bit output; it makes about twice the bits per second of torch's CPU Mersenne Twister. On
other devices the torch generator itself (``torch.randint``). Runs stay reproducible: the
coins are a function of the torch generator's state.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = ["GRID_BITS", "CoinSource", "coins_below"]

GRID_BITS = 24
"""Resolution of the coins' probabilities: the uniforms are {j 2^-24 : 0 <= j < 2^24}."""

_MASK = (1 << GRID_BITS) - 1


class CoinSource:
    """Uniform integers on {0, ..., 2^24 - 1} for one round's coins (module docstring)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self.device = generator.device
        self._bits = None
        if self.device.type == "cpu":
            words = torch.empty(2, dtype=torch.int64).random_(-(1 << 63), None, generator=generator)
            entropy = [int(w) & 0xFFFF_FFFF_FFFF_FFFF for w in words.tolist()]
            self._bits = np.random.SFC64(np.random.SeedSequence(entropy))

    @classmethod
    def of(cls, source: "CoinSource | torch.Generator") -> "CoinSource":
        return source if isinstance(source, CoinSource) else cls(source)

    def integers(self, shape, *, centred: bool = False) -> Tensor:
        """[shape] int32 uniform on {0, ..., 2^24 - 1} (``centred``: on {-2^23, ..., 2^23 - 1}),
        on the source's device."""
        numel = math.prod(shape)
        if self._bits is None:
            low = -(1 << (GRID_BITS - 1)) if centred else 0
            return torch.randint(low, low + (1 << GRID_BITS), tuple(shape), generator=self.generator,
                                 dtype=torch.int32, device=self.device)
        raw = self._bits.random_raw((numel + 1) // 2)  # uint64, all bits uniform
        halves = torch.from_numpy(raw.view(np.int32))[:numel]
        # centred: the top 24 bits, arithmetic shift (sign kept); else the low 24 bits
        out = halves.bitwise_right_shift_(32 - GRID_BITS) if centred else halves.bitwise_and_(_MASK)
        return out.view(tuple(shape))


def coins_below(threshold: Tensor, source: "CoinSource | torch.Generator", *, centred: bool = False) -> Tensor:
    """Coins 1[U < t] for t = ``threshold`` in [0, 2^24] (a probability times 2^24):
    P(1) = ceil(t) / 2^24, independent across elements. Bool, on ``threshold``'s device.
    ``centred``: the threshold is given as t - 2^23 (and U shifted alike), which saves the
    caller a pass. Callers that fold the factor 2^24 into an earlier scaling save another."""
    draws = CoinSource.of(source).integers(threshold.shape, centred=centred)
    draws = draws.to(device=threshold.device, dtype=threshold.dtype)
    return draws < threshold  # same dtypes: a mixed int/float comparison runs about 4x slower
