"""Throughput of the per-round privacy bounds (``paper`` and ``tight``) on sweep grids.

    python benchmarks/bench_bounds.py            # table
    python benchmarks/bench_bounds.py --json     # JSON
    python benchmarks/bench_bounds.py --json --threads 1

Grids:

- product grid, 10^6 points: users (10 values, 50 ... 50,000) x p (100) x sigma^2 (10) x
  L (10) x SNR (10), built by broadcasting as ``otafl bound`` does (one call per accountant,
  every quantity computed on the broadcast shape of what it depends on);
- scattered grid: every input a full random tensor, no structure to exploit (10^6 points
  for ``paper``, 10^5 for ``tight``, whose exact quantile then needs one binomial window
  per point);
- scalar reference: the ``paper`` bound point by point in plain Python (``math`` module)
  over the first 10^4 points of the product grid; its results are checked against the
  batched ones before the timings are reported.

Keys (JSON): ``bound_points_per_s_paper``, ``bound_points_per_s_tight`` (product grid),
``bound_points_per_s_paper_scattered``, ``bound_points_per_s_tight_scattered``,
``scalar_points_per_s_paper``, ``speedup_vs_scalar`` (paper, product grid / scalar),
``speedup_vs_scalar_scattered`` (paper, scattered grid / scalar),
``grid_points``, ``threads``, ``device``, ``repeats`` (medians over repeats).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from otafl.api import PAPER_DIM
from otafl.privacy.accountants import ACCOUNTANTS

DIM = PAPER_DIM
N0 = 1.0
DELTA_L = 1e-5


def product_grid(device):
    f64 = dict(dtype=torch.float64, device=device)
    users = torch.tensor([50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000], **f64).view(-1, 1, 1, 1, 1)
    p = torch.linspace(0.01, 1.0, 100, **f64).view(1, -1, 1, 1, 1)
    sigma2 = torch.logspace(-2, 1, 10, **f64).view(1, 1, -1, 1, 1)
    clip = torch.logspace(-1, 0.5, 10, **f64).view(1, 1, 1, -1, 1)
    snr_db = torch.linspace(0, 30, 10, **f64).view(1, 1, 1, 1, -1)
    c = torch.sqrt(10 ** (snr_db / 10) * DIM * N0 / (clip**2 + DIM * sigma2))
    return dict(participation_prob=p, users=users, noise_var=sigma2, sensitivity=2 * clip, alignment_gain=c,
                n0=N0, delta_l=DELTA_L)


def scattered_grid(n, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    def u(lo, hi):
        return (lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)).to(device)
    return dict(participation_prob=u(0.01, 1.0), users=torch.randint(50, 5000, (n,), generator=g).to(device),
                noise_var=u(0.01, 10.0), sensitivity=u(0.2, 6.0), alignment_gain=u(0.1, 100.0), n0=N0,
                delta_l=DELTA_L)


def paper_scalar(users, p, sigma2, clip, c):
    """The ``paper`` bound for one point, plain Python (classic Gaussian, Hoeffding, amplification)."""
    sens = 2 * clip
    root = math.sqrt(2 * math.log(1.25 / DELTA_L))
    eps0_l = sens / math.sqrt(sigma2 + N0 / (c * c)) * root
    eps_l = math.log1p(p * math.expm1(eps0_l))
    mu = users * p
    dp = 2 * math.exp(-2 * mu * mu / users) + 1e-5
    if dp >= 1:
        return eps_l, math.inf
    m = mu - users * math.sqrt(math.log(2 / dp) / (2 * users))
    if m <= 0:
        return eps_l, math.inf
    eps0_c = sens / math.sqrt(m * sigma2) * root
    q = min(1.0, p / (1 - dp))
    return eps_l, math.log1p(q * math.expm1(eps0_c)) if eps0_c < 700 else eps0_c + math.log(q)


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's). On a CPU shared with other jobs, "
                             "1 thread avoids stalls at OpenMP barriers.")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    paper, tight = ACCOUNTANTS["paper"], ACCOUNTANTS["tight"]

    grid = product_grid(device)
    points = 10**6
    t_paper, b_paper = timed(lambda: paper.bound(**grid), args.repeats)
    t_tight, _ = timed(lambda: tight.bound(**grid), args.repeats)
    assert b_paper.epsilon_central.numel() == points

    scattered = scattered_grid(points, device)
    t_paper_s, _ = timed(lambda: paper.bound(**scattered), args.repeats)
    n_tight_s = 10**5
    scattered_small = scattered_grid(n_tight_s, device, seed=1)
    t_tight_s, _ = timed(lambda: tight.bound(**scattered_small), 1)

    # Scalar reference on the first 10^4 points of the product grid (C order).
    n_scalar = 10**4
    flat = {k: torch.broadcast_to(v, b_paper.epsilon_central.shape).reshape(-1)[:n_scalar].tolist()
            for k, v in grid.items() if isinstance(v, torch.Tensor)}
    inputs = list(zip(flat["users"], flat["participation_prob"], flat["noise_var"],
                      [s / 2 for s in flat["sensitivity"]], flat["alignment_gain"]))
    start = time.perf_counter()
    scalar = [paper_scalar(*point) for point in inputs]
    t_scalar = time.perf_counter() - start
    batched_c = b_paper.epsilon_central.reshape(-1)[:n_scalar].tolist()
    batched_l = b_paper.epsilon_local.reshape(-1)[:n_scalar].tolist()
    for (el, ec), bl, bc in zip(scalar, batched_l, batched_c):
        assert math.isclose(el, bl, rel_tol=1e-12) and (ec == bc or math.isclose(ec, bc, rel_tol=1e-12))

    result = {
        "bound_points_per_s_paper": points / t_paper,
        "bound_points_per_s_tight": points / t_tight,
        "bound_points_per_s_paper_scattered": points / t_paper_s,
        "bound_points_per_s_tight_scattered": n_tight_s / t_tight_s,
        "scalar_points_per_s_paper": n_scalar / t_scalar,
        "speedup_vs_scalar": (points / t_paper) / (n_scalar / t_scalar),
        "speedup_vs_scalar_scattered": (points / t_paper_s) / (n_scalar / t_scalar),
        "seconds_paper_grid": t_paper,
        "seconds_tight_grid": t_tight,
        "grid_points": points,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"product grid, {points:,} points ({result['threads']} threads, {device}):")
    print(f"  paper   {t_paper:8.3f} s   {result['bound_points_per_s_paper']:14,.0f} points/s")
    print(f"  tight   {t_tight:8.3f} s   {result['bound_points_per_s_tight']:14,.0f} points/s")
    print("scattered grid (every input a full tensor):")
    print(f"  paper   {t_paper_s:8.3f} s   {result['bound_points_per_s_paper_scattered']:14,.0f} points/s ({points:,})")
    print(f"  tight   {t_tight_s:8.3f} s   {result['bound_points_per_s_tight_scattered']:14,.0f} points/s "
          f"({n_tight_s:,})")
    print(f"scalar Python paper: {result['scalar_points_per_s_paper']:,.0f} points/s; "
          f"speedup {result['speedup_vs_scalar']:,.0f}x (product grid), "
          f"{result['speedup_vs_scalar_scattered']:,.0f}x (scattered)")


if __name__ == "__main__":
    main()
