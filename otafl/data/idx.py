"""Parser of the IDX file format in which MNIST is distributed."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np

from otafl.errors import OtaflInputError


#: IDX element types: third magic byte -> big-endian numpy dtype (LeCun et al., MNIST page).
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | Path) -> np.ndarray:
    """Parse one IDX file (optionally gzip-compressed) into a native-endian numpy array.

    IDX layout (LeCun, Cortes & Burges, "The MNIST database"): a 4-byte magic number
    ``0x00 0x00 <type> <ndim>``, then ``ndim`` big-endian uint32 dimension sizes, then the
    elements in C order, big-endian. ``<type>`` is one of 0x08 (uint8), 0x09 (int8),
    0x0B (int16), 0x0C (int32), 0x0D (float32), 0x0E (float64). A file whose name ends in
    ``.gz`` is decompressed first.

    Raises
    ------
    OtaflInputError
        Naming the file, if it cannot be read, has a bad magic number or type code, or
        holds a number of bytes that does not match its header.
    """
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError) as exc:
        raise OtaflInputError(f"cannot read IDX file {path}: {exc}") from exc

    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise OtaflInputError(
            f"malformed IDX file {path}: magic number must start with two zero bytes, "
            f"got {raw[:4].hex() or 'an empty file'}")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise OtaflInputError(
            f"malformed IDX file {path}: element type 0x{type_code:02X} is not one of {allowed}")
    if ndim < 1:
        raise OtaflInputError(f"malformed IDX file {path}: number of dimensions is 0")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise OtaflInputError(
            f"malformed IDX file {path}: {len(raw)} bytes cannot hold a header for "
            f"{ndim} dimensions")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = header + math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        raise OtaflInputError(
            f"malformed IDX file {path}: header says shape {dims} of {dtype.name} "
            f"({expected} bytes in all) but the file holds {len(raw)} bytes")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))
