"""Local DP-SGD steps (DP-FedAvg, DP-SCAFFOLD over the air): otafl.fl.local, the loop dispatch, the spec keys."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from otafl.cli.main import cli
from otafl.config import load_spec
from otafl.errors import OtaflInputError
from otafl.estimate import ESTIMATORS
from otafl.fl.grads import StackedGradients
from otafl.fl.local import (
    ALGORITHMS,
    LocalSteps,
    clipped_gradient_sums,
    local_updates,
    local_updates_loop,
    update_norm_bound,
)
from otafl.fl.loop import run_experiment
from otafl.fl.round import AGGREGATORS
from otafl.models import make_model, num_parameters
from otafl.transmit import ChannelSetup

QUICK = ["data.users=40", "train.rounds=4", "train.eval_every=2", "sampling.p=0.6"]


def small_problem(n=5, max_d=12, features=6, classes=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n * max_d, features, generator=gen)
    y = torch.randint(0, classes, (n * max_d,), generator=gen)
    index = torch.arange(n * max_d).view(n, max_d)
    counts = torch.randint(4, max_d + 1, (n,), generator=gen)
    return x, y, index, counts, gen


@pytest.mark.parametrize("name", ["single-layer", "two-layer"])
def test_ghost_clipped_sums_equal_vmap_per_example_clipping(name):
    x, y, index, counts, gen = small_problem()
    model = make_model(name, 6, 3, hidden=7, generator=gen)
    d = num_parameters(model)
    weights = torch.randn(5, d, generator=gen) * 0.3
    xb, yb = x[index], y[index]
    mask = torch.rand(5, 12, generator=gen) < 0.6
    for clip in (0.05, 1.0, 100.0):  # mostly clipped, mixed, never clipped
        ghost, loss_g = clipped_gradient_sums(model, weights, xb, yb, mask, clip, method="ghost")
        ref, loss_v = clipped_gradient_sums(model, weights, xb, yb, mask, clip, method="vmap")
        torch.testing.assert_close(ghost, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss_g, loss_v, rtol=1e-5, atol=1e-6)
    # every per-example gradient is clipped to C: a sum of b of them has norm <= b C
    sums, _ = clipped_gradient_sums(model, weights, xb, yb, mask, 0.05)
    assert (torch.linalg.vector_norm(sums, dim=1) <= 0.05 * mask.sum(1) + 1e-6).all()


def test_batched_local_steps_equal_the_per_user_loop():
    x, y, index, counts, gen = small_problem()
    model = make_model("two-layer", 6, 3, hidden=7, generator=gen)
    d = num_parameters(model)
    start = torch.randn(d, generator=gen) * 0.1
    draws = [(torch.rand(5, 12, generator=gen) < 0.5, torch.randn(5, d, generator=gen)) for _ in range(4)]
    correction = torch.randn(5, d, generator=gen) * 0.01
    kw = dict(local_lr=0.3, record_sampling=0.5, record_clip=0.7, step_noise=0.8, correction=correction)
    u, _ = local_updates(model, start, x, y, index, counts, iter(draws), **kw)
    ref = local_updates_loop(model, start, x, y, index, counts, draws, **kw)
    torch.testing.assert_close(u, ref, rtol=1e-4, atol=1e-6)
    # FedAvg with S steps: u_k is the user's displacement y_S - w
    u1, _ = local_updates(model, start, x, y, index, counts, iter(draws[:1]), local_lr=0.3, record_sampling=0.5,
                          record_clip=0.7, step_noise=0.0)
    assert u1.shape == (5, d) and torch.isfinite(u1).all()


# ----------------------------------------------------------------- SCAFFOLD vs FedAvg on a quadratic


class Point(nn.Module):
    """d = 2 parameters, no forward: the quadratic test supplies its own gradients."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, dtype=torch.float64))


