"""Time one FedSGD round against its compute floor and against other per-user gradient methods.

Paper preset (experiments/paper-mnist.toml): K = 200 users, embedded MNIST, uniform p = 1 so
every user computes, minibatch 32 per user, the paper's three-group channel, sigma^2 = 0.1,
L = 1, Adam; single-layer and two-layer (hidden 100) models. Per model, the median time
per round of

    (a) round   -- the project's round: user_gradients (ghost norms + book-kept clipped sum,
                   the first layer's norms from the feature sketch InputSketch, built once per
                   run and reported apart as ``input_sketch_once_s_*``), clip, transmit, MAC,
                   estimate, Adam update;
    (b) loop    -- a per-user autograd loop (K backward passes, :func:`per_user_loop_gradients`,
                   the reference), then the same round;
    (c) opacus  -- Opacus ``GradSampleModule`` per-sample gradients summed per user, then
                   the same round;
    (d) vmap    -- ``torch.func`` vmap per-user gradients, then the same round;
    (e) floor   -- one forward + backward over all K b = 6,400 samples, no per-user
                   separation and nothing else;
    (f) dg_*    -- the same round with ``train.aggregation = "digital"`` (gaussian, skellam,
                   pbm, ddg; defaults of ``[digital]``, PBM at 8 bits as in the comparison):
                   per-user gradients materialised (clipped, signed) block by block, rotated by
                   the batched fast Walsh-Hadamard transform, quantised and privatised (one coin
                   per user and coordinate), summed mod 2^bits, decoded; reported as
                   ``digital_over_ota_*`` (dg / round), single-layer only unless
                   ``--digital-models`` says otherwise.

Every method starts from the same gathered minibatch x [K, b, F] (a fresh one per repeat;
the gather is not timed) and runs on its own copy of the model and optimizer. Repeats are
interleaved: each repeat times every method on the same minibatch, the cheap ones (round,
vmap, floor) ``--inner`` times; medians are reported. All five process the full K b = 6,400
rows. (The training loop additionally drops minibatch columns that are padding for every
user -- on the embedded subset each user holds D_k = 20 < b = 32 samples, so 12 of the 32
columns -- which speeds every method up alike and is left out here so that the floor is
all 6,400 samples of K = 200 users x b = 32.) ``peak_rss_mib`` is the peak resident memory of a
separate process running a short two-layer paper-preset training (``otafl run``).

Local steps (``train.algorithm = "fedavg"``, S = ``--local-steps`` = 5, single-layer, p = 1 so all
K = 200 users run): the batched round (:func:`otafl.fl.local.local_updates`: every participant's
per-example clipped gradients in one forward and backward per step, then transmit, MAC, estimate,
server step) against a per-user loop (:func:`otafl.fl.local.local_updates_loop`: each user's S
steps with ``torch.func.vmap(grad)`` over its own minibatch, then the same round), on the same
Poisson masks and noise (drawn before timing): ``speedup_vs_loop_local_steps``.

Large K (``--large-k``, default 200,1000,10000; '' skips it): the training round against its
floor at K users on a 330,000-image MNIST-format set, one thread (``bench_round_large_k.py``,
whose docstring says what is timed): ``overhead_vs_floor_k{K}``, ``overhead_nosketch_vs_floor_k{K}``
and the raw medians, ``large_k_load_s``.

    python benchmarks/bench_round.py                # table
    python benchmarks/bench_round.py --json         # JSON (keys documented in README)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from otafl.config import load_spec
from otafl.data import gather_rows, sample_minibatches
from otafl.estimate import estimate_known
from otafl.fl.sketch import InputSketch
from otafl.fl.grads import (
    StackedGradients,
    UserGradients,
    per_user_gradients,
    supports_ghost,
    user_gradients,
)
from otafl.device import DEVICES, resolve_device
from otafl.fl.local import build_local_steps, local_updates, local_updates_loop
from otafl.fl.optim import bind_flat_grad, make_optimizer
from otafl.fl.digital import build_digital, digital_aggregate
from otafl.fl.round import AGGREGATORS
from otafl.setup import build_run

REPO = Path(__file__).resolve().parent.parent
PAPER_SPEC = REPO / "experiments" / "paper-mnist.toml"
PRESET = ["sampling.p=1.0", "data.batch_size=32"]
MODELS = {"single": ["model.name='single-layer'"], "two": ["model.name='two-layer'", "model.hidden=100"]}
METHODS = ("round", "loop", "opacus", "vmap", "floor")
DIGITAL_METHODS = ("dg_gaussian", "dg_skellam", "dg_pbm", "dg_ddg")
DIGITAL = {"dg_gaussian": ["digital.mechanism='gaussian'"], "dg_skellam": ["digital.mechanism='skellam'"],
           "dg_pbm": ["digital.mechanism='pbm'", "digital.bits=8"],  # PBM as in experiments/ota-vs-digital
           "dg_ddg": ["digital.mechanism='ddg'"]}


# ---------------------------------------------------------------- per-user gradient methods


def per_user_loop_gradients(model: nn.Module, x: Tensor, y: Tensor, weight: Tensor, *,
                            weight_decay: float = 0.0) -> tuple[Tensor, Tensor]:
    """Reference: one autograd backward pass per user (the textbook way).

    g_k = grad_w [ sum_j weight[k, j] CE(f_w(x[k, j]), y[k, j]) + (Omega / 2) ||w||^2 ].

    x [K, b, F], y [K, b] int64, weight [K, b]  ->  grads [K, d], losses [K] (no regulariser).
    The model's ``.grad`` fields are overwritten.
    """
    params = [p for p in model.parameters()]
    grads, losses = [], []
    for k in range(x.shape[0]):
        ce = (F.cross_entropy(model(x[k]), y[k], reduction="none") * weight[k]).sum()
        total = ce + 0.5 * weight_decay * sum((p * p).sum() for p in params) if weight_decay else ce
        g = torch.autograd.grad(total, params)
        grads.append(torch.cat([t.reshape(-1) for t in g]))
        losses.append(ce.detach())
    return torch.stack(grads), torch.stack(losses)


def opacus_user_gradients(gsm, x: Tensor, y: Tensor, weight: Tensor, *, weight_decay: float = 0.0,
                          users_per_chunk: int = 25) -> tuple[Tensor, Tensor]:
    """Opacus per-sample gradients (``GradSampleModule``), summed per user.

    Users are processed ``users_per_chunk`` at a time so the [chunk * b, d] per-sample tensor
    stays small (chunking only helps Opacus). Shapes as in :func:`per_user_loop_gradients`.
    """
    params = [p for p in gsm.parameters()]
    K, b = y.shape
    grads, losses = [], []
    for start in range(0, K, users_per_chunk):
        xs, ys, ws = x[start : start + users_per_chunk], y[start : start + users_per_chunk], \
            weight[start : start + users_per_chunk]
        n = ys.shape[0]
        gsm.zero_grad(set_to_none=False)  # keeps .grad bound to the flat buffer (bind_flat_grad)
        ce = F.cross_entropy(gsm(xs.reshape(n * b, -1)), ys.reshape(-1), reduction="none") * ws.reshape(-1)
        ce.sum().backward()
        per_user = torch.cat([p.grad_sample.reshape(n, b, -1).sum(dim=1) for p in params], dim=1)
        grads.append(per_user)
        losses.append(ce.detach().view(n, b).sum(dim=1))
        for p in params:
            p.grad_sample = None
    grads = torch.cat(grads)
    if weight_decay:
        grads = grads + weight_decay * torch.cat([p.detach().reshape(-1) for p in params])
    return grads, torch.cat(losses)


# ---------------------------------------------------------------- the round around them


class RoundBench:
    """One model of the paper preset: data, channel, and a model + Adam per method."""

    def __init__(self, model_key: str, device: torch.device, seed: int = 0):
        spec = load_spec(PAPER_SPEC, PRESET + MODELS[model_key] + [f"train.seed={seed}"])
        self.spec = spec
        run = build_run(spec, device=device)  # the loop's own setup: data, split, model, channel
        self.device = device
        self.gens = run.generators
        self.x_train, self.y_train = run.data.x_train.to(device), run.data.y_train.to(device)
        self.split = run.split
        base = run.model
        self.setup = run.channel.setup
        self.fading, self.gain = run.channel.fading, run.channel.large_scale_gain
        self.active = torch.ones(spec.data.users, dtype=torch.bool, device=device)  # p = 1
        self.aggregate = AGGREGATORS[spec.train.aggregation]
        self.weight_decay = spec.train.weight_decay
        self.models, self.opts, self.flat_grads = {}, {}, {}
        self.digital = {m: build_digital(load_spec(PAPER_SPEC, PRESET + MODELS[model_key] + DIGITAL[m]),
                                         dim=run.dim, power=self.setup.power, n0=self.setup.n0)
                        for m in DIGITAL_METHODS}
        for m in METHODS + DIGITAL_METHODS:
            model = copy.deepcopy(base)
            self.models[m] = model
            self.opts[m] = make_optimizer("adam", model.parameters(), spec.train.lr)
            if m != "floor":  # the floor's backward writes its own .grad
                self.flat_grads[m] = bind_flat_grad(list(model.parameters()))
        from opacus import GradSampleModule

        # Opacus' hooks warn that the input needs no gradient (the first layer's input is data)
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        self.gsm = GradSampleModule(self.models["opacus"])
        self.h = None
        t0 = time.perf_counter()  # once per run, as in the training loop
        self.input_sketch = InputSketch.build(self.x_train, self.split) if supports_ghost(base) else None
        self.input_sketch_seconds = time.perf_counter() - t0

    def new_round(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """A fresh minibatch (indices [K, b] and, gathered as the loop gathers them, x, y,
        weight) and channel draw."""
        self.h = self.fading.sample(1, self.gain, self.gens["fading"])[0].to(self.device)
        idx, weight = sample_minibatches(self.split, self.spec.data.batch_size, self.gens["data"])
        idx, weight = idx.to(self.device), weight.to(self.device)
        return idx, gather_rows(self.x_train, idx), gather_rows(self.y_train, idx), weight

    def finish(self, method: str, grads: UserGradients) -> None:
        """Clip, transmit, MAC, estimate (known |K_t|), Adam step: as in the training loop."""
        agg = self.aggregate(grads, self.h, self.active, self.setup, self.gens["noise"])
        self.flat_grads[method].copy_(estimate_known(agg.aligned_sum, agg.participants))
        self.opts[method].step()

    def finish_digital(self, method: str, grads: UserGradients) -> None:
        """The digital round's aggregation (quantise, rotate, privatise, modular sum, decode), estimate, Adam."""
        agg = digital_aggregate(grads, self.h, self.active, self.setup, self.gens["noise"],
                                digital=self.digital[method])
        self.flat_grads[method].copy_(estimate_known(agg.aligned_sum, agg.participants))
        self.opts[method].step()

    def step(self, method: str, idx: Tensor, x: Tensor, y: Tensor, weight: Tensor) -> None:
        model, wd = self.models[method], self.weight_decay
        if method == "round" or method in DIGITAL_METHODS:
            sketch = self.input_sketch.minibatch(idx) if self.input_sketch else None
            grads = user_gradients(model, x, y, weight, weight_decay=wd, input_sketch=sketch)
            (self.finish if method == "round" else self.finish_digital)(method, grads)
        elif method == "loop":
            grads, losses = per_user_loop_gradients(model, x, y, weight, weight_decay=wd)
            self.finish(method, StackedGradients(grads, losses))
        elif method == "opacus":
            grads, losses = opacus_user_gradients(self.gsm, x, y, weight, weight_decay=wd)
            self.finish(method, StackedGradients(grads, losses))
        elif method == "vmap":
            self.finish(method, StackedGradients(*per_user_gradients(model, x, y, weight, weight_decay=wd)))
        elif method == "floor":
            model.zero_grad(set_to_none=True)
            n, b = y.shape
            loss = (F.cross_entropy(model(x.reshape(n * b, -1)), y.reshape(-1), reduction="none")
                    * weight.reshape(-1)).sum()
            loss.backward()
        else:
            raise ValueError(method)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


