"""The coins of the digital quantisers (otafl/fl/coins.py): law, range, reproducibility."""


import pytest
import torch
from scipy import stats

from otafl.fl.coins import GRID_BITS, CoinSource, coins_below

SCALE = float(1 << GRID_BITS)


@pytest.mark.parametrize("centred", [False, True])
def test_coins_below_a_threshold_have_the_law_of_a_24_bit_uniform_comparison(centred):
    gen = torch.Generator().manual_seed(0)  # seed 0
    probs = torch.tensor([0.0, 0.1, 0.37, 0.5, 0.75, 1.0], dtype=torch.float64)
    draws = 200_000
    threshold = (probs * SCALE).expand(draws, -1).contiguous()
    if centred:
        threshold = threshold - SCALE / 2
    coins = coins_below(threshold, CoinSource(gen), centred=centred)
    assert coins.dtype == torch.bool
    freq = coins.double().mean(0)
    expected = torch.ceil(probs * SCALE) / SCALE
    se = torch.sqrt(expected * (1 - expected) / draws)
    assert freq[0] == 0.0 and freq[-1] == 1.0  # p = 0 never, p = 1 always
    assert torch.all((freq - expected).abs() <= 5 * se + 1e-12)  # 5 standard errors


def test_a_coin_sits_exactly_on_the_grid():
    # P(1) = ceil(2^24 p) / 2^24: with 2^24 p = 3.5 the coin is 1 exactly when U < 4, U in 0..2^24-1
    source = CoinSource(torch.Generator().manual_seed(1))  # seed 1
    u = source.integers((1_000_000,))
    assert int(u.min()) >= 0 and int(u.max()) < 1 << GRID_BITS
    source = CoinSource(torch.Generator().manual_seed(1))
    coins = coins_below(torch.full((1_000_000,), 3.5, dtype=torch.float64), source)
    assert torch.equal(coins, u.double() < 4)


@pytest.mark.parametrize("centred", [False, True])
def test_the_24_bit_integers_are_uniform(centred):
    source = CoinSource(torch.Generator().manual_seed(2))  # seed 2
    u = source.integers((2_000_000,), centred=centred).long()
    low = -(1 << (GRID_BITS - 1)) if centred else 0
    assert int(u.min()) >= low and int(u.max()) < low + (1 << GRID_BITS)
    u = u - low
    for part in (u >> 16, u & 0xFF):  # top and bottom bytes: chi-square over 256 cells
        counts = torch.bincount(part, minlength=256).numpy()
        assert stats.chisquare(counts).pvalue > 1e-4


def test_coins_are_a_function_of_the_torch_generator_state():
    def draw(seed):
        source = CoinSource(torch.Generator().manual_seed(seed))
        return coins_below(torch.full((4096,), 0.3 * SCALE), source)

    assert torch.equal(draw(5), draw(5))
    assert not torch.equal(draw(5), draw(6))
