r"""Pessimistic grids for the quantities that change between rounds (docs/privacy/exact.md#exact-caching).

The ``exact`` accountant integrates each distinct round numerically. Over a run, the
rounds differ in the channel noise N0 / c_t^2 (the alignment gain c_t changes with the
fading) and, under channel-aware or time-varying sampling, in the participation
probabilities. Rounding these to a grid, *in the direction that can only increase the
leakage*, makes rounds repeat, and a repeated round is computed once. Each rounding below
replaces the round by another mechanism M' whose true privacy profile dominates the real
round's, so any upper bound on M' (what ``exact`` computes) bounds the real round:

- **channel noise, rounded down** (:func:`round_variance_down`). The output of the real
  round is that of M' plus independent, data-independent Gaussian noise
  N(0, (ch - ch') I_d): a post-processing, which never increases the hockey-stick
  divergence. Holds for every conditioning (eqs. (1) and (5)) and for local DP.
- **the attacked user's own p, rounded up** (:func:`round_probability_up`). With R the
  output law without the user and P, Q its laws with it under the two neighbours,
  (1 - p) R + p P = (p / p') [(1 - p') R + p' P] + (1 - p / p') R for p <= p', and the
  same with Q, so by joint convexity H(p) <= (p / p') H(p') <= H(p'): delta is
  non-decreasing in the own p, and even delta / p is. The LDP target p delta_l scales
  with p, so the local epsilon computed at (p', target p' delta_l) also holds for p at
  target p delta_l.
- **the others' p are never rounded.** Under eq. (1) (count of the others revealed) the
  bound is non-increasing in a stochastically larger law of n, but the true leakage is
  not known to be monotone in another user's p (that user's participation is itself
  noise which hides the attacked user's), and eq. (5), the bound that wins at the paper
  preset, is not monotone in it either. So rounds whose law of the others differs are
  different cells.

The grids are geometric: a value is moved by at most a factor (1 + resolution). The
channel grid is geometric in ``ch + floor`` where ``floor`` is a variance that always
accompanies ch in the round (the smallest count of the others' window times their noise,
for central DP; 0 for local DP), so every variance the bound uses shrinks by at most that
factor. All functions are pure Python on floats and deterministic (the same value always
lands in the same cell).
"""

from __future__ import annotations

import math

__all__ = ["round_variance_down", "round_probability_up"]


def round_variance_down(value: float, *, floor: float = 0.0, resolution: float) -> float:
    """The largest grid point <= ``value`` on the grid {(1 + resolution)^i - floor}.

    ``value + floor`` is rounded down to an integer power of (1 + resolution), so
    ``(value + floor) / (result + floor) <= 1 + resolution``. The result is clipped at 0
    (never negative; 0 is then the grid point). ``resolution = 0`` returns ``value``
    unchanged; 0 and +inf are returned unchanged.

    Parameters
    ----------
    value : variance >= 0 (N0 / c_t^2, gradient units^2), may be +inf.
    floor : >= 0, a variance always added to ``value`` where it matters.
    resolution : >= 0, relative step of the grid.
    """
    if resolution <= 0 or value <= 0 or math.isinf(value):
        return value
    base = math.log1p(resolution)
    x = value + floor
    i = math.floor(math.log(x) / base + 1e-9)  # a grid point maps to itself despite log's rounding
    g = math.exp(i * base)
    while g > x:  # guard the float rounding of exp/log: the grid point must not exceed x
        i -= 1
        g = math.exp(i * base)
    return max(0.0, g - floor)


def round_probability_up(p: float, *, resolution: float) -> float:
    """The smallest grid point >= ``p`` on {(1 + resolution)^-i} (capped at 1).

    ``result / p <= 1 + resolution``. ``resolution = 0`` returns ``p``; 0 and 1 are
    returned unchanged.
    """
    if resolution <= 0 or p <= 0 or p >= 1:
        return p
    base = math.log1p(resolution)
    i = math.floor(-math.log(p) / base - 1e-9)
    g = math.exp(-i * base)
    while g < p:  # the grid point must not fall below p
        i -= 1
        g = math.exp(-i * base)
    return min(1.0, g)
