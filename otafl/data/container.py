"""The :class:`Dataset` container, the loader options and the checks every loader shares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from otafl.errors import OtaflInputError, out_of_range


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification dataset with flat features, split into train and test.

    Attributes
    ----------
    name : str
        Registry name the dataset was loaded under.
    x_train : [N, F], float32
        Training features (pixels scaled to [0, 1] for the image datasets).
    y_train : [N], int64
        Training labels in ``{0, ..., num_classes - 1}``.
    x_test : [M, F], float32
        Test features.
    y_test : [M], int64
        Test labels.
    num_classes : int
        Number of classes C.
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int

    def __post_init__(self) -> None:
        parts = (("train", self.x_train, self.y_train), ("test", self.x_test, self.y_test))
        for split, x, y in parts:
            if x.dtype != torch.float32 or x.dim() != 2:
                raise OtaflInputError(
                    f"{self.name}: x_{split} must be a [N, F] float32 tensor, "
                    f"got shape {tuple(x.shape)} dtype {x.dtype}")
            if y.dtype != torch.int64 or y.dim() != 1 or y.shape[0] != x.shape[0]:
                raise OtaflInputError(
                    f"{self.name}: y_{split} must be a [{x.shape[0]}] int64 tensor, "
                    f"got shape {tuple(y.shape)} dtype {y.dtype}")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise OtaflInputError(
                    f"{self.name}: y_{split} has labels in [{int(y.min())}, {int(y.max())}], "
                    f"outside the allowed range [0, {self.num_classes - 1}]")
        if self.x_train.shape[1] != self.x_test.shape[1]:
            raise OtaflInputError(
                f"{self.name}: train has {self.x_train.shape[1]} features but test has "
                f"{self.x_test.shape[1]}")

    @property
    def num_features(self) -> int:
        """Number of input features F (784 for MNIST, 64 for digits)."""
        return int(self.x_train.shape[1])


@dataclass(frozen=True)
class DatasetOptions:
    """Everything a loader may read; built and validated by :func:`otafl.data.load_dataset`.

    Loaders ignore the fields that do not concern them (``mnist`` ignores
    ``test_fraction`` because MNIST has an official split; only ``synthetic`` reads the
    ``synthetic_*`` fields).
    """

    data_dir: str | None = None
    seed: int = 0
    test_fraction: float = 0.2
    download: bool = True
    synthetic_samples: int = 3000
    synthetic_features: int = 20
    synthetic_classes: int = 10
    synthetic_separation: float = 1.0


#: A dataset loader, the value type of the registry :data:`otafl.data.DATASETS`.
Loader = Callable[[DatasetOptions], Dataset]


def _check_int(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer in [lo, hi], else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        else:
            raise OtaflInputError(f"{name} = {value!r} must be an integer")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else str(lo)
        hi_s = "inf" if hi is None else str(hi)
        raise out_of_range(name, value, f"[{lo_s}, {hi_s}]")
    return value


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int,
                      name: str) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified train/test split of sample indices.

    ``n_test = ceil(test_fraction * N)`` samples go to the test set, apportioned to the
    classes by largest remainder: class c gets ``floor(test_fraction * n_c)``, and the
    classes with the largest fractional parts (ties: lower label) one more each until the
    total is ``n_test``. Within a class the test samples are the first of a random
    permutation drawn from ``torch.Generator().manual_seed(seed)``. Both parts must be
    non-empty.

    (scikit-learn's ``train_test_split(stratify=...)`` does the same job, but it draws
    from numpy's RNG and would make every run import scikit-learn; this keeps every draw
    in one seeded torch generator.)

    Returns sorted ``train_idx [N - n_test]`` and ``test_idx [n_test]``, int64.
    """
    n = labels.shape[0]
    classes, class_sizes = np.unique(labels, return_counts=True)
    n_test = math.ceil(test_fraction * n)
    if n_test < 1 or n_test > n - 1:
        raise out_of_range(f"{name}: test_fraction", test_fraction,
                           f"(0, {(n - 1) / n:.6g}] (both parts of {n} samples must be non-empty)")
    exact = test_fraction * class_sizes
    per_class = np.floor(exact).astype(np.int64)
    by_remainder = np.argsort(-(exact - per_class), kind="stable")
    per_class[by_remainder[: n_test - per_class.sum()]] += 1

    gen = torch.Generator().manual_seed(seed)
    is_test = np.zeros(n, dtype=bool)
    for c, k in zip(classes, per_class):
        members = np.flatnonzero(labels == c)
        chosen = torch.randperm(members.size, generator=gen)[: int(k)].numpy()
        is_test[members[chosen]] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def _dataset_from_arrays(name: str, images_u8: np.ndarray, labels: np.ndarray,
                         train_idx: np.ndarray, test_idx: np.ndarray, num_classes: int,
                         scale: float) -> Dataset:
    """Build a :class:`Dataset` from cached read-only arrays (indexing copies them).

    ``images_u8`` [N, ...] (uint8) and ``labels`` [N] are indexed by ``train_idx`` and
    ``test_idx``; each image is flattened to F float32 features divided by ``scale`` and
    each label cast to int64.
    """
    def feats(idx: np.ndarray) -> Tensor:
        x = images_u8[idx].reshape(idx.shape[0], -1).astype(np.float32) / np.float32(scale)
        return torch.from_numpy(x)

    def labs(idx: np.ndarray) -> Tensor:
        return torch.from_numpy(labels[idx].astype(np.int64))

    return Dataset(name=name, x_train=feats(train_idx), y_train=labs(train_idx),
                   x_test=feats(test_idx), y_test=labs(test_idx), num_classes=num_classes)
