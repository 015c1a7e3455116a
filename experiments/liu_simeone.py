"""Liu & Simeone's synthetic setting (JSAC 2021): their closed-form epsilon beside exact's, same rounds.

    PYTHONPATH=. python experiments/liu_simeone.py [--targets 1,10,50]

Reads experiments/liu-simeone.toml (channel preset channels/liu-simeone.toml), d = 10. Prints one row
at full power and one per target of ``privacy-budget`` (docs/guides/power-control.md#liu-simeone).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from otafl.api.liu_simeone import closed_form_rows
from otafl.config import load_spec
from otafl.privacy.units import units_note

SPEC = Path(__file__).resolve().parent / "liu-simeone.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="1,10,50", help="privacy-budget target epsilons, comma-separated")
    args = parser.parse_args()
    spec = load_spec(SPEC)
    targets = [float(v) for v in args.targets.split(",") if v.strip()]
    rows = closed_form_rows(spec, targets=targets)
    pv = spec.privacy
    print(f"K = {spec.data.users}, T = {spec.train.rounds}, d = 10, delta = {pv.delta_total:g}, "
          f"N0 = {spec.channel.n0:g}, SNR {spec.channel.snr_db} dB, sigma2 = {spec.transmit.sigma2}")
    print("policy          target  mean c_t  mean x_t  exact eps  closed-form eps  Gaussian eps  closed/exact"
          "  x needed (closed/exact)")
    for r in rows:
        target = "-" if r["target"] is None else f"{r['target']:g}"
        need = f"{r['noise_ratio']:.2f}" if "noise_ratio" in r else "-"
        print(f"{r['policy']:<15} {target:>6}  {r['gain']:8.3g}  {r['noise_var']:8.3g}  {r['exact']:9.3g}  "
              f"{r['closed_form']:15.3g}  {r['gaussian']:12.3g}  {r['ratio']:12.2f}  {need:>23}")
    print("closed form: a bound here (x_t = N0 / c_t^2 + min sigma_k^2 leaves the other users' noise out); "
          "Gaussian: the composed rounds' own epsilon (all users in, no artificial noise)")
    print(f"every eps: central, over the T rounds, at delta = {pv.delta_total:g}; "
          + units_note({"exact, closed form, Gaussian": "user"}))


if __name__ == "__main__":
    main()
