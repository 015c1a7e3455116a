"""``otafl run SPEC``: train FedSGD over the simulated channel and write the results."""

from __future__ import annotations

import os
from pathlib import Path

import click

from otafl.device import DEVICES


@click.command("run")
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a spec value, e.g. --set sampling.p=0.3 (repeatable).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder for summary.json and rounds.csv [default: runs/<spec name>].")
@click.option("--seed", type=int, default=None, help="Override train.seed.")
@click.option("--device", type=click.Choice(DEVICES), default=None,
              help="Where tensors live [default: the spec's train.device, auto].")
@click.option("--overwrite", is_flag=True,
              help="Replace summary.json and rounds.csv in an OUT folder that is not empty.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def run(spec, overrides, out_dir, seed, device, overwrite, quiet):
    """Train FedSGD over the wireless MAC described by SPEC (a TOML file).

    Without SPEC, every value takes its default (embedded MNIST, 200 users).
    Writes OUT/summary.json and OUT/rounds.csv only when the run finishes. An OUT folder
    that is not empty (an earlier run) is refused unless --overwrite; so is one that
    cannot be written, before the run starts.
    """
    from tqdm import tqdm

    from otafl.config import load_spec
    from otafl.fl.loop import run_experiment
    from otafl.errors import OtaflInputError
    from otafl.results import discard_run_dir, prepare_run_dir, write_run

    overrides = list(overrides) + ([f"train.seed={seed}"] if seed is not None else [])
    if out_dir is not None and not out_dir.strip():
        raise OtaflInputError("--out is empty; give an output folder such as runs/my-run")
    cfg = load_spec(spec, overrides)
    if out_dir is None:
        out_dir = os.path.join("runs", Path(spec).stem if spec else "default")
    created = prepare_run_dir(out_dir, overwrite=overwrite)  # refused here, before any training
    bars = []  # made at the first round, so that an error while loading data prints one line

    def on_round(rec: dict) -> None:
        if not bars:
            bars.append(tqdm(total=cfg.train.rounds, desc="rounds", unit="round", disable=quiet, leave=False,
                             dynamic_ncols=True))
        bar = bars[0]
        bar.update(1)
        if rec["test_accuracy"] == rec["test_accuracy"]:  # evaluated this round
            bar.set_postfix(acc=f"{rec['test_accuracy']:.3f}", K_t=rec["participants"])

    try:
        try:
            result = run_experiment(cfg, device=device, on_round=on_round)
        finally:
            for bar in bars:
                bar.close()
        try:
            write_run(out_dir, result.summary, result.rounds)  # all or nothing
        except OSError as e:
            raise OtaflInputError(f"cannot write the results to {out_dir!r}: {e.strerror or e}") from None
    except BaseException:
        discard_run_dir(created)  # a failed or interrupted run leaves no folder of ours behind
        raise
    s = result.summary
    click.echo(f"final test accuracy {s['final_test_accuracy']:.4f} after {s['rounds']} rounds; "
               f"mean participants {s['mean_participants']:.1f} of {s['users']}; "
               f"{s['wall_seconds']:.1f} s -> {out_dir}")
    for name in cfg.privacy.accountants:
        if f"{name}_epsilon_central" in s:
            click.echo(f"  {name}: per-round eps_local max {s[f'{name}_epsilon_local_max']:.4g}, "
                       f"eps_central {s[f'{name}_epsilon_central']:.4g}; over the run "
                       f"eps_central {s[f'{name}_epsilon_central_total']:.4g} "
                       f"({s.get(f'{name}_composition', '')})"
                       + ("" if s.get(f"{name}_classic_valid", True) else
                          "  [flagged: classic step with eps_0 > 1 or LDP amplified by p < 1; "
                          "not a guaranteed bound]"))
