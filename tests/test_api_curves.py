"""otafl.api.curves without click: the accountants figure's data at the paper's preset."""

from __future__ import annotations

import math

import pytest
import torch

from otafl.api.curves import DEFAULT_P, PRESET, accountant_curves
from otafl.api.defaults import PAPER_DIM
from otafl.errors import OtaflInputError
from otafl.privacy.accountants import paper_round, tight_round


def test_defaults_are_the_papers_preset():
    assert PRESET == dict(users=200, sigma2=0.1, clip=1.0, delta_l=1e-5, n0=0.0, dim=PAPER_DIM)
    assert DEFAULT_P[0] == 0.05 and DEFAULT_P[-1] == 1.0 and len(DEFAULT_P) == 20


def test_curves_match_the_accountants_and_exact_is_the_smallest():
    out = accountant_curves(p=[0.1, 0.5, 0.9])
    assert out["p"] == [0.1, 0.5, 0.9] and out["dim"] == PAPER_DIM and out["users"] == 200
    kw = dict(participation_prob=torch.tensor(out["p"], dtype=torch.float64), users=200, noise_var=0.1,
              alignment_gain=1.0, n0=0.0, sensitivity=2.0, delta_l=1e-5)
    assert out["paper"]["epsilon"] == pytest.approx(paper_round(**kw).epsilon_central.tolist(), rel=1e-12)
    assert out["tight"]["epsilon"] == pytest.approx(tight_round(**kw).epsilon_central.tolist(), rel=1e-12)
    assert out["paper_classic_valid"] == [False, False, False]
    # printed numbers of the figure at the paper's preset (p = 0.1, 0.5, 0.9)
    assert [f"{v:.4g}" for v in out["paper"]["epsilon"]] == ["1171", "3.128", "2.447"]
    assert [f"{v:.4g}" for v in out["tight"]["epsilon"]] == ["6.252", "2.523", "1.903"]
    assert [f"{v:.4g}" for v in out["exact"]["epsilon"]] == ["0.8856", "1.194", "1.639"]
    for name in ("paper", "tight", "exact"):
        assert len(out[name]["delta"]) == 3 and all(0 < d < 1 for d in out[name]["delta"])
    assert all(math.isfinite(v) for v in out["exact"]["epsilon"])


def test_bad_input_raises_an_input_error():
    with pytest.raises(OtaflInputError, match="p = 1.5"):
        accountant_curves(p=[0.5, 1.5])
    with pytest.raises(OtaflInputError, match="dim"):
        accountant_curves(dim=0)


def test_progress_counts_the_points_of_exact():
    calls = []
    accountant_curves(p=[0.5, 0.9], users=30, dim=20, progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 2) and calls[-1] == (2, 2)
