"""The FedSGD training round against its compute floor at K = 200, 10^3 and 10^4 users (issue 24).

MNIST-format data: N = 330,000 training images of 28 x 28 (F = 784), 10 classes, written as IDX
files by ``benchmarks/make_mnist_idx.py`` (into a temporary folder, or ``--data-dir``, where an
existing set is reused) and loaded by the ``mnist`` loader, as ``otafl run`` would. The spec is
``experiments/large-k.toml`` (AR Rician fading, SNR 10 dB, sigma^2 = 0.1, ``min`` alignment,
``known`` estimator, Adam) with ``data.name = "mnist"``, single-layer model, iid split (so each
user holds D_k = N / K samples), uniform p = 0.5 (about K p users compute), b = 16 samples a user,
one thread. Per K, a warm-up round (which builds the run's InputSketch once, timed apart), then
``--repeats`` repeats, each timing one after the other:

    round          -- the training loop's round: participants' coins, minibatch draw and gather
                      (into the reused RowBuffer), per-user gradients (ghost norms: the first
                      layer's from the InputSketch where the run has one, clipped sum book-kept),
                      clip, transmit, MAC, estimate, Adam step: the body of
                      :func:`otafl.fl.loop.run_experiment` without the round record and the
                      accountants;
    round_nosketch -- the same round with the sketch switched off (the first layer's norms from
                      the materialised layer gradients, a cache-sized block of users at a time);
                      at K = 200 and 10^3 the run has no sketch (r + 1 >= F, or N (r + 1) over its
                      memory cap), so the two coincide;
    floor          -- one forward and backward of the weighted loss over a minibatch of the same
                      K p b rows (gathered beforehand, not timed), no per-user separation and
                      nothing else.

Medians over the repeats. Keys: ``overhead_vs_floor_k{K}`` (round / floor),
``overhead_nosketch_vs_floor_k{K}``, the raw medians ``median_s_{round,round_nosketch,floor}_k{K}``,
``rows_k{K}`` (samples a round), ``sketch_rank_k{K}`` (r, or null without a sketch),
``input_sketch_once_s_k{K}`` (the one-off sketch build) and ``load_s`` (loading the data set:
IDX parsing and the uint8 -> float32 conversion, first load in this process).

    python benchmarks/bench_round_large_k.py [--json] [--users 200,1000,10000] [--repeats 7]
        [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from otafl.config import load_spec
from otafl.data import RowBuffer, load_dataset, sample_minibatches
from otafl.data.mnist import _find_mnist_files
from otafl.estimate import ESTIMATORS
from otafl.fl.aggregations import build_aggregation
from otafl.fl.algorithms import build_algorithm
from otafl.sampling import draw_participants
from otafl.setup import build_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_mnist_idx import make_set  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "experiments" / "large-k.toml"
N_TRAIN, N_TEST, BATCH, P = 330_000, 10_000, 16, 0.5


class RoundBench:
    """One run's setup at K users and the loop's round over it."""

    def __init__(self, users: int, data_dir: Path, rounds: int):
        spec = load_spec(SPEC, ["data.name='mnist'", f"data.dir='{data_dir}'", f"data.users={users}",
                                f"data.batch_size={BATCH}", f"sampling.p={P}", f"train.rounds={rounds}",
                                "model.name='single-layer'"])
        self.spec = spec
        self.run = run = build_run(spec, device="cpu")
        self.x_train, self.y_train = run.data.x_train, run.data.y_train
        self.aggregation = build_aggregation(spec, dim=run.dim, setup=run.channel.setup)
        self.algorithm = build_algorithm(spec, run, self.x_train, self.y_train)
        self.estimate = ESTIMATORS[spec.estimator.kind]
        self.t = 0
        self.floor_model = copy.deepcopy(run.model)
        self.floor_x, self.floor_y = RowBuffer(), RowBuffer()
        self.floor_gen = torch.Generator().manual_seed(12345)

    def round(self) -> None:
        """The loop's round t (run_experiment's body, less the record and the accountants)."""
        run, alg, agg_, gens = self.run, self.algorithm, self.aggregation, self.run.generators
        h, p = run.channel.h[self.t], run.channel.p[self.t]
        self.t += 1
        active = draw_participants(p, gens["coins"])
        grads, _, _ = alg.transmit(active, train=True)
        agg = agg_.round(grads, h, active, gens["noise"])
        mu = float((p * agg.eligible.to(p.dtype)).sum())
        g_hat = self.estimate(agg.aligned_sum, participants=agg.participants, mu=mu)
        if g_hat is not None and agg.participants > 0 and not agg.skip:
            alg.apply(g_hat, participants=agg.participants, mu=mu, unknown=False)

    def floor_batch(self, rows_per_user: int):
        """A minibatch of about K p users x b rows, gathered (not timed) for the floor."""
        idx, weight = sample_minibatches(self.run.split, rows_per_user, self.floor_gen)
        keep = torch.rand(idx.shape[0], generator=self.floor_gen) < P
        idx, weight = idx[keep], weight[keep]
        return self.floor_x.gather(self.x_train, idx), self.floor_y.gather(self.y_train, idx), weight

    def floor(self, x, y, weight) -> None:
        model = self.floor_model
        n, b = y.shape
        model.zero_grad(set_to_none=True)
        loss = (F.cross_entropy(model(x.reshape(n * b, -1)), y.reshape(-1), reduction="none")
                * weight.reshape(-1)).sum()
        loss.backward()


def measure(users: int, repeats: int, data_dir: Path) -> dict:
    bench = RoundBench(users, data_dir, rounds=2 * repeats + 1)
    t0 = time.perf_counter()
    bench.round()  # warm-up: builds the InputSketch (once per run)
    sketch_s = time.perf_counter() - t0
    sketch = bench.algorithm.input_sketch
    times: dict[str, list[float]] = {"round": [], "round_nosketch": [], "floor": []}
    rows = []
    for r in range(repeats):
        x, y, weight = bench.floor_batch(BATCH)
        rows.append(y.numel())
        order = ("round", "round_nosketch", "floor") if r % 2 == 0 else ("floor", "round_nosketch", "round")
        for name in order:
            bench.algorithm.input_sketch = None if name == "round_nosketch" else sketch
            t0 = time.perf_counter()
            if name == "floor":
                bench.floor(x, y, weight)
            else:
                bench.round()
            times[name].append(time.perf_counter() - t0)
        bench.algorithm.input_sketch = sketch
    med = {k: statistics.median(v) for k, v in times.items()}
    return {**{f"median_s_{k}_k{users}": v for k, v in med.items()},
            f"rows_k{users}": int(statistics.median(rows)),
            f"sketch_rank_k{users}": None if sketch is None else sketch.rank,
            f"input_sketch_once_s_k{users}": sketch_s,
            f"overhead_vs_floor_k{users}": med["round"] / med["floor"],
            f"overhead_nosketch_vs_floor_k{users}": med["round_nosketch"] / med["floor"]}


def large_k(ks: list[int], repeats: int, data_dir: Path | None = None) -> dict:
    """``load_s`` and every K's keys, on one thread (restored afterwards); the data set is
    written to a temporary folder unless ``data_dir`` holds one (or is to hold it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = data_dir or Path(tmp)
            if _find_mnist_files(folder) is None:
                make_set(folder, N_TRAIN, N_TEST)
            t0 = time.perf_counter()
            load_dataset("mnist", data_dir=str(folder), download=False)
            out = {"load_s": time.perf_counter() - t0}
            for k in ks:
                out.update(measure(k, repeats, folder))
    finally:
        torch.set_num_threads(threads)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--users", default="200,1000,10000", help="comma list of K [200,1000,10000]")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per K [7]")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder of the MNIST-format set (written there if missing) [a temporary folder]")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.users.split(",") if k.strip()]
    out: dict = {"threads": 1, "repeats": args.repeats, "torch": torch.__version__, "batch": BATCH, "p": P,
                 **large_k(ks, args.repeats, args.data_dir)}
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(f"MNIST-format N = {N_TRAIN}, F = 784, single-layer, p = {P}, b = {BATCH}, one thread; "
              f"data load {out['load_s']:.2f} s")
        for k in ks:
            rank = out[f"sketch_rank_k{k}"]
            print(f"K = {k} ({out[f'rows_k{k}']} rows a round): round {1e3 * out[f'median_s_round_k{k}']:.1f} ms, "
                  f"without sketch {1e3 * out[f'median_s_round_nosketch_k{k}']:.1f} ms, floor "
                  f"{1e3 * out[f'median_s_floor_k{k}']:.1f} ms; round / floor {out[f'overhead_vs_floor_k{k}']:.2f}, "
                  f"without sketch {out[f'overhead_nosketch_vs_floor_k{k}']:.2f}; sketch "
                  + (f"r = {rank}, built once in {out[f'input_sketch_once_s_k{k}']:.2f} s" if rank is not None
                     else "none"))
    return out


if __name__ == "__main__":
    main()
