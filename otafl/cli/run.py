"""``otafl run SPEC``: train FedSGD over the simulated channel and write the results."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import click

from otafl.names import DEVICES


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
    from otafl.config import load_spec
    from otafl.errors import OtaflInputError

    overrides = list(overrides) + ([f"train.seed={seed}"] if seed is not None else [])
    if out_dir is not None and not out_dir.strip():
        raise OtaflInputError("--out is empty; give an output folder such as runs/my-run")
    cfg = load_spec(spec, overrides)  # validated before torch loads (tests/test_cli_startup.py)

    from tqdm import tqdm

    from otafl.api.run import run_to_folder
    from otafl.cli.options import forget_caught_interrupt
    from otafl.publish import PublishConflict
    from otafl.report.text import run_text

    if out_dir is None:
        out_dir = os.path.join("runs", Path(spec).stem if spec else "default")
    bars = []  # made at the first round, so that an error while loading data prints one line

    def on_round(rec: dict) -> None:
        if not bars:
            bars.append(tqdm(total=cfg.train.rounds, desc="rounds", unit="round", disable=quiet, leave=False,
                             dynamic_ncols=True))
        bars[0].update(1)
        if rec["test_accuracy"] == rec["test_accuracy"]:  # evaluated this round
            bars[0].set_postfix(acc=f"{rec['test_accuracy']:.3f}", K_t=rec["participants"])

    def terminated(signum, frame):  # SIGTERM: clean up like Ctrl-C (no partial folder), one line
        click.echo(f"error: terminated by {signal.Signals(signum).name}; no results written to {out_dir}", err=True)
        raise SystemExit(128 + signum)

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, terminated) if main_thread else None
    try:
        result = run_to_folder(cfg, out_dir, overwrite=overwrite, device=device, on_round=on_round)
    except PublishConflict as e:  # another run published OUT while this one trained: nothing replaced
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # Ctrl-C: cleaned up like SIGTERM (no partial folder), one line, exit 130
        if main_thread:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        forget_caught_interrupt()
        for bar in bars:
            bar.close()
        click.echo(f"error: interrupted; no results written to {out_dir}", err=True)
        raise SystemExit(130) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old)
        for bar in bars:
            bar.close()
    click.echo(run_text(result.summary, cfg.privacy.accountants, out_dir), nl=False)
    overflowed, rounds = result.summary.get("overflow_rounds"), result.summary.get("rounds")
    if overflowed and rounds and overflowed >= rounds:
        click.echo(f"error: the digital sum overflowed 2^digital.bits in all {rounds} rounds, so the model never "
                   f"moved (digital.scale = {cfg.digital.scale!r} with digital.bits = {cfg.digital.bits}); lower "
                   f"digital.scale or use 'auto'; see {out_dir}/summary.json", err=True)
        raise SystemExit(1)
    at = result.summary.get("diverged_at_round")
    if at is not None:
        click.echo(f"error: training diverged at round {at} of {cfg.train.rounds} (the loss or the model became "
                   f"NaN/inf; lower train.lr or check the noise); stopped there, see {out_dir}/summary.json", err=True)
        raise SystemExit(1)
