r"""Quantisation and the secure-aggregation sum, simulated exactly (docs/model.md#secagg).

Every participant maps its vector into the field Z_m, m = 2^bits; secure aggregation hands
the server only the sum of the messages mod m (Bonawitz et al. 2017), never a message.
:func:`modular_sum` is that output, computed literally from the users' messages;
:func:`secagg_decode` reads it back into the representable range [lo, lo + m) and reports
*overflow*: a true integer sum outside that range, which the modular sum would silently wrap.
The simulation knows the true sum, so overflow is detected exactly (decoded != true) and is
never passed on to the model (the round is skipped; the loop records it).

Integers are carried as float64 (exact below 2^53) and as int64 for the modular steps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from otafl.fl.coins import GRID_BITS, CoinSource, coins_below

__all__ = ["rounding_coins", "stochastic_round", "modular_sum", "secagg_decode", "SecAggResult"]


def rounding_coins(x: Tensor, source: CoinSource | torch.Generator, *, scratch: bool = False
                   ) -> tuple[Tensor, Tensor]:
    """Unbiased stochastic rounding in two parts: (floor(x), coins), the result being their sum.

    The coin is 1 with probability ceil(2^24 frac) / 2^24 (:func:`~otafl.fl.coins.coins_below`),
    frac = x - floor(x), so E[floor + coin] = x up to that 2^-24 grid and |result - x| < 1.
    One coin per element from ``source``. With ``scratch`` the caller gives ``x`` up (it is
    overwritten); otherwise ``x`` is not modified. Returns (floor [same dtype], coins [bool]).
    """
    low = torch.floor(x)
    frac = x.sub_(low) if scratch else x - low
    return low, coins_below(frac.mul_(float(1 << GRID_BITS)), source)


def stochastic_round(x: Tensor, source: CoinSource | torch.Generator, *, scratch: bool = False) -> Tensor:
    """floor(x) + coin, same dtype as x (:func:`rounding_coins`)."""
    low, up = rounding_coins(x, source, scratch=scratch)
    return low.add_(up)


def modular_sum(messages: Tensor, bits: int) -> Tensor:
    """SecAgg's output from the users' messages: (sum_k (y_k mod m)) mod m, m = 2^bits.

    messages : [n, D] integer-valued (any dtype). Returns [D] int64 in [0, m).
    """
    m = 1 << int(bits)
    y = torch.remainder(messages.to(torch.int64), m)
    return torch.remainder(y.sum(dim=0), m)


class SecAggResult(tuple):
    """(decoded [D] float64, overflow [D] bool)."""

    __slots__ = ()

    @property
    def decoded(self) -> Tensor:
        return self[0]

    @property
    def overflow(self) -> Tensor:
        return self[1]


def secagg_decode(wrapped: Tensor, bits: int, *, lo: int, true_sum: Tensor | None = None) -> SecAggResult:
    """Read SecAgg's output back into [lo, lo + m) and flag overflow.

    wrapped : [D] int64 in [0, m) (:func:`modular_sum`, or ``true_sum mod m``).
    lo : lower end of the representable range (-2^(bits-1) for centred values, 0 for counts).
    true_sum : [D] the exact integer sum, known to the simulation only: overflow is
        decoded != true_sum (no overflow reported when None).

    Returns (decoded [D] float64, overflow [D] bool).
    """
    m = 1 << int(bits)
    decoded = (int(lo) + torch.remainder(wrapped.to(torch.int64) - int(lo), m)).to(torch.float64)
    if true_sum is None:
        overflow = torch.zeros_like(decoded, dtype=torch.bool)
    else:
        overflow = decoded != true_sum.to(torch.float64)
    return SecAggResult((decoded, overflow))