FAST = ("round", "vmap", "floor", *DIGITAL_METHODS)  # cheap enough to time several times per repeat


def time_methods(model_key: str, device: torch.device, repeats: int, inner: int = 1,
                 methods=METHODS) -> dict[str, float]:
    """Median seconds per round of each method.

    Every repeat draws a new minibatch and times each method on it, in alternating order;
    the cheap methods (:data:`FAST`) are timed ``inner`` times per repeat, interleaved with
    each other, so the key ratio round / floor rests on ``repeats * inner`` pairs taken
    side by side. One untimed warm-up round per method first.
    """
    bench = RoundBench(model_key, device)
    times = {m: [] for m in methods}

    def timed(m: str, *batch) -> None:
        _sync(device)
        t0 = time.perf_counter()
        bench.step(m, *batch)
        _sync(device)
        times[m].append(time.perf_counter() - t0)

    batch = bench.new_round()
    for m in methods:  # warm-up: lazy imports (Adam imports torch._dynamo), allocator, MKL
        bench.step(m, *batch)
    for r in range(repeats):
        batch = bench.new_round()
        order = methods if r % 2 == 0 else tuple(reversed(methods))
        for m in order:
            if m not in FAST:
                timed(m, *batch)
        fast = [m for m in order if m in FAST]
        for i in range(inner):
            for m in (fast if i % 2 == 0 else fast[::-1]):
                timed(m, *batch)
    medians = {m: statistics.median(v) for m, v in times.items()}
    medians["input_sketch_once"] = bench.input_sketch_seconds
    return medians


