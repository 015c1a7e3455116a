"""Liu & Simeone's closed form (otafl/privacy/analysis/liu_simeone.py) and their synthetic setting
(channels/liu-simeone.toml, experiments/liu-simeone.toml; docs/guides/power-control.md#liu-simeone)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import lambertw
from scipy.stats import norm

from otafl.config import load_spec
from otafl.privacy.analysis.gaussian import analytic_gaussian_epsilon
from otafl.privacy.analysis.liu_simeone import closed_form_budget, closed_form_c, closed_form_epsilon


@pytest.mark.parametrize("delta", [1e-1, 1e-2, 1e-5, 1e-10])
def test_c_solves_its_equation_and_matches_their_lambert_w_expression(delta):
    c = closed_form_c(delta)
    assert math.sqrt(math.pi) * c * math.exp(c * c) == pytest.approx(1 / delta, rel=1e-12)
    w = float(np.real(lambertw(2.0 / (math.pi * delta ** 2))))  # their code's form of the same C
    assert c == pytest.approx(math.exp(-w / 2) / (delta * math.sqrt(math.pi)), rel=1e-10)


@pytest.mark.parametrize("delta", [1e-2, 1e-5])
@pytest.mark.parametrize("noise", [[0.5], [4.0] * 30, [100.0, 1.0, 3.0]])
def test_the_closed_form_is_an_upper_bound_on_the_composed_gaussians(delta, noise):
    """The T rounds' loss is N(R, 2R): its tail beyond the closed form's eps is at most delta / 2."""
    eps = closed_form_epsilon(noise, 2.0, delta)
    r = sum(4.0 / (2 * x) for x in noise)
    assert norm.sf((eps - r) / math.sqrt(2 * r)) <= delta / 2 * (1 + 1e-9)
    mu = math.sqrt(sum(4.0 / x for x in noise))
    assert eps >= float(analytic_gaussian_epsilon(sensitivity=mu, noise_std=1.0, delta=delta))


def test_the_budget_is_the_inverse_of_the_closed_form():
    for eps in (0.5, 8.0, 100.0):
        r = closed_form_budget(eps, 0.01)
        x = 4.0 / (2 * r)  # one round of sensitivity 2 with that R
        assert closed_form_epsilon([x], 2.0, 0.01) == pytest.approx(eps, rel=1e-12)
    assert closed_form_epsilon([0.0, 1.0], 2.0, 0.01) == math.inf


def test_their_setting_exact_meets_the_target_is_the_gaussian_truth_and_beats_the_closed_form():
    from otafl.api.liu_simeone import closed_form_rows

    spec = load_spec("experiments/liu-simeone.toml")
    assert (spec.data.users, spec.train.rounds, spec.channel.n0, spec.channel.rician_k) == (10, 30, 1.0, 10.0)
    assert spec.channel.fading == "static" and spec.privacy.delta_total == 0.01 and spec.transmit.sigma2 == 0.0
    rows = closed_form_rows(spec, targets=[1.0, 10.0])
    full, one, ten = rows
    assert full["target"] is None and full["exact"] > 1e3  # 30 dB leaves no privacy at full power
    for row, target in ((one, 1.0), (ten, 10.0)):
        assert 0.98 * target <= row["exact"] <= target
        assert row["exact"] == pytest.approx(row["gaussian"], rel=5e-3)  # the mechanism is Gaussian here
        assert row["closed_form"] > row["exact"] and row["noise_ratio"] > 1 and not row["counts_others"]
    assert one["ratio"] > ten["ratio"] > 1.1
