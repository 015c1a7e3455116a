"""Results files with real specs (expanded from a grid) and made-up summaries and rounds,
for the table and plot tests (no training: milliseconds)."""

import math

from otafl.sweep.grid import expand_grid
from otafl.sweep.store import open_store

ACCS = {0: 0.80, 1: 0.82, 2: 0.84}  # per seed: mean 82.0 %, sample std 2.0 %
SCALE = {"paper": 2.0, "tight": 1.0, "exact": 0.5}


def knob(spec) -> float:
    """The uniform p, or 0.25 for the other schemes."""
    return spec.sampling.p if spec.sampling.scheme == "uniform" else 0.25


def default_summary(spec, accountants):
    """Leakage: central 1/p scaled per accountant, local 3 (paper: invalid where p < 0.5)."""
    p, seed = knob(spec), spec.train.seed
    out = {"final_test_accuracy": ACCS[seed], "rounds": spec.train.rounds, "users": 10,
           "mean_participants": 10 * p, "scheme": spec.sampling.scheme, "seed": seed}
    for a in accountants:
        s = SCALE[a]
        out.update({f"{a}_epsilon_local_max": s * 3.0, f"{a}_epsilon_local_total": s * 15.0,
                    f"{a}_epsilon_central": s / p, f"{a}_epsilon_central_total": s * 5 / p,
                    f"{a}_delta_local_total": 1e-5, f"{a}_delta_central_total": 2e-5,
                    f"{a}_composition": "rdp", f"{a}_composition_local": "basic",
                    f"{a}_classic_valid": not (a == "paper" and p < 0.5), f"{a}_defined": True})
    return out


def fake_store(path, axes, points=(), seeds=(0, 1, 2), accountants=("paper", "tight"), rounds=5,
               summary=default_summary, extra=None):
    """Write a results file for the grid ``axes`` / ``points`` x ``seeds``; ``summary(spec,
    accountants)`` makes each run's summary; every run gets ``rounds`` round records with a
    rising test accuracy. Returns the path as a string."""
    raw = {"data": {"name": "synthetic", "users": 10}, "train": {"rounds": rounds, "eval_every": 1},
           "privacy": {"accountants": list(accountants)},
           "sweep": {"axes": axes, "points": list(points), "seeds": list(seeds)}}
    for section, values in (extra or {}).items():
        raw.setdefault(section, {}).update(values)
    _, grid = expand_grid(raw)
    with open_store(path) as store:
        for pt in grid:
            s = pt.spec
            summ = summary(s, accountants)
            acc = summ.get("final_test_accuracy", math.nan)
            recs = [{"round": t + 1, "participants": 3 + t % 2, "expected_participants": 3.5,
                     "mean_gain": 1.0, "test_accuracy": acc * (t + 1) / rounds} for t in range(rounds)]
            rid = store.mark_running(pt.params, pt.train, pt.values)
            store.mark_done(rid, summ, recs)
    return str(path)