def quadratic_sums(model, weights, x, y, mask, clip, method="auto"):
    """Per-example loss h_k / 2 ||w - a_j||^2 with x_j = [a_j, h_k]: gradient h_k (w - a_j), clipped to C."""
    a, h = x[..., :2], x[..., 2:]
    g = h * (weights[:, None, :] - a)
    g = g * (clip / torch.linalg.vector_norm(g, dim=-1).clamp(min=clip))[..., None] * mask[..., None]
    loss = (0.5 * h[..., 0] * (weights[:, None, :] - a).square().sum(-1) * mask).sum(1)
    return g.sum(1), loss


def run_quadratic(algorithm, rounds=300, steps=10):
    """4 users, 3 records each, with curvatures h_k in {0.2, 1, 1, 3}: the users' optima differ and so do
    their curvatures, which is what makes FedAvg drift. Full participation, no noise, no clipping."""
    torch.manual_seed(0)
    curv = torch.tensor([0.2, 1.0, 1.0, 3.0], dtype=torch.float64)
    centres = torch.tensor([[3.0, 0.0], [0.0, 2.0], [-1.0, -1.0], [0.5, -2.0]], dtype=torch.float64)
    offsets = torch.tensor([[0.1, 0.0], [-0.1, 0.1], [0.0, -0.1]], dtype=torch.float64)
    a = centres[:, None, :] + offsets[None]  # [4, 3, 2]
    x = torch.cat([a, curv[:, None, None].expand(4, 3, 1)], dim=-1).reshape(12, 3)
    index = torch.arange(12).view(4, 3)
    counts = torch.full((4,), 3)
    optimum = (curv[:, None] * a.mean(1)).sum(0) / curv.sum()
    model = Point()
    ls = LocalSteps(algorithm=algorithm, model=model, x_train=x, y_train=torch.zeros(12, dtype=torch.int64),
                    index=index, counts=counts, local_steps=steps, local_lr=0.3, server_lr=1.0, record_sampling=1.0,
                    record_clip=1e6, step_noise=0.0, transmit_clip=1.0, warm_start=False,
                    mask_generator=torch.Generator().manual_seed(1), noise_generator=torch.Generator().manual_seed(2),
                    gradient_sums=quadratic_sums)
    setup = ChannelSetup(power=torch.ones(4, dtype=torch.float64), noise_var=torch.zeros(4, dtype=torch.float64),
                         n0=0.0, clip=1.0, dim=2)
    active = torch.ones(4, dtype=torch.bool)
    for _ in range(rounds):
        grads, _, _ = ls.gradients(active)
        agg = AGGREGATORS["ideal"](grads, torch.ones(4, dtype=torch.float64), active, setup, torch.Generator())
        ls.apply(ESTIMATORS["known"](agg.aligned_sum, participants=4), participants=4, mu=4.0, unknown=False)
    return ls.weights, optimum


def test_scaffold_reaches_the_global_optimum_where_fedavg_drifts():
    w_scaffold, optimum = run_quadratic("scaffold")
    w_fedavg, _ = run_quadratic("fedavg")
    assert float(torch.linalg.vector_norm(w_scaffold - optimum)) < 1e-6
    # FedAvg's fixed point weights user k by 1 - (1 - eta h_k)^S instead of h_k: a clear bias
    assert float(torch.linalg.vector_norm(w_fedavg - optimum)) > 0.2
    # one local step: FedAvg is gradient descent on the global loss and has no drift
    w_one, _ = run_quadratic("fedavg", rounds=800, steps=1)
    assert float(torch.linalg.vector_norm(w_one - optimum)) < 1e-6


# ----------------------------------------------------------------- transmission: power, estimator


