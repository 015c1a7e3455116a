"""The library search behind experiments/ota-vs-digital.toml: noise levels at matched privacy.

For each over-the-air setting of the sweep (transmit.sigma2 in SIGMA2_OTA), the target is the
`exact` accountant's composed central epsilon (the default accountant: numerically integrated
rounds composed by PLD) at the spec's one total delta, ``privacy.delta_total`` (1e-5 by default,
the delta of every accountant's totals, over the air and digital), of a bounds-only run of the
same spec, averaged over the sweep's seeds (the OTA epsilon depends on the fading drawn: the seeds
differ by a few per cent, and the table prints the mean over seeds). `tight`'s total at the same
delta is printed for reference.

For each digital mechanism, `otafl.api.digital.calibrate_sigma2` finds the per-user noise
variance whose composed central epsilon at the same total delta meets the target (bisection on
log sigma^2, to ~1 %) at a given number of bits, and `minimal_bits` the fewest bits per
coordinate for that noise; the two alternate until the bits no longer change (the bound, hence
the noise, depends on the bits).
Prints JSON (and the [[sweep.points]] to paste):

    PYTHONPATH=. python experiments/ota_vs_digital_calibrate.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otafl.api.digital import calibrate_sigma2, digital_privacy, minimal_bits  # noqa: E402
from otafl.config import load_spec, read_toml  # noqa: E402
from otafl.fl.loop import run_experiment  # noqa: E402

SPEC = ROOT / "experiments" / "ota-vs-digital.toml"
SIGMA2_OTA = (0.1, 1.0)
MECHANISMS = ("gaussian", "skellam", "ddg", "pbm")


def ota_targets(s2: float, seeds) -> dict:
    """exact's (and, for reference, tight's) composed totals of the OTA point, per seed and mean."""
    per_seed = []
    for seed in seeds:
        spec = load_spec(SPEC, [f"transmit.sigma2={s2}", "privacy.accountants=['exact', 'tight']",
                                f"train.seed={seed}"])
        sm = run_experiment(spec, train=False).summary
        per_seed.append({"seed": seed, "exact": sm["exact_epsilon_central_total"],
                         "exact_delta": sm["exact_delta_central_total"],
                         "tight": sm["tight_epsilon_central_total"], "tight_delta": sm["tight_delta_central_total"]})
    mean = {k: sum(r[k] for r in per_seed) / len(per_seed) for k in per_seed[0] if k != "seed"}
    return {"per_seed": per_seed, "mean": mean, "spec": spec}


def main() -> dict:
    seeds = read_toml(SPEC).get("sweep", {}).get("seeds", [0])
    out = {"seeds": seeds, "levels": []}
    for s2 in SIGMA2_OTA:
        ota = ota_targets(s2, seeds)
        spec = ota.pop("spec")
        target, delta = ota["mean"]["exact"], ota["mean"]["exact_delta"]
        K, T, p = spec.data.users, spec.train.rounds, spec.sampling.p
        level = {"ota_sigma2": s2, "target_epsilon_central_total": target, "delta_total": delta, "ota": ota,
                 "digital": {}}
        for mech in MECHANISMS:
            kw = dict(users=K, dim=7850, p=p, rounds=T, delta_l=spec.privacy.delta_l, delta_total=delta)
            bits, seen = 16, set()
            while bits not in seen:
                seen.add(bits)
                sigma2 = calibrate_sigma2(mech, target=target, bits=bits, **kw)
                bits = minimal_bits(mech, sigma2=sigma2, users=K, dim=7850) or 16
            sigma2 = round(calibrate_sigma2(mech, target=target, bits=bits, **kw) * 1.001, 6)
            eps = digital_privacy(mech, sigma2=sigma2, bits=bits, **kw)["epsilon_central_total"]
            level["digital"][mech] = {"sigma2": sigma2, "bits": bits, "epsilon_central_total": eps}
        out["levels"].append(level)
    print(json.dumps(out, indent=2))
    for lv in out["levels"]:
        for mech, v in lv["digital"].items():
            print(f'[[sweep.points]]\n"train.aggregation" = "digital"\n"digital.mechanism" = "{mech}"\n'
                  f'"digital.sigma2" = {v["sigma2"]}\n"digital.bits" = {v["bits"]}\n'
                  f'"privacy.accountants" = ["digital"]\n')
    return out


if __name__ == "__main__":
    main()
