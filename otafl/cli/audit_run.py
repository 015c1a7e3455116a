"""``otafl audit-run SPEC``: the end-to-end privacy audit of the simulator's own runs.

Parses the options and calls :func:`otafl.api.audit_run.audit_run` (the method is described
there and in docs/privacy/auditing.md#auditing); prints one line per accountant (its epsilon, delta
and privacy unit beside the audit's lower bounds at that delta) or JSON.
"""

from __future__ import annotations

import click

from otafl.names import DEVICES
from otafl.report.text import fmt_sig
from otafl.validation import AUDIT_SCOPES


def _fmt(value) -> str:
    return "-" if value is None else fmt_sig(value)


def audit_run_text(result: dict) -> str:
    """One line per accountant: upper epsilon, delta and unit, the audit's lower bound (fitted, and
    the threshold test's) at that delta, and a verdict; then the fit, and every reason for an inf or 0."""
    from otafl.privacy.units import UNIT_LABELS

    meta = result["meta"]
    rounds = result["rounds"] + int(meta["warm_start"])
    lines = [f"audit-run: {meta['algorithm']} over {meta['aggregation']}"
             + (f" ({meta['mechanism']})" if meta["mechanism"] else "")
             + f", {meta['users']} users, d = {meta['dim']}, co-users {meta['co_users']}, scope {result['scope']}, "
               f"{result['trials']} runs of {rounds} transmission{'s' if rounds != 1 else ''} per data set "
               f"({meta['wall_seconds']:.1f} s)"]
    width = max(len(n) for n in result["accountants"])
    fitted = result["fit"] != "none"
    for name, row in result["accountants"].items():
        verdict = "ok" if not row["exceeded"] else (
            "BOUND EXCEEDED: UNSOUND" if row["guaranteed"] else "exceeded (not a guaranteed bound)")
        main = " (main)" if name == result["main"] else ""
        at = f"at delta {fmt_sig(row['delta'])}, {UNIT_LABELS.get(row['unit'], row['unit'])}"
        threshold = f"; threshold test >= {_fmt(row['epsilon_lower_threshold'])}" if fitted else ""
        lines.append(f"  {name:<{width}}  upper eps {_fmt(row['epsilon'])} {at};  "
                     f"audit eps >= {_fmt(row['epsilon_lower'])}{threshold}  {verdict}{main}")
    lines.append(f"  fit: {result['fit']}" + (f", mu >= {fmt_sig(result['mu_lower'])}" if fitted else "")
                 + f" (95%); {meta['fit_note']}")
    for name, row in result["accountants"].items():
        if row["reason"] and (row["epsilon"] in (0.0, float("inf")) or not row["guaranteed"]):
            lines.append(f"  {name}: {row['reason']}")
    if meta.get("privacy_note"):
        lines.append(f"  note: {meta['privacy_note']}")
    return "\n".join(lines) + "\n"


@click.command("audit-run")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a spec value, e.g. --set audit.trials=5000 (repeatable).")
@click.option("--trials", type=int, default=None,
              help="Runs (of train.rounds rounds) per neighbouring data set [default: audit.trials].")
@click.option("--scope", type=click.Choice(AUDIT_SCOPES), default=None,
              help="central: the released update; local: what the server receives from the target "
                   "[default: audit.scope].")
@click.option("--seed", type=int, default=None, help="Seed of the trials' randomness [default: audit.seed].")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def audit_run(spec, overrides, trials, scope, seed, fmt, device, quiet):
    """Audit the simulator's runs on worst-case neighbouring data sets beside every accountant."""
    from otafl.config import load_audit_spec

    extra = [f"audit.{k}={v!r}" if isinstance(v, str) else f"audit.{k}={v}"
             for k, v in (("trials", trials), ("scope", scope), ("seed", seed)) if v is not None]
    cfg, audit = load_audit_spec(spec, list(overrides) + extra)  # validated before torch loads

    from otafl.api.audit_run import audit_run as run_audit
    from otafl.device import resolve_device
    from otafl.progress import progress_bar
    from otafl.report.text import json_text

    with progress_bar("audit-run", quiet=quiet, unit="trial") as progress:
        result = run_audit(cfg, audit, device=resolve_device(device), progress=progress)
    click.echo(json_text(result) if fmt == "json" else audit_run_text(result), nl=fmt == "json")