def test_update_norm_bound_holds_and_the_power_budget_in_every_transmission():
    spec_over = QUICK + ["train.algorithm='scaffold'", "train.local_steps=3", "train.scaffold_warm_start=true",
                         "transmit.step_noise=2.0", "privacy.accountants=['steps']"]
    result = run_experiment(load_spec("experiments/quickstart.toml", spec_over))
    ratios = [r["max_power_ratio"] for r in result.rounds] + [result.summary["warm_start_power_ratio"]]
    assert all(0 < r <= 1.0 + 1e-9 for r in ratios), ratios
    # with sigma = 2 the noise dominates the update norm: the bound B is then nearly met, never exceeded
    assert all(r["clipped_fraction"] == 0.0 for r in result.rounds)
    assert result.summary["warm_start_participants"] == 40
    with pytest.raises(OtaflInputError):
        LocalSteps(algorithm="fedsgd", model=Point(), x_train=torch.zeros(1, 3), y_train=torch.zeros(1),
                   index=torch.zeros(1, 1, dtype=torch.int64), counts=torch.ones(1, dtype=torch.int64), local_steps=1,
                   local_lr=0.1, server_lr=1.0, record_sampling=1.0, record_clip=1.0, step_noise=1.0,
                   transmit_clip=1.0, warm_start=False, mask_generator=torch.Generator(),
                   noise_generator=torch.Generator())


def test_update_norm_bound_is_exceeded_rarely():
    """B = eta (S C / q + sigma C sqrt(S) (sqrt(d) + t) / (q D)): the noise part alone at the bound's
    failure 1e-12 is never reached in 2000 draws (seed 0), and the bound grows with sqrt(d)."""
    gen = torch.Generator().manual_seed(0)
    S, q, C, sigma, D, d = 4, 0.5, 1.0, 1.5, 10, 500
    B = update_norm_bound(local_lr=1.0, local_steps=S, record_sampling=q, record_clip=C, step_noise=sigma,
                          min_records=D, dim=d)
    noise = torch.randn(2000, S, d, generator=gen).sum(1) * sigma * C / (q * D)
    assert float(torch.linalg.vector_norm(noise, dim=1).max()) + S * C / q < B
    assert update_norm_bound(local_lr=1.0, local_steps=S, record_sampling=q, record_clip=C, step_noise=0.0,
                             min_records=D, dim=d) == S * C / q


@pytest.mark.parametrize("kind", ["known", "unknown"])
def test_the_server_estimate_of_the_mean_update_is_unbiased(kind):
    """Uniform p = 0.5, K = 12 fixed updates u_k (d = 3) sent as (L / B) u_k over the OTA MAC with artificial
    and receiver noise; the server's B / L * estimate averaged over 6000 rounds (seed 0) is the mean update
    (``known``: given |K_t| > 0), within 5 standard errors."""
    gen = torch.Generator().manual_seed(0)
    K, d, B, L = 12, 3, 4.0, 1.0
    u = torch.randn(K, d, generator=gen, dtype=torch.float64)
    u = u * (0.9 * B / torch.linalg.vector_norm(u, dim=1, keepdim=True)).clamp(max=1.0)  # inside the bound
    setup = ChannelSetup(power=torch.full((K,), 50.0, dtype=torch.float64),
                         noise_var=torch.full((K,), 0.05, dtype=torch.float64), n0=1.0, clip=L, dim=d)
    h = torch.ones(K, dtype=torch.float64)
    estimates = []
    for _ in range(6000):
        active = torch.rand(K, generator=gen, dtype=torch.float64) < 0.5
        grads = StackedGradients(u[active] * (L / B))
        agg = AGGREGATORS["ota"](grads, h, active, setup, gen)
        est = ESTIMATORS[kind](agg.aligned_sum, participants=agg.participants, mu=0.5 * K)
        if est is not None:
            estimates.append(est * (B / L))
    est = torch.stack(estimates)
    se = est.std(0) / math.sqrt(est.shape[0])
    assert (torch.abs(est.mean(0) - u.mean(0)) < 5 * se).all(), (est.mean(0), u.mean(0), se)


# ----------------------------------------------------------------- spec keys and the loop


