"""Accuracy against exact's total central epsilon, one line per power-control policy, from the runs of
experiments/power-control.toml (docs/guides/power-control.md).

    PYTHONPATH=. python experiments/plot_power_control.py runs/power-control.sqlite --out figures/power-control.png

Each point: one sweep point's mean over its seeds (final test accuracy, and exact's central total at
delta_total), the bars one standard deviation of the accuracy.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from otafl.sweep.store import read_store

STYLE = {"full": ("tab:orange", "s"), "privacy-budget": ("tab:green", "^"), "cotaf": ("tab:blue", "o"),
         "schedule": ("tab:red", "D")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = defaultdict(list)
    with read_store(args.results) as store:
        for run in store.runs():
            tx, pv = run.params["transmit"], run.params["privacy"]
            key = (tx["power_control"], pv.get("target_epsilon"), tx["sigma2"])
            points[key].append((100 * run.summary["final_test_accuracy"], run.summary["exact_epsilon_central_total"]))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for policy, (color, marker) in STYLE.items():
        rows = sorted((float(np.mean([e for _, e in v])), float(np.mean([a for a, _ in v])),
                       float(np.std([a for a, _ in v])), len(v)) for k, v in points.items() if k[0] == policy)
        if not rows:
            continue
        eps, acc, std, n = zip(*rows)
        ax.errorbar(eps, acc, yerr=std, color=color, marker=marker, capsize=3, label=f"{policy} ({n[0]} seeds)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("central epsilon over 100 rounds (exact) at delta = 1e-5, user level")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("Power control at matched epsilon (embedded MNIST, K = 200)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=150)
    print(f"power-control figure -> {args.out}")


if __name__ == "__main__":
    main()
