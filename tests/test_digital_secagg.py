"""Secure aggregation simulated exactly: the modular sum, its decoding, overflow, rounding, rotation."""

from __future__ import annotations

import math

import pytest
import torch

from otafl.fl.rotation import coordinate_bound, fwht, padded_dim, random_signs, rotate, unrotate
from otafl.fl.secagg import modular_sum, secagg_decode, stochastic_round


def test_decoded_sum_equals_the_sum_of_the_quantised_inputs_whenever_nothing_overflows():
    gen = torch.Generator().manual_seed(0)  # seed 0
    for bits, lo in ((8, -128), (12, -2048), (16, 0)):
        m = 1 << bits
        n, D = 7, 50
        # messages whose true sum stays inside [lo, lo + m)
        span = (m - 1) // n
        base = lo // n if lo < 0 else 0
        x = torch.randint(0, span, (n, D), generator=gen) + base
        true = x.sum(0)
        assert bool(((true >= lo) & (true < lo + m)).all())
        for wrapped in (modular_sum(x, bits), torch.remainder(true, m)):
            dec = secagg_decode(wrapped, bits, lo=lo, true_sum=true)
            assert torch.equal(dec.decoded, true.to(torch.float64))
            assert not bool(dec.overflow.any())
        # each message is reduced mod m before the sum: the server never sees a message
        assert torch.equal(modular_sum(torch.remainder(x, m), bits), modular_sum(x, bits))


def test_overflow_is_detected_exactly_and_never_decoded_as_the_true_sum():
    bits = 6  # field of 64, centred range [-32, 32)
    x = torch.tensor([[20, -20, 10, 31], [20, -20, 10, 0], [-5, 5, 0, 1]])
    true = x.sum(0)  # [35, -35, 20, 32]: the first, second and last leave [-32, 32)
    dec = secagg_decode(modular_sum(x, bits), bits, lo=-32, true_sum=true)
    assert dec.overflow.tolist() == [True, True, False, True]
    assert dec.decoded.tolist() == [35 - 64, -35 + 64, 20, 32 - 64]  # what a wrap would have given
    # counts (PBM): range [0, 64)
    counts = torch.tensor([[40, 3], [30, 3]])
    dec = secagg_decode(modular_sum(counts, bits), bits, lo=0, true_sum=counts.sum(0))
    assert dec.overflow.tolist() == [True, False]


def test_stochastic_rounding_is_unbiased_and_moves_each_value_by_less_than_one():
    gen = torch.Generator().manual_seed(1)  # seed 1; 200000 draws per value, tolerance 5 standard errors
    x = torch.tensor([-2.75, -0.5, 0.0, 0.1, 3.999, 1000.3], dtype=torch.float32)
    draws = stochastic_round(x.expand(200_000, -1).contiguous(), gen)
    assert bool(((draws - x).abs() < 1).all()) and bool((draws == torch.round(draws)).all())
    frac = (x - torch.floor(x)).double()
    se = torch.sqrt(frac * (1 - frac) / 200_000).clamp(min=1e-12)
    err = (draws.double().mean(0) - x.double()).abs()
    assert bool((err <= 5 * se + 1e-6).all()), err
    # negative control: plain flooring fails the same test
    assert bool(((torch.floor(x).double() - x.double()).abs() > 5 * se + 1e-6).any())


def test_walsh_hadamard_rotation_is_orthonormal_and_spreads_a_vector():
    from scipy.linalg import hadamard

    gen = torch.Generator().manual_seed(2)  # seed 2
    for D in (1, 2, 16, 64):
        x = torch.randn(3, D, dtype=torch.float64, generator=gen)
        assert torch.allclose(fwht(x), x @ torch.tensor(hadamard(D), dtype=torch.float64))
    assert padded_dim(7850) == 8192 and padded_dim(8192) == 8192 and padded_dim(1) == 1
    x = torch.randn(5, 7850, dtype=torch.float64, generator=gen)
    signs = random_signs(8192, gen, torch.float64)
    y = rotate(x, signs)
    assert torch.allclose(y.norm(dim=1), x.norm(dim=1))
    assert torch.allclose(unrotate(y, signs, 7850), x)
    # a spike is spread over every coordinate, within the l-infinity bound
    spike = torch.zeros(1, 7850, dtype=torch.float64)
    spike[0, 3] = 1.0
    c = coordinate_bound(norm=1.0, coordinates=8192, failure=1e-6)
    assert float(rotate(spike, signs).abs().max()) <= c
    assert c == pytest.approx(math.sqrt(2 * math.log(2 * 8192 / 1e-6) / 8192))
