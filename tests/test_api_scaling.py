"""otafl.api.scaling without click: the K grid, the curves, the slopes and the rows."""

from __future__ import annotations

import math

import pytest
import torch

from otafl.api.scaling import (THEORY_SLOPES, _fit, alignment_gain, fit_loglog_slope, log_users, scaling_curves,
                               scaling_grid)
from otafl.errors import OtaflInputError
from otafl.privacy.accountants import paper_round
from otafl.report.text import scaling_text


def test_fit_loglog_slope_recovers_a_power_law_and_skips_non_finite_points():
    x = [1.0, 10.0, 100.0, 1000.0]
    slope, intercept, used = fit_loglog_slope(x, [3 * v**-0.75 for v in x[:3]] + [math.inf])
    assert slope == pytest.approx(-0.75, abs=1e-12) and intercept == pytest.approx(math.log(3)) and used == 3
    assert math.isnan(fit_loglog_slope(x, [1.0, math.inf, -1.0, 0.0])[0])


def test_log_users_rounds_and_drops_repeats():
    assert log_users(100, 10000, 5) == [100, 316, 1000, 3162, 10000]
    assert log_users(1, 3, 10) == [1, 2, 3]


def test_curves_are_the_paper_bound_and_the_slopes_match_theory():
    users = log_users(1e2, 1e6, 41)
    out = scaling_curves(users=users, sigma2=10.0, accountants=["paper"])
    K = torch.tensor(users, dtype=torch.float64)
    kw = dict(users=K, noise_var=10.0, sensitivity=2.0, alignment_gain=1.0, n0=0.0, delta_l=1e-5)
    assert out["curves"]["paper"]["fixed_p"] == pytest.approx(
        paper_round(participation_prob=torch.full_like(K, 0.5), **kw).epsilon_central.tolist(), rel=1e-12)
    assert out["curves"]["paper"]["sqrt_p"] == pytest.approx(
        paper_round(participation_prob=5.0 / K.sqrt(), **kw).epsilon_central.tolist(), rel=1e-12)
    for scheme, theory in THEORY_SLOPES.items():
        fit = out["slopes"]["paper"][scheme]
        assert fit["points"] == 41 and fit["slope"] == pytest.approx(theory, abs=0.05)


def test_scaling_grid_rows_meta_and_text():
    out = scaling_grid(k_min=100, k_max=10000, points=9, accountants=["paper", "tight"])
    rows, meta = out["rows"], out["meta"]
    assert len(rows) == 2 * 2 * 9 and list(rows[0]) == ["users", "accountant", "scheme", "p", "epsilon_central"]
    assert meta["figure"] is None and set(meta["slopes"]) == {"paper", "tight"} and meta["theory"] == THEORY_SLOPES
    assert all(r["p"] == pytest.approx(5.0 / math.sqrt(r["users"])) for r in rows if r["scheme"] == "sqrt_p")
    fixed = [r["epsilon_central"] for r in rows if r["accountant"] == "paper" and r["scheme"] == "fixed_p"]
    assert fixed == out["curves"]["curves"]["paper"]["fixed_p"] and all(b < a for a, b in zip(fixed, fixed[1:]))
    lines = scaling_text(out).splitlines()
    assert lines[0].startswith("central leakage vs K = 100 ... 10000 (9 points)")
    assert lines[1].split() == ["accountant", "scheme", "fitted_slope", "theory_slope", "finite_points"]
    assert len(lines) == 2 + 4 and "fixed p = 0.5" in lines[2] and "p = 5 K^-1/2" in lines[3]


def test_half_range_slopes_of_a_power_law_equal_the_whole_range_slope():
    x = log_users(100, 10000, 9)
    fit = _fit(x, [2 * v**-0.6 for v in x])
    assert fit["k_mid"] == pytest.approx(1000)
    assert [fit["slope"], fit["slope_low"], fit["slope_high"]] == pytest.approx([-0.6] * 3, abs=1e-9)
    bent = _fit(x, [v**-0.5 if v <= 1000 else 1000**0.25 * v**-0.75 for v in x])  # steepens after the midpoint
    assert bent["slope_low"] == pytest.approx(-0.5) and bent["slope_high"] == pytest.approx(-0.75)


def test_exact_slope_on_a_small_range_is_finite_and_negative_for_fixed_p():
    out = scaling_curves(users=[100, 200, 400], accountants=["exact"], dim=7850)
    fit = out["slopes"]["exact"]["fixed_p"]
    assert fit["points"] == 3 and math.isfinite(fit["slope"]) and -1.5 < fit["slope"] < -0.2
    eps = out["curves"]["exact"]["fixed_p"]
    assert all(b < a for a, b in zip(eps, eps[1:])) and out["dim"] == 7850


def test_exact_gets_the_coarse_grid_and_progress_counts_every_point():
    calls = []
    out = scaling_grid(k_min=100, k_max=400, points=7, exact_points=3, accountants=["paper", "exact"],
                       progress=lambda done, total, label: calls.append((done, total, label)))
    users = out["meta"]["users_of"]
    assert users["paper"] == log_users(100, 400, 7) and users["exact"] == [100, 200, 400]
    assert set(users["exact"]) <= set(users["paper"]) and out["meta"]["exact_points"] == 3
    assert len(out["rows"]) == 2 * 7 + 2 * 3
    assert [c[0] for c in calls] == [0, 7, 14, 15, 16, 17, 18, 19, 20] and {c[1] for c in calls} == {20}
    assert calls[-1][2] == "exact sqrt_p K=400"


def test_channel_noise_enters_tight_but_not_paper():
    kw = dict(users=[100, 1000], accountants=["paper", "tight"], sigma2=10.0)
    quiet, noisy = scaling_curves(n0=0.0, **kw), scaling_curves(n0=1.0, snr_db=10.0, **kw)
    assert quiet["channel_noise_var"] == 0.0
    assert noisy["channel_noise_var"] == pytest.approx(1.0, rel=1e-3)  # ~ sigma2 / SNR = 10 / 10
    assert noisy["alignment_gain"] == pytest.approx(alignment_gain(snr_db=10.0, n0=1.0, clip=1.0, sigma2=10.0,
                                                                   dim=7850))
    assert noisy["curves"]["paper"] == quiet["curves"]["paper"]
    assert all(b < a for a, b in zip(quiet["curves"]["tight"]["fixed_p"], noisy["curves"]["tight"]["fixed_p"]))


@pytest.mark.parametrize("kw,needle", [
    ({"accountants": []}, "^no accountant given$"),
    ({"a": 20.0}, "a = 20.0"),
    ({"p": 0.0}, "p = 0.0"),
    ({"k_min": 0}, "k_min"),
    ({"k_max": 50}, "k_max"),
    ({"points": 1}, "points"),
    ({"delta_l": 2.0}, "delta_l"),
    ({"dim": 0}, "dim"),
    ({"n0": -1.0}, "n0"),
    ({"exact_points": 1}, "exact_points"),
    ({"snr_db": math.inf}, "snr_db"),
])
def test_bad_input_raises_an_input_error(kw, needle):
    with pytest.raises(OtaflInputError, match=needle):
        scaling_grid(**kw)
