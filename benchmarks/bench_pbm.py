"""The PBM claim, measured: at matched (epsilon, delta) its sum estimate's MSE against the
Gaussian mechanism's, and the support (bits) it needs as epsilon falls.

One secure-aggregation round of n users (everyone takes part), d coordinates, L = 1, delta =
1e-5, over a grid of per-round central epsilons. For each epsilon:

- gaussian: the per-user variance sigma^2 whose summed Gaussian (analytic, Balle & Wang 2018)
  meets (epsilon, delta); its MSE is d n sigma^2 exactly.
- pbm at b bits (m = floor((2^b - 1) / n) trials), b in ``--bits``: the noise (theta = "auto",
  theta <= 1/4) that meets epsilon under the PBM bound (docs/privacy/digital.md#digital), and the MSE
  of the decoded sum by Monte Carlo; ``pbm_support_bits`` is the fewest bits whose MSE is
  within 10 % of the best over the grid.
- skellam: the calibrated sigma^2 and the fewest bits for it (otafl.api.digital.minimal_bits).

MSE by Monte Carlo over ``--trials`` rounds with every user holding the same random unit vector.

    python benchmarks/bench_pbm.py            # JSON
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from otafl.api.digital import calibrate_sigma2, minimal_bits  # noqa: E402
from otafl.config import load_spec  # noqa: E402
from otafl.fl.digital import build_digital, digital_aggregate  # noqa: E402
from otafl.fl.grads import StackedGradients  # noqa: E402


def pbm_mse(*, users: int, dim: int, bits: int, theta: str | float, sigma2: float, trials: int, seed: int) -> tuple:
    """(MSE, trials m, theta) of the PBM's decoded sum by Monte Carlo."""
    spec = load_spec(None, [f"data.users={users}", "digital.mechanism='pbm'", f"digital.bits={bits}",
                            f"digital.theta={theta!r}" if theta != "auto" else "digital.theta='auto'",
                            f"digital.sigma2={sigma2!r}", "digital.min_rate=0.0"])
    dg = build_digital(spec, dim=dim, power=torch.ones(users, dtype=torch.float64), n0=1.0)
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(dim, generator=gen, dtype=torch.float64)
    g = (v / v.norm()).expand(users, dim).float().contiguous()
    truth = g.double().sum(0)
    grads, h, active = StackedGradients(g), torch.ones(users, dtype=torch.float64), torch.ones(users, dtype=torch.bool)
    err = [float(((digital_aggregate(grads, h, active, None, gen, digital=dg).aligned_sum.double() - truth) ** 2).sum())
           for _ in range(trials)]
    return sum(err) / trials, dg.trials, dg.theta


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--epsilons", default="0.25,0.5,1,2,4,8")
    ap.add_argument("--bits", default="7,8,9,10,12,16")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n, d, delta = args.users, args.dim, 1e-5
    common = dict(users=n, dim=d, p=1.0, rounds=1, delta_l=delta, delta_total=delta)
    rows, t0 = [], time.perf_counter()
    for eps in [float(e) for e in args.epsilons.split(",")]:
        row = {"epsilon": eps}
        s2g = calibrate_sigma2("gaussian", target=eps, key="epsilon_central", **common)
        row.update(gaussian_sigma2=s2g, gaussian_mse=d * n * s2g)
        pbm = []
        for bits in [int(b) for b in args.bits.split(",") if int(b) >= n.bit_length()]:
            s2p = calibrate_sigma2("pbm", target=eps, key="epsilon_central", bits=bits, **common)
            mse, m, theta = pbm_mse(users=n, dim=d, bits=bits, theta="auto", sigma2=s2p, trials=args.trials,
                                    seed=args.seed)
            pbm.append({"bits": bits, "trials": m, "theta": theta, "sigma2": s2p, "mse": mse,
                        "mse_ratio": mse / row["gaussian_mse"]})
        best = min(p["mse_ratio"] for p in pbm)
        support = min(p["bits"] for p in pbm if p["mse_ratio"] <= 1.1 * best)
        row.update(pbm=pbm, pbm_best_mse_ratio=best, pbm_support_bits=support)
        s2s = calibrate_sigma2("skellam", target=eps, key="epsilon_central", bits=24, **common)
        row.update(skellam_sigma2=s2s, skellam_bits=minimal_bits("skellam", sigma2=s2s, users=n, dim=d),
                   skellam_variance_ratio=s2s / s2g)
        rows.append(row)
    out = {"setting": {"users": n, "dim": d, "delta": delta, "clip": 1.0, "trials": args.trials, "seed": args.seed,
                       "rounds": 1, "participation": 1.0},
           "rows": rows, "wall_seconds": time.perf_counter() - t0}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
