"""Keep freed memory in the process while a loop reallocates the same large buffers.

``otafl audit`` draws its Monte Carlo batches into tensors of tens of megabytes that are
freed and allocated again every batch. glibc serves such blocks with ``mmap`` and hands
them back with ``munmap`` (and trims the heap top above 128 KiB), so every batch pays
millions of page faults in the kernel: the system time exceeded the user time. Inside
:func:`retained_heap` the allocator keeps them (``M_MMAP_MAX = 0``: no mmap'd blocks;
``M_TRIM_THRESHOLD`` 2 GiB: no trimming); the allocator's defaults come back on exit. A
no-op where the C library has no ``mallopt`` (macOS, Windows, musl).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from typing import Iterator

__all__ = ["retained_heap"]

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_MAX: 65536}  # glibc's documented defaults
_KEEP = {_M_TRIM_THRESHOLD: (1 << 31) - 1, _M_MMAP_MAX: 0}  # 2 GiB: the largest int


def _mallopt():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def retained_heap() -> Iterator[None]:
    """Within the block, freed large blocks stay in the process for the next allocation."""
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    for param, value in _KEEP.items():
        mallopt(param, value)
    try:
        yield
    finally:
        for param, value in _DEFAULTS.items():
            mallopt(param, value)
