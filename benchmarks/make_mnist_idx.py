"""Write an MNIST-format IDX set of any size (issue 24: K = 10^4 users on 330,000 samples).

Ten classes of 28 x 28 uint8 images: each class has a fixed random template, each image is
its class template plus uniform noise, clipped to [0, 255] (learnable, not MNIST). Seeded, so
the same arguments write the same files. The four files take MNIST's names, so
``data.dir = DIR`` (``data.name = "mnist"``) loads them:

    python benchmarks/make_mnist_idx.py /tmp/mnist-330k --train 330000 --test 10000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from otafl.data import MNIST_FILES


def write_idx(path: Path, array: np.ndarray) -> None:
    """One uint8 IDX file: magic 0x00 0x00 0x08 <ndim>, big-endian uint32 sizes, the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    with open(path, "wb") as fh:
        fh.write(header)
        fh.write(np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def make_set(directory: Path, train: int, test: int, seed: int = 0, chunk: int = 50_000) -> None:
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 200, size=(10, 28, 28), dtype=np.int16)
    directory.mkdir(parents=True, exist_ok=True)
    for part, n in (("train", train), ("test", test)):
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        images = np.empty((n, 28, 28), dtype=np.uint8)
        for start in range(0, n, chunk):  # in chunks: no int16 copy of the whole set
            lab = labels[start:start + chunk]
            noise = rng.integers(-60, 60, size=(lab.size, 28, 28), dtype=np.int16)
            images[start:start + chunk] = np.clip(templates[lab] + noise, 0, 255)
        write_idx(directory / MNIST_FILES[f"{part}_images"], images)
        write_idx(directory / MNIST_FILES[f"{part}_labels"], labels)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--train", type=int, default=330_000, help="training images [330000]")
    parser.add_argument("--test", type=int, default=10_000, help="test images [10000]")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make_set(args.directory, args.train, args.test, args.seed)


if __name__ == "__main__":
    main()
