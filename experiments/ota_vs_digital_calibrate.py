"""The library search behind experiments/ota-vs-digital.toml: noise levels at matched privacy.

For each over-the-air setting of the sweep (transmit.sigma2 in SIGMA2_OTA), the `tight`
accountant's composed central epsilon of a bounds-only run (same spec, seed 0) is the target;
for each digital mechanism, `otafl.api.digital.calibrate_sigma2` finds the per-user noise
variance whose composed central epsilon at the same total delta meets it (bisection on
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

from otafl.api.digital import calibrate_sigma2, minimal_bits  # noqa: E402
from otafl.config import load_spec  # noqa: E402
from otafl.fl.loop import run_experiment  # noqa: E402

SPEC = ROOT / "experiments" / "ota-vs-digital.toml"
SIGMA2_OTA = (0.1, 1.0)
MECHANISMS = ("gaussian", "skellam", "pbm")


def main() -> dict:
    out = {"levels": []}
    for s2 in SIGMA2_OTA:
        spec = load_spec(SPEC, [f"transmit.sigma2={s2}", "privacy.accountants=['tight']"])
        ota = run_experiment(spec, train=False).summary
        target, delta = ota["tight_epsilon_central_total"], ota["tight_delta_central_total"]
        K, T, p = spec.data.users, spec.train.rounds, spec.sampling.p
        level = {"ota_sigma2": s2, "target_epsilon_central_total": target, "delta_total": delta, "digital": {}}
        for mech in MECHANISMS:
            kw = dict(users=K, dim=7850, p=p, rounds=T, delta_l=spec.privacy.delta_l, delta_total=delta)
            bits, seen = 16, set()
            while bits not in seen:
                seen.add(bits)
                sigma2 = calibrate_sigma2(mech, target=target, bits=bits, **kw)
                bits = minimal_bits(mech, sigma2=sigma2, users=K, dim=7850) or 16
            sigma2 = calibrate_sigma2(mech, target=target, bits=bits, **kw)
            level["digital"][mech] = {"sigma2": round(sigma2 * 1.001, 6), "bits": bits}
        out["levels"].append(level)
    print(json.dumps(out, indent=2))
    for lv in out["levels"]:
        for mech, v in lv["digital"].items():
            print(f'[[sweep.points]]\n"train.aggregation" = "digital"\n"digital.mechanism" = "{mech}"\n'
                  f'"digital.sigma2" = {v["sigma2"]}\n"digital.bits" = {v["bits"]}\n'
                  f'"digital.delta_total" = {lv["delta_total"]:.6g}\n"privacy.accountants" = ["digital"]\n')
    return out


if __name__ == "__main__":
    main()
