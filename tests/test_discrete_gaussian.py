"""The discrete Gaussian sampler against its exact pmf (otafl/fl/discrete_gaussian.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.stats import chi2

from otafl.fl.discrete_gaussian import discrete_gaussian, discrete_gaussian_pmf

DRAWS = 200_000


def _chi_square(samples: np.ndarray, sigma2: float) -> tuple[float, float]:
    """(chi-square p-value, total variation distance) of the samples against N_Z(0, sigma2):
    cells with expected count >= 20, the two tails pooled into one cell each."""
    sigma = math.sqrt(sigma2)
    half = int(12 * sigma + 12)
    support = np.arange(-half, half + 1)
    pmf = discrete_gaussian_pmf(support, sigma2)
    counts = np.array([(samples == x).sum() for x in support], dtype=np.float64)
    assert counts.sum() == samples.size  # nothing beyond 12 sigma + 12
    expected = DRAWS * pmf
    inner = expected >= 20
    lo, hi = np.argmax(inner), len(inner) - np.argmax(inner[::-1])  # the central run of cells
    obs = np.concatenate([[counts[:lo].sum()], counts[lo:hi], [counts[hi:].sum()]])
    exp = np.concatenate([[expected[:lo].sum()], expected[lo:hi], [expected[hi:].sum()]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    p_value = float(chi2.sf(stat, int(keep.sum()) - 1))
    tv = 0.5 * float(np.abs(counts / DRAWS - pmf).sum())
    return p_value, tv


@pytest.mark.parametrize("sigma2", [0.09, 0.25, 1.0, 7.3, 400.0])
def test_discrete_gaussian_sampler_matches_the_exact_pmf(sigma2):
    """Seed 0, 200 000 draws: chi-square p-value > 1e-3, total variation < 0.01 (the TV of
    200 000 exact draws is about sqrt(cells / draws) / 2 < 0.01 up to sigma = 20), mean within
    5 standard errors of 0, variance within 5 standard errors of the exact variance."""
    gen = torch.Generator().manual_seed(0)
    x = discrete_gaussian((DRAWS // 8, 8), sigma2, gen)
    assert x.shape == (DRAWS // 8, 8) and x.dtype == torch.float64
    assert bool((x == torch.round(x)).all())
    samples = x.numpy().reshape(-1)
    p_value, tv = _chi_square(samples, sigma2)
    assert p_value > 1e-3, p_value
    assert tv < 0.01, tv
    support = np.arange(-int(60 * math.sqrt(sigma2) + 60), int(60 * math.sqrt(sigma2) + 60) + 1)
    pmf = discrete_gaussian_pmf(support, sigma2)
    var = float((pmf * support ** 2).sum())
    fourth = float((pmf * support ** 4).sum())
    assert var <= sigma2 * (1 + 1e-12)  # the discrete Gaussian's variance is below sigma^2 (CKS 2020)
    assert abs(samples.mean()) <= 5 * math.sqrt(var / DRAWS)
    assert abs((samples ** 2).mean() - var) <= 5 * math.sqrt((fourth - var ** 2) / DRAWS)


def test_the_chi_square_check_rejects_a_rounded_continuous_gaussian():
    """The same check has power: rounding N(0, sigma^2) (the approximation the sampler avoids)
    is rejected at sigma^2 = 0.25 with the same seed and draws."""
    gen = torch.Generator().manual_seed(0)
    rounded = torch.round(0.5 * torch.randn(DRAWS, generator=gen, dtype=torch.float64)).numpy()
    p_value, _ = _chi_square(rounded, 0.25)
    assert p_value < 1e-6


def test_discrete_gaussian_is_reproducible_and_handles_zero_noise():
    a = discrete_gaussian((3, 5), 9.0, torch.Generator().manual_seed(7))
    b = discrete_gaussian((3, 5), 9.0, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    assert torch.equal(discrete_gaussian((4,), 0.0, torch.Generator()), torch.zeros(4, dtype=torch.float64))
    assert discrete_gaussian(0, 1.0, torch.Generator()).numel() == 0


@pytest.mark.parametrize("n, sigma2", [(1, 2.0), (3, 2.0), (5, 0.3), (4, 7.3), (12, 1.0)])
def test_the_tabulated_law_of_a_sum_of_shares_is_the_direct_convolution(n, sigma2):
    from otafl.fl.discrete_gaussian import sum_table

    low, cdf = sum_table(n, sigma2)
    pmf = np.diff(np.concatenate([[0.0], cdf.numpy()]))
    x = np.arange(-80, 81)
    one = discrete_gaussian_pmf(x, sigma2)
    conv = one
    for _ in range(n - 1):
        conv = np.convolve(conv, one)
    values = np.arange(conv.size) - (conv.size - 1) // 2
    mine = np.zeros_like(conv)
    inside = (values >= low) & (values < low + pmf.size)
    mine[inside] = pmf[values[inside] - low]
    assert 0.5 * np.abs(mine - conv).sum() < 1e-12  # total variation
    assert pmf[~np.isin(np.arange(pmf.size) + low, values)].sum() < 1e-12  # no mass the convolution lacks


def test_summed_draws_follow_the_law_of_the_sum_and_fall_back_to_shares(monkeypatch):
    from otafl.fl import discrete_gaussian as dg

    n, sigma2, draws = 3, 2.0, 200_000
    x = np.arange(-80, 81)
    one = discrete_gaussian_pmf(x, sigma2)
    conv = np.convolve(np.convolve(one, one), one)
    values = np.arange(conv.size) - (conv.size - 1) // 2
    for table_max in (dg.SUM_TABLE_MAX, 1):  # the table, then share by share
        monkeypatch.setattr(dg, "SUM_TABLE_MAX", table_max)
        dg.sum_table.cache_clear()
        sample = dg.discrete_gaussian_sum((draws,), n, sigma2, torch.Generator().manual_seed(0))  # seed 0
        assert bool((sample == torch.round(sample)).all())
        keep = np.abs(values) <= 8  # cells with enough mass; the rest pooled
        observed = np.array([(sample == v).sum().item() for v in values[keep]] + [0.0])
        observed[-1] = draws - observed[:-1].sum()
        expected = np.concatenate([conv[keep], [conv[~keep].sum()]]) * draws
        assert stats.chisquare(observed, expected).pvalue > 1e-3
    dg.sum_table.cache_clear()
