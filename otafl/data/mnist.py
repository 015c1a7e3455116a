"""``mnist``: the full MNIST (official 60,000 / 10,000 split) from IDX files in a folder.

When the files are missing, :func:`load_mnist` can fetch them with torchvision, which is
imported only then.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from otafl.data.container import Dataset, DatasetOptions
from otafl.data.idx import read_idx
from otafl.errors import OtaflInputError


#: The four MNIST files, each looked up as given or with a ``.gz`` suffix.
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

_DEFAULT_MNIST_DIR = Path.home() / ".cache" / "otafl" / "mnist"


def _find_mnist_files(directory: Path) -> dict[str, Path] | None:
    """Locate the four MNIST files in ``directory`` or torchvision's ``MNIST/raw`` below it."""
    found = {}
    for key, base in MNIST_FILES.items():
        for folder in (directory, directory / "MNIST" / "raw"):
            hits = [folder / base, folder / (base + ".gz")]
            hit = next((p for p in hits if p.is_file()), None)
            if hit is not None:
                found[key] = hit
                break
        else:
            return None
    return found


def _download_mnist(directory: Path) -> None:
    """Fetch MNIST with torchvision into ``directory/MNIST/raw`` (needs the network)."""
    import torchvision  # noqa: F401  (ImportError is handled by the caller)

    for train in (True, False):
        torchvision.datasets.MNIST(root=str(directory), train=train, download=True)


def _missing_mnist_error(directory: Path, why: str) -> OtaflInputError:
    names = ", ".join(MNIST_FILES.values())
    return OtaflInputError(
        f"mnist: data_dir {str(directory)!r} {why}; expected the IDX files {names} "
        f"(each optionally .gz) in it or in its MNIST/raw/ folder")


@functools.lru_cache(maxsize=2)
def _mnist_arrays(files: tuple[tuple[str, str], ...],
                  stamps: tuple[tuple[int, int], ...]) -> dict[str, np.ndarray]:
    """Parse and check the four MNIST files; cached on (paths, mtimes, sizes).

    ``stamps`` is only part of the cache key, so that a rewritten file is read again.
    """
    del stamps
    arrays = {key: read_idx(path) for key, path in files}
    paths = dict(files)
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        img_path, lab_path = paths[f"{part}_images"], paths[f"{part}_labels"]
        if images.ndim != 3 or images.dtype != np.uint8:
            raise OtaflInputError(
                f"malformed MNIST image file {img_path}: expected a [N, rows, cols] uint8 "
                f"array, got shape {images.shape} dtype {images.dtype}")
        if labels.ndim != 1 or labels.dtype != np.uint8:
            raise OtaflInputError(
                f"malformed MNIST label file {lab_path}: expected an [N] uint8 array, "
                f"got shape {labels.shape} dtype {labels.dtype}")
        if labels.shape[0] != images.shape[0]:
            raise OtaflInputError(
                f"MNIST files {img_path} and {lab_path} disagree: {images.shape[0]} images "
                f"but {labels.shape[0]} labels")
        if labels.size and labels.max() > 9:
            raise OtaflInputError(
                f"malformed MNIST label file {lab_path}: label {int(labels.max())} is "
                f"outside the allowed range [0, 9]")
    for arr in arrays.values():
        arr.setflags(write=False)
    return arrays


def load_mnist(opts: DatasetOptions) -> Dataset:
    """Full MNIST (60,000 / 10,000, official split) from IDX files, pixels / 255.

    Looks in ``data_dir`` (default ``~/.cache/otafl/mnist``) and in ``data_dir/MNIST/raw``
    (torchvision's layout). If the files are missing and ``download`` is true and
    torchvision is importable, downloads them with ``torchvision.datasets.MNIST``.
    ``test_fraction`` and ``seed`` are ignored: MNIST keeps its official split.
    """
    directory = Path(opts.data_dir).expanduser() if opts.data_dir else _DEFAULT_MNIST_DIR
    files = _find_mnist_files(directory)
    if files is None:
        if directory.exists() and not directory.is_dir():  # nothing could be downloaded into it either
            raise _missing_mnist_error(directory, "is a file, not a folder")
        why = "does not exist" if not directory.is_dir() else "lacks some MNIST files"
        if not opts.download:
            raise _missing_mnist_error(directory, why + " (download disabled)")
        try:
            import torchvision  # noqa: F401
        except ImportError:
            raise _missing_mnist_error(
                directory, why + " (and torchvision, which could download them, is not installed)"
            ) from None
        try:
            _download_mnist(directory)
        except Exception as exc:  # network or disk failure: report it as bad input
            raise _missing_mnist_error(
                directory, f"{why} and the torchvision download failed: {exc}") from exc
        files = _find_mnist_files(directory)
        if files is None:
            raise _missing_mnist_error(directory, why + " even after the torchvision download")

    keys = tuple(sorted(files))
    stamps = tuple((files[k].stat().st_mtime_ns, files[k].stat().st_size) for k in keys)
    arrays = _mnist_arrays(tuple((k, str(files[k])) for k in keys), stamps)

    def part(split: str) -> tuple[Tensor, Tensor]:
        images = arrays[f"{split}_images"]
        x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
        y = arrays[f"{split}_labels"].astype(np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    x_train, y_train = part("train")
    x_test, y_test = part("test")
    return Dataset("mnist", x_train, y_train, x_test, y_test, num_classes=10)
