"""Wireless channel: fading processes (generate h) and the Gaussian MAC (apply it)."""

from otafl.channel.fading import (
    FADING_MODELS,
    ARRicianFading,
    RayleighFading,
    StaticFading,
    make_fading,
)
from otafl.channel.mac import superpose

__all__ = [
    "ARRicianFading",
    "RayleighFading",
    "StaticFading",
    "FADING_MODELS",
    "make_fading",
    "superpose",
]