def test_fedsgd_with_explicit_defaults_reproduces_the_default_run_exactly():
    base = run_experiment(load_spec("experiments/quickstart.toml", QUICK))
    explicit = run_experiment(load_spec("experiments/quickstart.toml", QUICK + [
        "train.algorithm='fedsgd'", "train.local_steps=1", "transmit.step_noise=0.0", "train.local_lr=0.5",
        "train.record_sampling=1.0", "transmit.record_clip=3.0"]))
    strip = lambda rs: [{k: v for k, v in r.items()} for r in rs]  # noqa: E731
    assert json.dumps(strip(base.rounds)) == json.dumps(strip(explicit.rounds))
    assert base.summary["final_test_accuracy"] == explicit.summary["final_test_accuracy"]
    assert "algorithm" not in base.summary and "steps_epsilon_central_total" not in base.summary


def test_local_steps_run_carries_the_steps_accountant_automatically():
    spec = load_spec("experiments/quickstart.toml", QUICK + ["train.algorithm='fedavg'", "train.local_steps=2"])
    assert spec.privacy.accountants == ["exact", "paper", "tight", "steps"]
    result = run_experiment(spec)
    s = result.summary
    assert s["algorithm"] == "fedavg" and s["local_steps"] == 2
    assert s["steps_composition"] == "pld" and s["steps_defined"] is True
    assert 0 < s["steps_epsilon_central"] <= s["steps_epsilon_central_total"] < math.inf
    assert s["steps_epsilon_central_total"] < s["steps_epsilon_local_total"]  # the sum's noise helps
    assert len(result.rounds) == 4 and all("steps_epsilon_central" in r for r in result.rounds)
    assert math.isfinite(s["final_test_accuracy"])
    # bounds only: the same privacy without training
    dry = run_experiment(spec, train=False)
    assert dry.summary["steps_epsilon_central_total"] == s["steps_epsilon_central_total"]


@pytest.mark.parametrize("override, message", [
    ("train.local_steps=0", "train.local_steps = 0 is outside the allowed range [1, 100000] (integers)"),
    ("train.record_sampling=1.5", "train.record_sampling = 1.5 is outside the allowed range (0, 1]"),
    ("train.record_sampling=0", "train.record_sampling = 0.0 is outside the allowed range (0, 1]"),
    ("transmit.step_noise=-0.5", "transmit.step_noise = -0.5 is outside the allowed range 0 or [0.001, 1e+30]"),
    ("transmit.record_clip=0", "transmit.record_clip = 0.0 is outside the allowed range (0, inf)"),
    ("train.algorithm='fedprox'", "train.algorithm = 'fedprox' is not one of: fedavg, fedsgd, scaffold"),
])
def test_bad_local_steps_input_is_one_line_and_exit_2(tmp_path, override, message):
    sets = ["--set", "train.algorithm='fedavg'"] if "algorithm" not in override else []
    res = CliRunner().invoke(cli, ["run", "experiments/quickstart.toml", "--out", str(tmp_path / "out"),
                                   *sets, "--set", override])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "out").exists()


def test_spec_rules_of_the_local_steps_keys():
    with pytest.raises(OtaflInputError, match="fedsgd takes one step"):
        load_spec(None, ["train.local_steps=5"])
    with pytest.raises(OtaflInputError, match="scaffold_warm_start"):
        load_spec(None, ["train.algorithm='fedavg'", "train.scaffold_warm_start=true"])
    with pytest.raises(OtaflInputError, match="server_lr"):
        load_spec(None, ["train.server_lr=0.5"])
    with pytest.raises(OtaflInputError, match="weight_decay"):
        load_spec(None, ["train.algorithm='scaffold'", "train.weight_decay=0.01"])
    assert sorted(ALGORITHMS) == ["fedavg", "fedsgd", "scaffold"]
    spec = load_spec(None, ["train.algorithm='scaffold'", "privacy.accountants=['steps', 'tight']"])
    assert spec.privacy.accountants == ["steps", "tight"]  # listed already: left as written


