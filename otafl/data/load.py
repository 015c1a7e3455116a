"""The dataset registry :data:`DATASETS` and its entry point :func:`load_dataset`."""

from __future__ import annotations

from otafl.data.container import Dataset, DatasetOptions, _check_int
from otafl.errors import OtaflInputError, check_range, out_of_range


#: Dataset registry: name -> loader, the single source of accepted dataset names.
from otafl.names import DATASETS  # noqa: E402 (the names, torch-free; entries resolve here)

DEFAULT_DATASET = "mnist-embedded"


def load_dataset(name: str = DEFAULT_DATASET, *, data_dir: str | None = None, seed: int = 0,
                 test_fraction: float = 0.2, download: bool = True,
                 synthetic_samples: int = 3000, synthetic_features: int = 20,
                 synthetic_classes: int = 10, synthetic_separation: float = 1.0) -> Dataset:
    """Load a dataset from the registry :data:`DATASETS` and split it into train and test.

    Parameters
    ----------
    name : str
        One of ``sorted(DATASETS)``; default ``mnist-embedded`` (offline, 5,000 images).
    data_dir : str, optional
        Folder with the MNIST IDX files (``mnist`` only); default ``~/.cache/otafl/mnist``.
    seed : int
        Seed of the stratified train/test split (and of the ``synthetic`` draw).
    test_fraction : float in (0, 1)
        Share of samples held out for testing (``ceil(test_fraction * N)`` of them);
        ignored by ``mnist``, which keeps its official 60,000 / 10,000 split.
    download : bool
        ``mnist`` only: when the files are missing, try ``torchvision.datasets.MNIST``.
    synthetic_samples, synthetic_features, synthetic_classes, synthetic_separation
        Size N (train + test), dimension F, number of classes C and mean scale s of the
        ``synthetic`` Gaussian mixture.

    Returns
    -------
    Dataset
        float32 features [N, F] and int64 labels [N]; image pixels scaled to [0, 1].

    Raises
    ------
    OtaflInputError
        Unknown name (the message lists the allowed names), out-of-range option, or
        missing / malformed data files (the message names the file or folder).
    """
    if name not in DATASETS:
        raise OtaflInputError(
            f"dataset = {name!r} is not one of the allowed names: {', '.join(sorted(DATASETS))}")
    check_range("test_fraction", test_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
    opts = DatasetOptions(
        data_dir=data_dir,
        seed=_check_int("seed", seed, 0, 2**32 - 1),
        test_fraction=float(test_fraction),
        download=bool(download),
        synthetic_samples=_check_int("synthetic_samples", synthetic_samples, 2, None),
        synthetic_features=_check_int("synthetic_features", synthetic_features, 1, None),
        synthetic_classes=_check_int("synthetic_classes", synthetic_classes, 2, None),
        synthetic_separation=check_range("synthetic_separation", synthetic_separation, 0.0, None),
    )
    if name == "synthetic" and opts.synthetic_samples < 2 * opts.synthetic_classes:
        raise out_of_range("synthetic_samples", synthetic_samples,
                           f"[{2 * opts.synthetic_classes}, inf] (two per class)")
    return DATASETS[name](opts)
