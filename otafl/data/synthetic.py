"""``synthetic``: a seeded Gaussian mixture, small and learnable, for tests."""

from __future__ import annotations

import torch

from otafl.data.container import Dataset, DatasetOptions, _stratified_split


def load_synthetic(opts: DatasetOptions) -> Dataset:
    """Balanced Gaussian mixture: x = mu_y + z, mu_c ~ N(0, s^2 I_F), z ~ N(0, I_F).

    With separation s = 1 and F = 20 two class means lie about s sqrt(2F) ~ 6.3 noise
    standard deviations apart, so a linear classifier reaches high (not perfect)
    accuracy quickly: learnable, for tests. Labels are balanced (``n mod C``) and
    shuffled; everything is drawn from ``torch.Generator().manual_seed(seed)``. Features
    are float32 [N, F], labels int64 [N], split stratified like the image datasets.
    """
    n, f, c = opts.synthetic_samples, opts.synthetic_features, opts.synthetic_classes
    gen = torch.Generator().manual_seed(opts.seed)
    means = opts.synthetic_separation * torch.randn(c, f, generator=gen)
    labels = torch.arange(n) % c
    labels = labels[torch.randperm(n, generator=gen)]
    x = means[labels] + torch.randn(n, f, generator=gen)
    train_idx, test_idx = _stratified_split(labels.numpy(), opts.test_fraction, opts.seed,
                                            "synthetic")
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return Dataset("synthetic", x[train_idx].contiguous(), labels[train_idx].contiguous(),
                   x[test_idx].contiguous(), labels[test_idx].contiguous(), num_classes=c)
