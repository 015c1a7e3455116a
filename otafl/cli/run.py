"""``otafl run SPEC``: train FedSGD over the simulated channel and write the results."""

from __future__ import annotations

import os
from pathlib import Path

import click


@click.command("run")
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a spec value, e.g. --set sampling.p=0.3 (repeatable).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder for summary.json and rounds.csv [default: runs/<spec name>].")
@click.option("--seed", type=int, default=None, help="Override train.seed.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
              help="Where tensors live [default: the spec's train.device, auto].")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def run(spec, overrides, out_dir, seed, device, quiet):
    """Train FedSGD over the wireless MAC described by SPEC (a TOML file).

    Without SPEC, every value takes its default (embedded MNIST, 200 users).
    Writes OUT/summary.json and OUT/rounds.csv only when the run finishes.
    """
    from tqdm import tqdm

    from otafl.config import load_spec
    from otafl.fl.loop import run_experiment
    from otafl.results import write_run

    overrides = list(overrides) + ([f"train.seed={seed}"] if seed is not None else [])
    cfg = load_spec(spec, overrides)
    if out_dir is None:
        out_dir = os.path.join("runs", Path(spec).stem if spec else "default")
    bar = tqdm(total=cfg.train.rounds, desc="rounds", unit="round", disable=quiet, leave=False,
               dynamic_ncols=True)

    def on_round(rec: dict) -> None:
        bar.update(1)
        if rec["test_accuracy"] == rec["test_accuracy"]:  # evaluated this round
            bar.set_postfix(acc=f"{rec['test_accuracy']:.3f}", K_t=rec["participants"])

    try:
        result = run_experiment(cfg, device=device, on_round=on_round)
    finally:
        bar.close()
    write_run(out_dir, result.summary, result.rounds)
    s = result.summary
    click.echo(f"final test accuracy {s['final_test_accuracy']:.4f} after {s['rounds']} rounds; "
               f"mean participants {s['mean_participants']:.1f} of {s['users']}; "
               f"{s['wall_seconds']:.1f} s -> {out_dir}")
    if s.get("channel_uses_per_round") == s.get("channel_uses_per_round"):  # not NaN
        click.echo(f"  uplink: {s['channel_uses_per_round']:.4g} channel uses and {s['energy_per_round']:.4g} "
                   f"energy per round, {s['outages_per_round']:.3g} outages per round")
    names = list(cfg.privacy.accountants) + (["digital"] if "digital" not in cfg.privacy.accountants else [])
    for name in names:
        if f"{name}_epsilon_central" in s:
            click.echo(f"  {name}: per-round eps_local max {s[f'{name}_epsilon_local_max']:.4g}, "
                       f"eps_central {s[f'{name}_epsilon_central']:.4g}; over the run "
                       f"eps_central {s[f'{name}_epsilon_central_total']:.4g} "
                       f"({s.get(f'{name}_composition', '')})"
                       + ("" if s.get(f"{name}_classic_valid", True) else
                          "  [flagged: classic step with eps_0 > 1 or LDP amplified by p < 1; "
                          "not a guaranteed bound]"))
    if s.get("privacy_note"):
        click.echo(f"  note: {s['privacy_note']}")
