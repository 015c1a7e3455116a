"""Reproduce Heikkilä et al.'s Table 1 (appendix A.7, "Improved privacy for averaged models").

q = 0.1 Poisson sampling, delta = 1e-5; each party's local model is (5, 1e-5)-DP with the per-party
sigma of the table; N parties' averaged model is accounted by sum-domination as one party of noise
sigma sqrt(N) (the ``steps-sumdom`` accountant with users = N, p = 1: the source's own accounting,
NOT a guaranteed bound for S > 1 with several parties, docs/privacy/steps.md#steps). Prints, per row, the
table's epsilon and ``steps-sumdom``'s with the three compositions: RDP with the classic conversion
(which reproduces the table to two decimals), RDP with the improved conversion, and PLD; and last
the sound ``steps`` accountant's PLD value of the same mechanism (the co-users' last-step noise
credited only).

    PYTHONPATH=. python experiments/seed_table.py          # Markdown table
"""

from __future__ import annotations

import math

from otafl.privacy.accountants.steps import steps_round, steps_sumdom_round
from otafl.privacy.analysis.steps import COMPOSITIONS

TABLE = [  # (label, steps, per-party sigma, {parties: (sigma total, eps of the averaged model)})
    ("1 step", 1, 0.69, {1: (0.69, 5.0), 2: (0.98, 2.78), 5: (1.54, 1.22), 10: (2.18, 0.64)}),
    ("1 epoch", 10, 0.90, {1: (0.90, 5.0), 2: (1.28, 2.61), 5: (2.02, 1.19), 10: (2.85, 0.72)}),
    ("5 epochs", 50, 1.18, {1: (1.18, 5.0), 2: (1.67, 2.85), 5: (2.64, 1.55), 10: (3.73, 1.03)}),
]


def main() -> None:
    print("| local steps | parties | sigma total (table) | sigma sqrt(N) | eps (table) | rdp-classic | rdp | pld | steps (sound, pld) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, steps, sigma, rows in TABLE:
        for parties, (sigma_total, eps) in rows.items():
            kw = dict(participation_prob=1.0, users=parties, noise_var=0.0, sensitivity=1.0, alignment_gain=1.0,
                      n0=0.0, delta_l=1e-5, local_steps=steps, record_sampling=0.1, step_noise=sigma)
            out = {c: float(steps_sumdom_round(**kw, composition=c).epsilon_central) for c in COMPOSITIONS}
            sound = float(steps_round(**kw).epsilon_central)
            print(f"| {label} ({steps}) | {parties} | {sigma_total:.2f} | {sigma * math.sqrt(parties):.3f} | {eps} | "
                  f"{out['rdp-classic']:.3f} | {out['rdp']:.3f} | {out['pld']:.3f} | {sound:.3f} |")


if __name__ == "__main__":
    main()