SWEEP = """
[data]
name = "synthetic"
users = 12
split = "shards"
[channel]
snr_db = [0.0, 10.0, 20.0]
[transmit]
sigma2 = 0.0
[train]
rounds = 3
eval_every = 3
algorithm = "fedavg"
local_steps = 2
[privacy]
accountants = ["steps"]
[sweep]
seeds = [0]
[sweep.axes]
"sampling.p" = [0.5, 1.0]
[[sweep.points]]
"train.algorithm" = "scaffold"
"sampling.p" = 1.0
"""


def test_a_local_steps_sweep_plots_accuracy_against_the_total_central_epsilon(tmp_path):
    (tmp_path / "s.toml").write_text(SWEEP)
    db, out = tmp_path / "r.sqlite", tmp_path / "t.png"
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.toml"), "--out", str(db), "--workers", "0", "--quiet"])
    assert res.exit_code == 0, res.output
    from otafl.report.plots import make_figure
    from otafl.sweep.store import read_store

    with read_store(db) as store:
        runs = store.runs("done")
        assert len(runs) == 3 and all(r.summary["steps_epsilon_central_total"] > 0 for r in runs)
        fig = make_figure(store, "tradeoff", accountant="steps", epsilon="total",
                          group_by=["train.algorithm", "train.local_steps"], facet="none")
        ax = fig.axes[0]
        assert "total over T = 3 rounds" in (ax.get_xlabel() + fig.get_supxlabel())
        xs = {round(float(x), 9) for line in ax.get_lines() for x in line.get_xdata()}  # points and error caps
        assert xs == {round(r.summary["steps_epsilon_central_total"], 9) for r in runs}
    res = CliRunner().invoke(cli, ["plot", str(db), "--kind", "tradeoff", "--accountant", "steps", "--epsilon",
                                   "total", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = CliRunner().invoke(cli, ["plot", str(db), "--kind", "tradeoff", "--epsilon", "sum", "--out", str(out)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1


def test_fedavg_rounds_credit_the_co_users_last_step_and_transmit_noise_and_scaffold_neither():
    """docs/privacy/steps.md#steps: FedAvg's co-users start every round from the public model, so their
    last-step noise is fresh (share D_min / D_max); the artificial and channel noise reach the release
    over the air (factor (B / L) q D_min / (eta_l C)). SCAFFOLD's c_k carry the co-users' noise on (no
    share), and its public c holds the credited transmit noise that c - c_k reveals later (no factor)."""
    from otafl.fl.loop import run_experiment as run

    sets = QUICK + ["train.local_steps=3", "train.rounds=2", "privacy.accountants=['steps', 'steps-sumdom']"]
    fedavg = run(load_spec("experiments/quickstart.toml", sets + ["train.algorithm='fedavg'"]), train=False)
    scaffold = run(load_spec("experiments/quickstart.toml", sets + ["train.algorithm='scaffold'"]), train=False)
    f = fedavg.facts[-1]
    assert 0 < f.co_user_noise <= 1 and f.transmit_to_record > 0
    assert scaffold.facts[-1].co_user_noise == 0.0 and scaffold.facts[-1].transmit_to_record == 0.0
    for r in (fedavg, scaffold):
        s = r.summary
        assert s["steps_classic_valid"] is True and s["steps-sumdom_classic_valid"] is False
        assert s["steps_epsilon_central_total"] >= s["steps-sumdom_epsilon_central_total"]
    # the transmit noise (in record units (B / L) q D_min / (eta_l C) times larger) drowns the last step
    assert fedavg.summary["steps_epsilon_central"] < fedavg.summary["steps_epsilon_local_max"]
    ideal = {a: run(load_spec("experiments/quickstart.toml", sets + [f"train.algorithm='{a}'",
                                                                     "train.aggregation='ideal'"]), train=False)
             for a in ("fedavg", "scaffold")}
    assert ideal["fedavg"].facts[-1].transmit_to_record == 0.0  # no artificial or channel noise reaches that release
    assert (ideal["scaffold"].summary["steps_epsilon_central_total"]
            > ideal["fedavg"].summary["steps_epsilon_central_total"])
