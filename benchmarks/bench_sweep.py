"""Time a Table II-style sweep with and without its accountants: what accounting adds to a sweep.

The points are those of ``experiments/paper-table2a.toml`` (uniform p = 0.1 ... 0.9 plus
channel-aware sampling, K = 200, AR Rician fading, d = 7850), one seed, run by
:func:`otafl.fl.loop.run_experiment` on one process pool of ``--workers`` processes (one
torch thread each), each point with ``privacy.accountants = []`` and with the preset's
accountants (``exact``, ``paper``, ``tight``), all on the same pool of warm processes, as a
sweep's later points run (imports done, the accountants' in-process caches as a sweep
leaves them). ``--order interleaved`` (the default) runs each point's two runs back to back,
so the pool's two workers run them side by side and a drifting machine slows both alike;
``--order passes`` runs every point without, then every point with, accountants.

Keys: ``without_s`` / ``with_s`` (CPU seconds summed over the runs, each run timed by
``time.process_time`` in its worker: the work done, not the loaded machine's wall clock),
``accounting_overhead`` = (with_s - without_s) / without_s, ``accounting_s_per_point``
(interleaved: with minus without, per point, in the order of the points), ``accounted_s``
(CPU seconds inside the loop's ``account_facts`` alone, summed; ``accounted_s_per_point``
interleaved) and ``accounted_overhead`` = accounted_s / without_s (the accounting timed in
the run that does it: not the difference of two runs, whose training's noise on a shared
machine is a few CPU-seconds each way), and ``wall_s``; with ``--order passes`` instead
``without_wall_s`` / ``with_wall_s`` (each pass's wall clock) and ``accounting_overhead_wall``
the same ratio from them. The full sweep (1000 rounds, 10 points) trains for several CPU-minutes;
``--rounds`` and ``--points`` give a reduced one (say so when quoting it), and
``--bounds-only`` times the bounds-only sweep (``sweep.train = false``) instead.

    python benchmarks/bench_sweep.py --json
    python benchmarks/bench_sweep.py --json --rounds 300 --points 4
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import time

SPEC = "experiments/paper-table2a.toml"


def sweep_points(points: int | None) -> list[list[str]]:
    """The preset's points as overrides: uniform p = 0.1 ... 0.9, then channel-aware (h_th = 2).
    ``points`` keeps that many, spread over the list, channel-aware always among them."""
    uniform = [[f"sampling.p={p / 10:.1f}"] for p in range(1, 10)]
    aware = [["sampling.scheme=channel-aware", "sampling.h_th=2.0"]]
    if points is None or points >= len(uniform) + 1:
        return uniform + aware
    keep = max(0, points - 1)
    picked = [uniform[round(i * (len(uniform) - 1) / max(1, keep - 1))] for i in range(keep)] if keep > 1 else \
        uniform[4:5][:keep]
    return picked + aware


_ACCOUNTING = [0.0]  # CPU seconds inside the loop's account_facts, in this worker


def _timed_account_facts():
    """The loop's account_facts, wrapped to add its CPU seconds to :data:`_ACCOUNTING` (once per worker)."""
    import otafl.fl.loop as loop

    inner = loop.account_facts
    if getattr(inner, "_bench_timed", False):
        return

    def timed(*a, **k):
        t0 = time.process_time()
        try:
            return inner(*a, **k)
        finally:
            _ACCOUNTING[0] += time.process_time() - t0

    timed._bench_timed = True
    loop.account_facts = timed


def _one(job: tuple) -> tuple[float, dict, float]:
    """One run in a worker: (CPU seconds of the run, its privacy totals, CPU seconds of its accounting)."""
    import torch

    from otafl.config import load_spec
    from otafl.fl.loop import run_experiment

    torch.set_num_threads(1)
    _timed_account_facts()
    overrides, rounds, accountants, train = job
    spec = load_spec(SPEC, [*overrides, f"train.rounds={rounds}",
                            f"privacy.accountants={json.dumps(accountants)}"])
    _ACCOUNTING[0] = 0.0
    t0 = time.process_time()
    result = run_experiment(spec, train=train)
    cpu = time.process_time() - t0
    summary = result.summary if hasattr(result, "summary") else {}
    totals = {k: v for k, v in (summary or {}).items() if "epsilon" in k and "total" in k}
    return cpu, totals, _ACCOUNTING[0]


def _warm(accountants):
    """A 2-round run at p = 0.15 (no point of the sweep) in each worker: imports, data and first-use
    costs before the timed passes."""
    time.sleep(0.5)  # so that each worker takes one
    return _one((["sampling.p=0.15"], 2, accountants, True))[0]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--points", type=int, default=None, help="points of the sweep (default all 10)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--accountants", default="exact,paper,tight")
    ap.add_argument("--bounds-only", action="store_true", help="sweep.train = false (no training)")
    ap.add_argument("--order", choices=("interleaved", "passes"), default="interleaved",
                    help="interleaved (default): each point without and with accountants side by side; "
                         "passes: every point without, then every point with (adds the passes' wall clocks)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    points = sweep_points(args.points)
    accountants = [a for a in args.accountants.split(",") if a]
    train = not args.bounds_only
    out: dict = {"spec": SPEC, "points": len(points), "rounds": args.rounds, "workers": args.workers,
                 "train": train, "accountants": accountants, "clock": "process_time (CPU s), summed over runs",
                 "order": args.order}
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        pool.map(_warm, [accountants] * args.workers, chunksize=1)
        if args.order == "interleaved":
            # Each point without and with accountants back to back, so that the two halves of
            # the pool run them side by side: a machine whose speed drifts (a shared host:
            # the same pass measured 56 and 73 CPU-s an hour apart) slows both alike.
            w0 = time.perf_counter()
            res = pool.map(_one, [(p, args.rounds, accs, train) for p in points for accs in ([], accountants)],
                           chunksize=1)
            out["wall_s"] = time.perf_counter() - w0
            out["without_s"] = sum(r[0] for r in res[0::2])
            out["with_s"] = sum(r[0] for r in res[1::2])
            out["accounting_s_per_point"] = [round(b[0] - a[0], 3) for a, b in zip(res[0::2], res[1::2])]
            out["accounted_s"] = sum(r[2] for r in res[1::2])
            out["accounted_s_per_point"] = [round(r[2], 3) for r in res[1::2]]
            out["totals"] = [r[1] for r in res[1::2]]
        else:
            for label, accs in (("without", []), ("with", accountants)):
                w0 = time.perf_counter()
                res = pool.map(_one, [(p, args.rounds, accs, train) for p in points], chunksize=1)
                out[f"{label}_wall_s"] = time.perf_counter() - w0
                out[f"{label}_s"] = sum(r[0] for r in res)
            out["totals"] = [r[1] for r in res]  # the "with" pass's
            out["accounted_s"] = sum(r[2] for r in res)
            out["accounting_overhead_wall"] = (out["with_wall_s"] - out["without_wall_s"]) / out["without_wall_s"]
    out["accounting_overhead"] = (out["with_s"] - out["without_s"]) / out["without_s"]
    out["accounted_overhead"] = out["accounted_s"] / out["without_s"]
    if args.json:
        print(json.dumps(out, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v))
    else:
        for key, value in out.items():
            if key != "totals":
                print(f"{key:28s} {value:.4g}" if isinstance(value, float) else f"{key:28s} {value}")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
