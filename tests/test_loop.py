"""The FedSGD loop end to end on small problems."""

import math

import pytest
import torch

from otafl.config import load_spec
from otafl.fl.loop import run_experiment
from otafl.fl.grads import flatten, param_dict

SMALL = ["data.name=synthetic", "data.users=20", "data.batch_size=8", "channel.snr_db=10",
         "train.rounds=20", "train.eval_every=10", "privacy.accountants=['paper']"]


def _final_weights(overrides):
    """Train and return the flattened final weights (captured through the eval hook)."""
    spec = load_spec(None, overrides)
    captured = {}
    import otafl.fl.loop as loop

    orig = loop.evaluate

    def spy(model, x, y, batch=4096):
        captured["w"] = flatten(param_dict(model)).clone()
        return orig(model, x, y, batch)

    loop.evaluate = spy
    try:
        result = run_experiment(spec)
    finally:
        loop.evaluate = orig
    return captured["w"], result


def test_noiseless_ota_matches_ideal_fedsgd():
    # p = 1, sigma^2 = 0, N0 = 0: the aligned over-the-air sum is the exact gradient sum.
    base = SMALL + ["sampling.p=1.0", "transmit.sigma2=0.0", "channel.n0=0.0"]
    w_ota, r_ota = _final_weights(base + ["train.aggregation='ota'"])
    w_ideal, r_ideal = _final_weights(base + ["train.aggregation='ideal'"])
    assert r_ota.summary["rounds"] == 20
    assert torch.max(torch.abs(w_ota - w_ideal)).item() <= 1e-5
    # and the noise actually matters when switched on
    w_noisy, _ = _final_weights(SMALL + ["sampling.p=1.0", "transmit.sigma2=0.1"])
    assert torch.max(torch.abs(w_noisy - w_ideal)).item() > 1e-3


def test_same_seed_same_results_and_other_seed_differs():
    a = run_experiment(load_spec(None, SMALL + ["train.seed=3"]))
    b = run_experiment(load_spec(None, SMALL + ["train.seed=3"]))
    c = run_experiment(load_spec(None, SMALL + ["train.seed=4"]))
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}  # noqa: E731
    assert strip(a.summary) == strip(b.summary)
    assert a.rounds == b.rounds
    assert [r["participants"] for r in a.rounds] != [r["participants"] for r in c.rounds]


def test_power_budget_holds_in_every_round_of_a_run():
    r = run_experiment(load_spec(None, SMALL + ["channel.snr_db=[2, 10, 30]", "transmit.sigma2=[0.1, 0.05, 0.2]",
                                                "transmit.clip=0.5"]))
    ratios = [rec["max_power_ratio"] for rec in r.rounds if rec["participants"] > 0]
    assert ratios and max(ratios) <= 1.0 + 1e-12
    # the min alignment policy drives the weakest transmitter to (almost) its full budget
    assert max(ratios) > 0.05


def test_round_records_follow_sampling_and_channel_facts():
    r = run_experiment(load_spec(None, SMALL + ["sampling.p=0.5", "train.rounds=40"]))
    parts = torch.tensor([rec["participants"] for rec in r.rounds], dtype=torch.float64)
    assert all(rec["expected_participants"] == pytest.approx(10.0) for rec in r.rounds)
    # 40 rounds x 20 users x Bernoulli(0.5): mean within 4 standard errors of 10
    assert abs(parts.mean().item() - 10.0) < 4 * math.sqrt(20 * 0.25 / 40)
    for rec in r.rounds:
        if rec["participants"]:
            expected = 0.1 * rec["participants"] + 1.0 / rec["alignment_gain"] ** 2
            assert rec["effective_noise_var"] == pytest.approx(expected, rel=1e-9)


def test_bounds_only_run_trains_nothing_but_accounts():
    r = run_experiment(load_spec(None, SMALL), train=False)
    assert math.isnan(r.summary["final_test_accuracy"])
    assert math.isfinite(r.summary["paper_epsilon_central"])
    assert r.summary["paper_epsilon_central_total"] >= r.summary["paper_epsilon_central"]


def test_unknown_estimator_and_channel_aware_sampling_run():
    r = run_experiment(load_spec(None, SMALL + ["sampling.scheme='channel-aware'", "sampling.h_th=2.0",
                                                "estimator.kind='unknown'"]))
    mean_p = sum(rec["mean_p"] for rec in r.rounds) / len(r.rounds)
    assert 0.2 < mean_p < 0.7  # E[min(1, h/2)] with E[h^2] = 1
    assert 0.0 <= r.summary["final_test_accuracy"] <= 1.0


def test_truncation_policy_silences_weak_users():
    r = run_experiment(load_spec(None, SMALL + ["sampling.p=1.0", "transmit.alignment='truncate'",
                                                "transmit.threshold=1.0"]))
    # every user flips heads (p = 1) but only those with h >= 1 transmit
    assert all(rec["participants"] < 20 for rec in r.rounds)
    assert all(rec["expected_participants"] == rec["participants"] for rec in r.rounds)


def test_ideal_single_layer_learns_embedded_mnist():
    spec = load_spec(None, ["train.aggregation='ideal'", "sampling.p=1.0", "data.users=50",
                            "train.rounds=150", "train.eval_every=150", "train.lr=0.01",
                            "privacy.accountants=[]"])
    r = run_experiment(spec)
    assert r.summary["final_test_accuracy"] >= 0.85


def test_per_user_superposition_matches_aggregate_without_noise_and_differs_with_it():
    quiet = SMALL + ["sampling.p=1.0", "transmit.sigma2=0.0", "channel.n0=0.0"]
    w_agg, _ = _final_weights(quiet + ["train.superposition='aggregate'"])
    w_per, _ = _final_weights(quiet + ["train.superposition='per-user'"])
    assert torch.max(torch.abs(w_agg - w_per)).item() <= 1e-5
    r = run_experiment(load_spec(None, SMALL + ["train.superposition='per-user'"]))
    assert max(rec["max_power_ratio"] for rec in r.rounds) <= 1.0 + 1e-12
