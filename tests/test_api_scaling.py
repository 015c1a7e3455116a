"""otafl.api.scaling without click: the K grid, the curves, the slopes and the rows."""

from __future__ import annotations

import math

import pytest
import torch

from otafl.api.scaling import THEORY_SLOPES, fit_loglog_slope, log_users, scaling_curves, scaling_grid
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


@pytest.mark.parametrize("kw,needle", [
    ({"accountants": []}, "^no accountant given$"),
    ({"a": 20.0}, "a = 20.0"),
    ({"p": 0.0}, "p = 0.0"),
    ({"k_min": 0}, "k_min"),
    ({"k_max": 50}, "k_max"),
    ({"points": 1}, "points"),
    ({"delta_l": 2.0}, "delta_l"),
])
def test_bad_input_raises_an_input_error(kw, needle):
    with pytest.raises(OtaflInputError, match=needle):
        scaling_grid(**kw)
