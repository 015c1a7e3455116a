"""Time the ``exact`` accountant over a 1000-round paper-preset run: cached rounds and PLD totals.

The run's rounds come from a bounds-only run (``run_experiment(spec, train=False)``) of
``experiments/paper-mnist.toml`` (K = 200 in three SNR groups, AR Rician fading, uniform
p = 0.5, N0 = 1, d = 7850) with ``privacy.accountants = []``: its per-round
:class:`~otafl.privacy.facts.RoundFacts` are captured where the loop hands them to
``account_run``. Then, side by side in this process, on one torch thread:

- ``exact_round_ms_cached``: the per-round epsilons (central and local) of all rounds
  through the run engine (:mod:`otafl.privacy.accountants.exact_run`: rows rounded to
  the pessimistic grids, each distinct row computed once), caches cleared first, divided
  by the number of rounds;
- ``exact_round_ms_uncached``: the per-round path without grids or cache,
  :func:`~otafl.privacy.accountants.exact.exact_round` on one round at a time, on the
  first ``--uncached-rounds`` rounds;
- ``exact_total_s_1000_rounds``: the PLD totals (central and local) of all rounds;
- ``exact_total_vs_reference``: central total of the first ``--reference-rounds`` rounds
  over a reference (the same rounds unrounded, composed with a 4x finer PLD grid);
  ``exact_total_vs_reference_local`` the same for local DP;
- ``exact_account_ms_round_K1000``, ``_K10000``, ``_K100000``: a whole
  ``account_run(..., accountants=["exact"])`` (central and local, caches cleared) of
  ``--large-k-rounds`` (1000) fading rounds of K uniform users (p = 0.5, sigma^2 = 0.1,
  N0 = 1, d = 7850, c_t = 0.5 (1 + sqrt(Exp(1))), seed 0), per round (issue 24's target:
  at most 10 ms at K = 10^4); ``exact_total_central_K...`` the central total it states;
  ``exact_account_ms_round_K10000_run`` the same for the rounds of the loop's own bounds-only
  run of ``experiments/large-k.toml`` at K = 10^4 (d = 210), whose channel noise varies far
  more than the synthetic gains' (``exact_total_central_K10000_run`` / ``_local_``: its totals;
  the smallest of ``--repeats`` cold runs, as the paper run's key);
- ``exact_account_ms_round_paper_run``: ``account_run(..., accountants=["exact"])`` of the
  run's own facts at the run's total delta (``--delta-total``, 1e-5 as ``privacy.delta_total``),
  caches cleared, per round (issue 31's target: at most 1.5 ms), the smallest of ``--repeats``
  such cold runs (each one the whole workload; ``*_runs``: every run's, in order: on a shared
  machine one run can take 30 % longer than the next), ``exact_paper_run_totals`` its totals;
  ``paper_tight_account_ms_round_paper_run`` the same for ``paper`` and ``tight`` together
  (target 0.5 ms), ``paper_run_totals`` their totals;
- ``account_run_s``: a whole ``account_run(..., accountants=["exact"])`` (caches cleared,
  measured first), and ``rss_growth_mib`` the largest growth of this process's resident
  memory during it (sampled every 5 ms); ``peak_rss_mib`` the process's peak at the end
  (the bounds-only run included).

Times are CPU seconds of this process (``time.process_time``; one thread, so they are the
work done, not the machine's load); ``*_wall`` keys give wall-clock seconds.

    python benchmarks/bench_privacy.py            # table
    python benchmarks/bench_privacy.py --json     # one JSON object
    python benchmarks/bench_privacy.py --json --run-keys-only   # the three keys of a run's own facts
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time

import torch


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_facts(spec_path: str, rounds: int, overrides: list[str]) -> list:
    """The RoundFacts of a bounds-only run (captured where the loop's account_facts calls account_run)."""
    import otafl.fl.accounting as accounting
    import otafl.fl.loop as loop
    from otafl.config import load_spec

    captured: dict = {}
    original = accounting.account_run

    def capture(facts, **kwargs):
        captured["facts"] = list(facts)
        return original(facts, **kwargs)

    spec = load_spec(spec_path, ["privacy.accountants=[]", f"train.rounds={rounds}", *overrides])
    accounting.account_run = capture
    try:
        loop.run_experiment(spec, train=False)
    finally:
        accounting.account_run = original
    return captured["facts"]


def _rss_mib() -> float:
    """Current resident memory of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def rss_growth(fn):
    """fn() and the largest growth of the resident memory over its start, sampled every 5 ms."""
    import threading

    start, peak, done = _rss_mib(), [0.0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib() - start)
            done.wait(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        out = fn()
    finally:
        done.set()
        thread.join()
    return out, max(peak[0], _rss_mib() - start)


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def large_k(rounds: int, delta_l: float, users=(1000, 10_000, 100_000), repeats: int = 1) -> dict:
    """exact's account_run per round over ``rounds`` fading rounds of K uniform users, per K."""
    import numpy as np

    from otafl.privacy.accountants import account_run
    from otafl.privacy.accountants import exact_run as engine
    from otafl.privacy.facts import uniform_facts

    gains = 0.5 * (1.0 + np.sqrt(np.random.default_rng(0).exponential(size=rounds)))
    out = {}
    for K in users:
        facts = [uniform_facts(K, 0.5, 0.1, float(c), 1.0, 2.0, 7850) for c in gains]
        engine.clear_caches()
        result, cpu, _ = timed(lambda: account_run(facts, accountants=["exact"], delta_l=delta_l))
        out[f"exact_account_ms_round_K{K}"] = 1e3 * cpu / rounds
        out[f"exact_total_central_K{K}"] = result["exact"].summary_fields().get("exact_epsilon_central_total")
    out.update(k10000_run(rounds, delta_l, repeats))
    return out


def cold_runs(fn, repeats: int, clear) -> tuple:
    """``fn()`` ``repeats`` times, ``clear()`` before each: (the first result, CPU s of each run,
    wall s of each run)."""
    out, cpus, walls = None, [], []
    for _ in range(max(1, repeats)):
        clear()
        result, cpu, wall = timed(fn)
        out = result if out is None else out
        cpus.append(cpu)
        walls.append(wall)
    return out, cpus, walls


def k10000_run(rounds: int, delta_l: float, repeats: int = 1) -> dict:
    """``exact_account_ms_round_K10000_run`` (the smallest of ``repeats`` cold runs) and the totals it states."""
    from otafl.privacy.accountants import account_run
    from otafl.privacy.accountants import exact_run as engine

    out = {}
    # The loop's own rounds at K = 10^4 (experiments/large-k.toml, bounds only): the alignment
    # gain is the minimum over ~5,000 participants' Rician gains, so the channel noise spans
    # three decades (0.7 to 1,400) where the synthetic gains above span one.
    facts = run_facts("experiments/large-k.toml", rounds, ["data.users=10000"])
    result, cpus, _ = cold_runs(lambda: account_run(facts, accountants=["exact"], delta_l=delta_l, delta_target=1e-5),
                                repeats, engine.clear_caches)
    fields = result["exact"].summary_fields()
    out["exact_account_ms_round_K10000_run"] = 1e3 * min(cpus) / rounds
    out["exact_account_ms_round_K10000_run_runs"] = [1e3 * c / rounds for c in cpus]
    out["exact_total_central_K10000_run"] = fields.get("exact_epsilon_central_total")
    out["exact_total_local_K10000_run"] = fields.get("exact_epsilon_local_total")
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="experiments/paper-mnist.toml")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--uncached-rounds", type=int, default=10)
    ap.add_argument("--reference-rounds", type=int, default=100)
    ap.add_argument("--delta-l", type=float, default=1e-5)
    ap.add_argument("--delta-total", type=float, default=1e-5, help="the run's privacy.delta_total (paper_run keys)")
    ap.add_argument("--set", action="append", default=[], help="spec override, e.g. sampling.scheme=channel-aware")
    ap.add_argument("--large-k-rounds", type=int, default=1000, help="rounds of the K = 1e3..1e5 keys (0: skip)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="cold runs of each run key (the *_paper_run and *_K10000_run keys are the smallest)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--run-keys-only", action="store_true",
                    help="only the keys of a run's own facts (issue 31): exact_account_ms_round_paper_run, "
                         "paper_tight_account_ms_round_paper_run (with paper_run_totals) and, unless "
                         "--large-k-rounds 0, exact_account_ms_round_K10000_run (with its totals)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from otafl.privacy.accountants import account_run
    from otafl.privacy.accountants import exact_run as engine
    from otafl.privacy.accountants.exact import compose_exact, exact_round

    facts = run_facts(args.spec, args.rounds, args.set)
    T, dl = len(facts), args.delta_l
    account_run(facts[:2], accountants=["exact"], delta_l=dl)  # imports and first-use costs, not timed
    out: dict = {"rounds": T, "users": int(facts[0].participation_prob.numel()), "dim": int(facts[0].dim),
                 "threads": torch.get_num_threads(), "clock": "process_time (CPU s)"}

    if not args.run_keys_only:
        # A whole account_run first (caches cleared).
        engine.clear_caches()
        (result, cpu, wall), growth = rss_growth(lambda: timed(lambda: account_run(facts, accountants=["exact"],
                                                                                   delta_l=dl)))
        out["account_run_s"], out["account_run_s_wall"] = cpu, wall
        out["rss_growth_mib"] = growth
        ex = result["exact"]
        out["summary"] = {k: v for k, v in ex.summary_fields().items() if "total" in k or "composition" in k}
    # The run's own accounting, as the loop does it (account_run at privacy.delta_total), caches
    # cleared: exact alone, then paper and tight together.
    target = float(args.delta_total)
    exact_res, cpus, walls = cold_runs(lambda: account_run(facts, accountants=["exact"], delta_l=dl,
                                                           delta_target=target), args.repeats, engine.clear_caches)
    out["exact_account_ms_round_paper_run"] = 1e3 * min(cpus) / T
    out["exact_account_ms_round_paper_run_wall"] = 1e3 * min(walls) / T
    out["exact_account_ms_round_paper_run_runs"] = [1e3 * c / T for c in cpus]
    res, cpus, _ = cold_runs(lambda: account_run(facts, accountants=["paper", "tight"], delta_l=dl, delta_target=target),
                             args.repeats, lambda: None)
    out["paper_tight_account_ms_round_paper_run"] = 1e3 * min(cpus) / T
    out["paper_tight_account_ms_round_paper_run_runs"] = [1e3 * c / T for c in cpus]
    out["paper_run_totals"] = {k: v for name in ("paper", "tight") for k, v in res[name].summary_fields().items()
                               if "epsilon" in k and "total" in k}
    out["exact_paper_run_totals"] = {k: v for k, v in exact_res["exact"].summary_fields().items()
                                     if "epsilon" in k and "total" in k}
    if args.run_keys_only:
        if args.large_k_rounds > 0:
            out.update(k10000_run(args.large_k_rounds, dl, args.repeats))
        return _report(out, args.json)
    # Per-round epsilons through the engine (cold cache).
    engine.clear_caches()

    def per_round():
        keys = {kind: engine.run_row_keys(facts, kind) for kind in ("central", "local")}
        for kind in keys:
            engine.row_epsilons([k for ks in keys[kind] for k in ks], dl)
        return keys

    keys, cpu, wall = timed(per_round)
    out["exact_round_ms_cached"] = 1e3 * cpu / T
    out["exact_round_ms_cached_wall"] = 1e3 * wall / T
    out["distinct_rows_central"] = len({k for ks in keys["central"] for k in ks})
    out["distinct_rows_local"] = len({k for ks in keys["local"] for k in ks})

    # The per-round path without grids or cache, one round at a time.
    n_u = min(args.uncached_rounds, T)

    def uncached():
        for f in facts[:n_u]:
            exact_round(participation_prob=f.participation_prob[None], noise_var=f.noise_var[None],
                        alignment_gain=f.alignment_gain, n0=f.n0, sensitivity=f.sensitivity, delta_l=dl, dim=f.dim)

    _, cpu, wall = timed(uncached)
    out["exact_round_ms_uncached"] = 1e3 * cpu / n_u
    out["exact_round_ms_uncached_wall"] = 1e3 * wall / n_u
    out["speedup_cached"] = out["exact_round_ms_uncached"] / out["exact_round_ms_cached"]

    # PLD totals of the whole run (targets as account_run's defaults).
    target_c = (T + 1) * dl
    target_l = float(sum(float(f.participation_prob.max()) for f in facts)) * dl + dl

    def totals():
        return (engine.compose_exact_rounds(keys["central"], delta_target=target_c)["epsilon"],
                engine.compose_exact_rounds(keys["local"], delta_target=target_l)["epsilon"])

    (tot_c, tot_l), cpu, wall = timed(totals)
    out["exact_total_s_1000_rounds"] = cpu
    out["exact_total_s_1000_rounds_wall"] = wall
    out["exact_epsilon_central_total"], out["exact_epsilon_local_total"] = tot_c, tot_l

    # Accuracy on the first rounds: ours (grids, 64 points) over unrounded rounds at 256 points.
    n_r = min(args.reference_rounds, T)
    sub = facts[:n_r]
    for kind, target in (("central", (n_r + 1) * dl), ("local", 0.5 * n_r * dl + dl)):
        ours = compose_exact(sub, delta_target=target, kind=kind)["epsilon"]
        ref = compose_exact(sub, delta_target=target, kind=kind, points=256, resolution=engine.NO_ROUNDING)["epsilon"]
        out["exact_total_vs_reference" + ("" if kind == "central" else "_local")] = ours / ref

    if args.large_k_rounds > 0:
        out.update(large_k(args.large_k_rounds, dl, repeats=args.repeats))

    return _report(out, args.json)


def _report(out: dict, as_json: bool) -> dict:
    out["peak_rss_mib"] = _peak_mib()
    out["torch"] = torch.__version__
    if as_json:
        print(json.dumps(out, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v))
    else:
        for key, value in out.items():
            print(f"{key:36s} {value:.4g}" if isinstance(value, float) else f"{key:36s} {value}")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
