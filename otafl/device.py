"""Where tensors live: ``auto`` (CUDA when present, CPU otherwise), ``cpu`` or ``cuda``."""

from __future__ import annotations

import torch

from otafl.errors import OtaflInputError


#: Accepted device names (``train.device``, ``--device``).
DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when present, CPU otherwise; ``cuda`` without a GPU is an input error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise OtaflInputError("device = 'cuda' is outside the allowed range (no CUDA device here; use cpu or auto)")
    return torch.device(name)