def time_local_steps(device: torch.device, repeats: int, steps: int = 5) -> dict[str, float]:
    """Median seconds per local-steps round (FedAvg, S = ``steps``, single-layer, all K users), batched
    and per-user loop, on the same draws (module docstring)."""
    spec = load_spec(PAPER_SPEC, PRESET + MODELS["single"] + ["train.algorithm='fedavg'", f"train.local_steps={steps}"])
    run = build_run(spec, device=device)
    x, y = run.data.x_train.to(device), run.data.y_train.to(device)
    local = build_local_steps(spec, run, x, y)
    setup, aggregate = run.channel.setup, AGGREGATORS[spec.train.aggregation]
    fading, gain, gens = run.channel.fading, run.channel.large_scale_gain, run.generators
    K = spec.data.users
    users = torch.arange(K, device=device)
    active = torch.ones(K, dtype=torch.bool, device=device)
    kw = dict(local_lr=local.lr, record_sampling=local.q, record_clip=local.C, step_noise=local.sigma)

    def finish(u: Tensor) -> None:  # transmit (L / B) u_k, MAC, estimate, server step: as in the loop
        h = fading.sample(1, gain, gens["fading"])[0].to(device)
        agg = aggregate(StackedGradients(u * (local.L / local.bound)), h, active, setup, gens["noise"])
        local.apply(estimate_known(agg.aligned_sum, agg.participants), participants=agg.participants, mu=K,
                    unknown=False)

    def batched(draws):
        finish(local_updates(local.model, local.weights, x, y, local.index, local.counts, iter(draws), **kw)[0])

    def loop(draws):
        finish(local_updates_loop(local.model, local.weights, x, y, local.index, local.counts, draws, **kw))

    times = {"local_steps": [], "local_steps_loop": []}
    batched(list(local._draws(users, steps, local.q)))  # warm-up
    loop(list(local._draws(users, 1, local.q)))
    for r in range(repeats):
        draws = list(local._draws(users, steps, local.q))
        for name, fn in ((("local_steps", batched), ("local_steps_loop", loop)) if r % 2 == 0
                         else (("local_steps_loop", loop), ("local_steps", batched))):
            _sync(device)
            t0 = time.perf_counter()
            fn(draws)
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def peak_rss_mib(rounds: int = 20, device: str = "cpu") -> float:
    """Peak RSS (MiB) of ``otafl run`` on the two-layer paper preset in a child process.

    ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the largest peak of any waited-for child, and
    on Linux a child's peak includes the parent's resident set inherited at fork time; call
    this before the benchmark allocates (the parent then holds ~0.35 GiB of imports, below
    the child's own peak).
    """
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", "from otafl.cli.main import cli; cli()", "run", str(PAPER_SPEC),
               "--quiet", "--out", out, "--device", device,
               *sum((["--set", s] for s in PRESET + MODELS["two"] + [f"train.rounds={rounds}",
                                                                   f"train.eval_every={rounds}"]), [])]
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                       env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
    kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    return kib / 1024.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--repeats", type=int, default=7, help="repeats, each on a new minibatch [7]")
    parser.add_argument("--inner", type=int, default=5,
                        help="timings per repeat of the cheap methods round, vmap, floor [5]")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads [2]")
    parser.add_argument("--rss-rounds", type=int, default=20,
                        help="rounds of the peak-RSS training run (0: skip) [20]")
    parser.add_argument("--local-steps", type=int, default=5, help="S of the local-steps round [5]")
    parser.add_argument("--local-repeats", type=int, default=3, help="repeats of the local-steps round [3]")
    parser.add_argument("--large-k", default="200,1000,10000",
                        help="K of the large-K rounds (bench_round_large_k.py, one thread), comma list ('' for "
                             "none) [200,1000,10000]")
    parser.add_argument("--large-k-repeats", type=int, default=7, help="repeats of each large-K round [7]")
    parser.add_argument("--large-k-data-dir", type=Path, default=None,
                        help="folder of the 330,000-image MNIST-format set (written there if missing) "
                             "[a temporary folder]")
    parser.add_argument("--digital-models", default="single",
                        help="models that also time the digital rounds, comma list of single,two ('' for none) [single]")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)

    out: dict = {"device": str(device), "threads": args.threads, "repeats": args.repeats, "inner": args.inner,
                 "torch": torch.__version__}
    if args.rss_rounds > 0:  # first, while this process is small (see peak_rss_mib)
        out["peak_rss_mib"] = peak_rss_mib(args.rss_rounds, str(device))
    digital_models = [k.strip() for k in args.digital_models.split(",") if k.strip()]
    for key in MODELS:
        methods = METHODS + (DIGITAL_METHODS if key in digital_models else ())
        med = time_methods(key, device, args.repeats, args.inner, methods=methods)
        out[f"input_sketch_once_s_{key}"] = med.pop("input_sketch_once")
        for m, v in med.items():
            out[f"median_s_{m}_{key}"] = v
        out[f"overhead_vs_floor_{key}"] = med["round"] / med["floor"]
        out[f"speedup_vs_loop_{key}"] = med["loop"] / med["round"]
        out[f"speedup_vs_opacus_{key}"] = med["opacus"] / med["round"]
        out[f"speedup_vs_vmap_{key}"] = med["vmap"] / med["round"]
        for m in DIGITAL_METHODS:
            if m in med:
                out[f"digital_over_ota_{m[3:]}_{key}"] = med[m] / med["round"]
    local = time_local_steps(device, args.local_repeats, args.local_steps)
    out["local_steps"] = args.local_steps
    out["median_s_local_steps_single"] = local["local_steps"]
    out["median_s_local_steps_loop_single"] = local["local_steps_loop"]
    out["speedup_vs_loop_local_steps"] = local["local_steps_loop"] / local["local_steps"]
    large_ks = [int(k) for k in args.large_k.split(",") if k.strip()]
    if large_ks:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_round_large_k

        out.update({f"large_k_{key}" if key == "load_s" else key: v for key, v in
                    bench_round_large_k.large_k(large_ks, args.large_k_repeats, args.large_k_data_dir).items()})

    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(f"device {device}, {args.threads} threads, {args.repeats} repeats "
              f"x {args.inner} (cheap methods), torch {torch.__version__}")
        print(f"{'model':8s}" + "".join(f"{m:>12s}" for m in METHODS) + "   (median ms per round)")
        for key in MODELS:
            print(f"{key:8s}" + "".join(f"{1e3 * out[f'median_s_{m}_{key}']:12.1f}" for m in METHODS))
        for key in MODELS:
            print(f"{key}: round / floor {out[f'overhead_vs_floor_{key}']:.2f}; speed-up vs loop "
                  f"{out[f'speedup_vs_loop_{key}']:.1f}x, opacus {out[f'speedup_vs_opacus_{key}']:.1f}x, "
                  f"vmap {out[f'speedup_vs_vmap_{key}']:.1f}x")
        print(f"local steps (fedavg, S = {args.local_steps}, single, all users): "
              f"{1e3 * out['median_s_local_steps_single']:.0f} ms batched vs "
              f"{1e3 * out['median_s_local_steps_loop_single']:.0f} ms per-user loop: "
              f"{out['speedup_vs_loop_local_steps']:.1f}x")
        for key in MODELS:
            ratios = {m[3:]: out[f"digital_over_ota_{m[3:]}_{key}"] for m in DIGITAL_METHODS
                      if f"digital_over_ota_{m[3:]}_{key}" in out}
            if ratios:
                print(f"{key}: digital round / over-the-air round: "
                      + ", ".join(f"{m} {r:.2f}" for m, r in ratios.items()))
        for k in large_ks:
            print(f"K = {k} (MNIST-format N = 330,000, p = 0.5, b = 16, one thread): round / floor "
                  f"{out[f'overhead_vs_floor_k{k}']:.2f} (round {1e3 * out[f'median_s_round_k{k}']:.1f} ms, floor "
                  f"{1e3 * out[f'median_s_floor_k{k}']:.1f} ms); without the input sketch "
                  f"{out[f'overhead_nosketch_vs_floor_k{k}']:.2f}")
        if "peak_rss_mib" in out:
            print(f"peak RSS of a {args.rss_rounds}-round two-layer paper-preset run: "
                  f"{out['peak_rss_mib']:.0f} MiB")
    return out


if __name__ == "__main__":
    main()
