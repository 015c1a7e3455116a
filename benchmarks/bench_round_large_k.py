"""Where a FedSGD round's time goes at large K (issue 24, item 3): the minibatch gather
against the compute floor, side by side in one run.

MNIST-shaped data (N = 330,000 random rows of F = 784 float32 features, 10 classes; no
data set needed), single-layer model, uniform p = 0.5 (K p users compute), b = 16 samples a
user, one thread. Per K, every repeat draws fresh indices [K p, b] and times, one after the
other on the same draw:

    gather  -- :func:`otafl.data.gather_rows` of features and labels into fresh memory (the
               [K p, b, F] copy as it was made before the reused buffer);
    reused  -- the same copy into :class:`otafl.data.RowBuffer`'s memory, reused every round
               (what :class:`otafl.fl.algorithms.FedSGD` does);
    grads   -- :func:`otafl.fl.grads.user_gradients` on the gathered minibatch (ghost norms,
               clipped sum; no input sketch: random features do not pay it off);
    floor   -- one forward + backward over the same K p b rows, no per-user separation.

Medians over the repeats after one warm-up. ``overhead_vs_floor_k{K}`` is (gather + grads) /
floor: the per-user part of a round without the channel, estimate and optimizer step (which do
not grow with b F), with the reused buffer; ``overhead_fresh_vs_floor_k{K}`` the same with the
fresh copy; ``gather_over_floor_k{K}`` / ``reused_over_floor_k{K}`` the copies alone over the
floor; ``gather_mib_k{K}`` the copy's size.

    python benchmarks/bench_round_large_k.py [--json] [--users 1000,10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from otafl.data import RowBuffer, gather_rows
from otafl.fl.grads import user_gradients
from otafl.models import make_model

N, FEATURES, CLASSES, BATCH, P = 330_000, 784, 10, 16, 0.5


def measure(users: int, repeats: int, x_train, y_train, generator) -> dict[str, float]:
    model = make_model("single-layer", FEATURES, CLASSES, generator=torch.Generator().manual_seed(1))
    n = max(1, round(users * P))
    times: dict[str, list[float]] = {"gather": [], "reused": [], "grads": [], "floor": []}
    xb, yb = RowBuffer(), RowBuffer()
    for r in range(repeats + 1):  # the first is a warm-up
        idx = torch.randint(0, N, (n, BATCH), generator=generator)
        weight = torch.full((n, BATCH), 1.0 / BATCH)
        t0 = time.perf_counter()
        x, y = gather_rows(x_train, idx), gather_rows(y_train, idx)
        t1 = time.perf_counter()
        del x, y
        tr = time.perf_counter()
        x, y = xb.gather(x_train, idx), yb.gather(y_train, idx)
        t1r = time.perf_counter()
        t1, reused = t1r, (t1 - t0, t1r - tr)
        grads = user_gradients(model, x, y, weight)
        float(grads.norms.sum())
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        loss = (F.cross_entropy(model(x.reshape(n * BATCH, -1)), y.reshape(-1), reduction="none")
                * weight.reshape(-1)).sum()
        loss.backward()
        t3 = time.perf_counter()
        if r:
            times["gather"].append(reused[0])
            times["reused"].append(reused[1])
            times["grads"].append(t2 - t1)
            times["floor"].append(t3 - t2)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {**{f"median_s_{k}_k{users}": v for k, v in med.items()},
            f"gather_mib_k{users}": x.numel() * x.element_size() / 2**20,
            f"gather_over_floor_k{users}": med["gather"] / med["floor"],
            f"reused_over_floor_k{users}": med["reused"] / med["floor"],
            f"overhead_fresh_vs_floor_k{users}": (med["gather"] + med["grads"]) / med["floor"],
            f"overhead_vs_floor_k{users}": (med["reused"] + med["grads"]) / med["floor"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--users", default="1000,10000", help="comma list of K [1000,10000]")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per K [5]")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    x_train = torch.rand(N, FEATURES, generator=generator)
    y_train = torch.randint(0, CLASSES, (N,), generator=generator)
    out: dict = {"threads": 1, "repeats": args.repeats, "torch": torch.__version__}
    ks = [int(k) for k in args.users.split(",") if k.strip()]
    for k in ks:
        out.update(measure(k, args.repeats, x_train, y_train, generator))
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        for k in ks:
            print(f"K = {k} (p = {P}, b = {BATCH}, F = {FEATURES}): gather {1e3 * out[f'median_s_gather_k{k}']:.1f} ms "
                  f"({out[f'gather_mib_k{k}']:.0f} MiB), reused buffer {1e3 * out[f'median_s_reused_k{k}']:.1f} ms, grads {1e3 * out[f'median_s_grads_k{k}']:.1f} ms, floor "
                  f"{1e3 * out[f'median_s_floor_k{k}']:.1f} ms; gather / floor {out[f'gather_over_floor_k{k}']:.2f}, "
                  f"reused / floor {out[f'reused_over_floor_k{k}']:.2f}; (copy + grads) / floor: fresh "
                  f"{out[f'overhead_fresh_vs_floor_k{k}']:.2f}, reused {out[f'overhead_vs_floor_k{k}']:.2f}")
    return out


if __name__ == "__main__":
    main()
