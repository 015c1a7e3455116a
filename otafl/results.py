"""Writing a run's results: ``summary.json`` and ``rounds.csv``, atomically.

JSON has no NaN or infinity: non-finite floats are written as the strings ``"nan"``,
``"inf"`` and ``"-inf"`` (an undefined or unbounded epsilon stays visible as such), and read
back as floats by :func:`read_summary`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def jsonable(value: Any) -> Any:
    """Recursively replace non-finite floats by strings; tensors/numpy scalars by Python numbers."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def unjson(value: Any) -> Any:
    """Inverse of :func:`jsonable` for non-finite floats written as strings."""
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: unjson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unjson(v) for v in value]
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def rounds_csv(rounds: list[dict]) -> str:
    """The per-round records as CSV text (columns: the union of keys, first-seen order)."""
    columns: list[str] = []
    for r in rounds:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rounds:
        writer.writerow({k: jsonable(r.get(k, "")) for k in columns})
    return buf.getvalue()


def write_run(out_dir: str | Path, summary: dict, rounds: list[dict]) -> None:
    """Write ``summary.json`` and ``rounds.csv`` into ``out_dir`` (created if needed)."""
    out = Path(out_dir)
    atomic_write_text(out / "rounds.csv", rounds_csv(rounds))
    atomic_write_text(out / "summary.json", json.dumps(jsonable(summary), indent=2, sort_keys=True) + "\n")


def read_summary(path: str | Path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return unjson(json.load(fh))
