"""Where tensors live: ``auto`` (CUDA when present, CPU otherwise), ``cpu`` or ``cuda``; and
the library's thread policy (:func:`default_threads`), the CLI's ``--threads`` default."""

from __future__ import annotations

import torch

from otafl.errors import OtaflInputError
from otafl.names import DEVICES  # noqa: F401 (the accepted names, torch-free; part of this module's interface)

THREADS_ENV = "OTAFL_THREADS"
_TORCH_DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice, before anyone set it
_THREADS_CHOSEN = False


def default_threads() -> None:
    """Give torch the CLI's thread policy once per process: ``$OTAFL_THREADS``, else 1 (on a
    shared or small machine one thread is fastest; the README's Python API example ran 79 s
    with torch's default against 9 s with one). Called by ``run_experiment`` and the
    :mod:`otafl.api` entry points; it leaves alone a count the caller set with
    ``torch.set_num_threads`` after importing otafl (anything but the count torch had when
    this module was imported) and a process where the CLI already chose. To use more
    threads: ``OTAFL_THREADS=N``, or ``torch.set_num_threads(N)`` after the imports."""
    global _THREADS_CHOSEN
    if _THREADS_CHOSEN:
        return
    _THREADS_CHOSEN = True
    if torch.get_num_threads() != _TORCH_DEFAULT_THREADS:
        return
    import os

    raw = os.environ.get(THREADS_ENV, "1")
    try:
        n = int(raw)
    except ValueError:
        raise OtaflInputError(f"{THREADS_ENV} = {raw!r} is outside the allowed range (integers >= 1)") from None
    if n < 1:
        raise OtaflInputError(f"{THREADS_ENV} = {raw!r} is outside the allowed range (integers >= 1)")
    torch.set_num_threads(n)


def threads_chosen() -> None:
    """Mark the thread count as chosen (the CLI's ``--threads``): :func:`default_threads` keeps it."""
    global _THREADS_CHOSEN
    _THREADS_CHOSEN = True


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when present, CPU otherwise; ``cuda`` without a GPU is an input error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise OtaflInputError("device = 'cuda' is outside the allowed range (no CUDA device here; use cpu or auto)")
    return torch.device(name)
