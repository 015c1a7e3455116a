"""Lecture 2: three privacy accountants for over-the-air FL — paper, tight, exact.

A marimo notebook (a plain Python file):

    marimo edit lectures/02_accountants.py    # edit, with live sliders
    marimo run lectures/02_accountants.py     # serve as an app
    python lectures/02_accountants.py         # run headless (CI); prints one summary line

Every number comes from ``otafl.api``: ``bound_grid`` (paper and tight, local and central, on a
fine grid of p), ``accountant_curves`` (paper, tight and the numerical ``exact`` accountant on
a small grid of p: exact costs about 0.1-0.4 s per point) and ``scaling_curves`` (epsilon
against K, with log-log slopes). Every epsilon printed or plotted states its delta: the closed
forms' per-round delta grows as p falls (their tail delta'), exact's is the slider's.
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

    from otafl.api import PAPER_DIM, accountant_curves, bound_grid, scaling_curves
    from otafl.report.text import fmt_sig

    torch.set_num_threads(1)
    _ = torch.broadcast_shapes((1,), (1,))  # torch loads its shape helpers on first use: pay for it here
    return (
        Figure,
        PAPER_DIM,
        accountant_curves,
        bound_grid,
        fmt_sig,
        functools,
        math,
        mo,
        scaling_curves,
    )


@app.cell
def intro(mo):
    mo.md(r"""
    # Lecture 2 — how private is over-the-air FL? Three accountants

    One round (lecture 1): the server receives $\sum_{k \in K_t} g_k + N(0, \sigma_{z,t}^2 I_d)$ with
    $\sigma_{z,t}^2 = |K_t|\sigma^2 + N_0/c_t^2$. Neighbouring datasets differ in one record of one
    user, so that user's clipped gradient can move by $\Delta = 2L$.

    * **Local DP** (against the server): the other users may collude with the server and
      subtract their own signals; user $k$ is protected by its own $\sigma^2$ and the receiver noise.
    * **Central DP** (of the released model): the *other participants' noise* protects user $k$ too;
      the more participants, the more noise — and each user only joins with probability $p$
      (*amplification by sampling*).

    | accountant | what it computes |
    |---|---|
    | `paper` | the paper's closed form: Hoeffding lower quantile of the participant count $\lvert K_t \rvert$, classic Gaussian mechanism, amplification $q = p/(1-\delta')$ |
    | `tight` | the same argument with the exact Poisson-binomial quantile and the analytic Gaussian mechanism |
    | `exact` | the round's hockey-stick divergence integrated numerically, dimension-aware ($d = 7850$), no slack |

    Channel noise is left out here ($N_0 = 0$), as in the paper's central bound: only the
    artificial noise $\sigma^2$ protects.
    """)
    return


@app.cell
def controls(mo):
    users = mo.ui.slider(steps=[20, 50, 100, 200, 300], value=200, label="users K", show_value=True)
    sigma2 = mo.ui.slider(steps=[0.01, 0.03, 0.1, 0.3, 1.0], value=0.1, label="sigma^2", show_value=True)
    clip = mo.ui.slider(steps=[0.1, 0.3, 1.0, 3.0], value=1.0, label="clip L", show_value=True)
    delta = mo.ui.slider(steps=[1e-7, 1e-6, 1e-5, 1e-4, 1e-3], value=1e-5, label="delta", show_value=True)
    mo.vstack([mo.md("### Parameters"), mo.hstack([users, sigma2, clip, delta], justify="start")])
    return clip, delta, sigma2, users


@app.cell
def grids():
    # A fine grid for the closed forms (microseconds a point), a small one for exact
    # (a numerical integral per point; 6 points keep the cell under ~2 s).
    P_FINE = tuple(round(0.05 * i, 2) for i in range(1, 21))
    P_EXACT = (0.05, 0.1, 0.2, 0.4, 0.7, 1.0)
    return P_EXACT, P_FINE


@app.cell
def closed_forms(PAPER_DIM, P_FINE, bound_grid, clip, delta, sigma2, users):
    _res = bound_grid(users=[users.value], p=list(P_FINE), sigma2=[sigma2.value], clip=[clip.value],
                      snr_db=[10.0], accountants=["paper", "tight"], delta_l=delta.value, n0=0.0,
                      dim=PAPER_DIM, delta_target=None)  # one round: no totals, no delta_total
    closed = {name: [r for r in _res["rows"] if r["accountant"] == name] for name in ("paper", "tight")}
    return (closed,)


@app.cell
def exact_cache(accountant_curves, functools):
    @functools.lru_cache(maxsize=256)
    def exact_curves(users, sigma2, clip, delta_l, p):
        """paper, tight and exact central epsilon on the grid p (cached: revisiting a slider
        position is instant)."""
        return accountant_curves(p=p, users=users, sigma2=sigma2, clip=clip, delta_l=delta_l)

    return (exact_curves,)


@app.cell
def exact(P_EXACT, clip, delta, exact_curves, sigma2, users):
    curves = exact_curves(users.value, sigma2.value, clip.value, delta.value, P_EXACT)
    return (curves,)


@app.cell
def deltas(math):
    def delta_text(ds) -> str:
        """``1e-05`` or ``1.5e-05–0.0366``: the range of the finite deltas of a curve."""
        ds = sorted({d for d in ds if math.isfinite(d)})
        return "n/a" if not ds else f"{ds[0]:.3g}" + (f"–{ds[-1]:.3g}" if len(ds) > 1 else "")

    return (delta_text,)


@app.cell
def direction(P_EXACT, P_FINE, closed, curves, math):
    def _trend(p, eps, deltas):
        """Where a curve of epsilon over p is lowest, and what it does after that (each
        epsilon with its delta: ``d_first``, ``d_last``, ``d_min``)."""
        pts = [(pv, e, d) for pv, e, d in zip(p, eps, deltas) if math.isfinite(e)]
        if len(pts) < 2:
            return {"first": math.nan, "last": math.nan, "argmin": math.nan, "min": math.nan,
                    "d_first": math.nan, "d_last": math.nan, "d_min": math.nan,
                    "word": "undefined", "tail": "undefined"}
        p_min, e_min, d_min = min(pts, key=lambda t: t[1])
        return {"first": pts[0][1], "last": pts[-1][1], "argmin": p_min, "min": e_min,
                "d_first": pts[0][2], "d_last": pts[-1][2], "d_min": d_min,
                "word": "falls" if pts[-1][1] < pts[0][1] else "rises",  # end points
                "tail": "rises" if pts[-1][1] > e_min else "falls"}  # after the minimum

    trends = {name: _trend(P_FINE, [r["epsilon_central"] for r in closed[name]],
                           [r["delta_central"] for r in closed[name]]) for name in ("paper", "tight")}
    trends["exact"] = _trend(P_EXACT, curves["exact"]["epsilon"], curves["exact"]["delta"])
    return (trends,)


@app.cell
def central_figure(Figure, P_EXACT, P_FINE, closed, curves, delta_text, mo, trends, users):
    _fig = Figure(figsize=(10, 4.6), layout="constrained")
    _ax = _fig.subplots()
    _paper = [r["epsilon_central"] for r in closed["paper"]]
    _valid = [r["classic_valid"] for r in closed["paper"]]
    _d = {name: delta_text(r["delta_central"] for r in closed[name]) for name in ("paper", "tight")}
    _ax.semilogy(P_FINE, _paper, "C0-", label=f"paper, δ = {_d['paper']}")
    _ax.semilogy([p for p, v in zip(P_FINE, _valid) if not v], [e for e, v in zip(_paper, _valid) if not v],
                 "C0o", mfc="none", label="paper: classic step outside its range (eps_0 > 1)")
    _ax.semilogy(P_FINE, [r["epsilon_central"] for r in closed["tight"]], "C1-", label=f"tight, δ = {_d['tight']}")
    _ax.semilogy(P_EXACT, curves["exact"]["epsilon"], "C2s-", lw=2,
                 label=f"exact (numerical), δ = {delta_text(curves['exact']['delta'])}")
    _ax.set(xlabel="participation probability p", ylabel="central epsilon per round (at the legend's δ)",
            title=f"central epsilon of one round vs p (K = {users.value}, N0 = 0, d = 7850)")
    _ax.grid(True, which="both", alpha=0.3)
    _ax.legend(fontsize=8)
    def _where(name):
        t = trends[name]
        if t["tail"] == "falls":
            return (f"`{name}` falls all the way to p = 1 ({t['first']:.3g} at δ = {t['d_first']:.3g} → "
                    f"{t['last']:.3g} at δ = {t['d_last']:.3g})")
        return (f"`{name}` is lowest at p = {t['argmin']:g} ({t['min']:.3g} at δ = {t['d_min']:.3g}) and rises "
                f"to {t['last']:.3g} at p = 1 (δ = {t['d_last']:.3g})")

    mo.vstack([
        mo.md(f"""
    ### Central epsilon vs p: the direction flips

    Here {_where('paper')}; {_where('tight')}; {_where('exact')}.

    Each epsilon is at its own δ: the closed forms' per-round δ includes their tail probability
    δ' of too few participants, large where $p$ is small (above $1/K$ the guarantee means little);
    `exact` states its epsilon at the slider's δ.

    Where a curve falls, more participation *buys* privacy: the aggregated noise of more
    participants outweighs the weaker amplification. At the defaults ($K = 200$, $\\sigma^2 = 0.1$,
    $L = 1$, the paper's Table II a) the closed forms fall all the way while `exact` is lowest near
    $p = 0.1$ and then rises: the direction flips. The closed forms' fall at small $p$ comes from the
    slack of their concentration (Hoeffding) and classic-Gaussian steps, not from the mechanism.
    Try $L = 0.1$ (Table II b): the closed forms turn up as well.
    """),
        _fig,
    ])
    return


@app.cell
def scaling(PAPER_DIM, bound_grid, clip, delta, scaling_curves, sigma2):
    _users = [int(round(10 ** (2 + 4 * i / 20))) for i in range(21)]  # 10^2 ... 10^6
    scale = scaling_curves(users=_users, p=0.5, a=5.0, sigma2=sigma2.value, clip=clip.value,
                           delta_l=delta.value, accountants=["paper", "tight"])
    slopes = {(a, s): scale["slopes"][a][s]["slope"] for a in ("paper", "tight") for s in ("fixed_p", "sqrt_p")}
    # the per-round central delta of each plotted point (closed forms: microseconds a point)
    scale_deltas = {}
    for _s, _p_of in (("fixed_p", lambda k: 0.5), ("sqrt_p", lambda k: 5.0 / k ** 0.5)):
        for _k in _users:
            for _r in bound_grid(users=[_k], p=[_p_of(_k)], sigma2=[sigma2.value], clip=[clip.value], snr_db=[10.0],
                                 accountants=["paper", "tight"], delta_l=delta.value, dim=PAPER_DIM,
                                 delta_target=None)["rows"]:
                scale_deltas.setdefault((_r["accountant"], _s), []).append(_r["delta_central"])
    return scale, scale_deltas, slopes


@app.cell
def scaling_figure(Figure, delta_text, mo, scale, scale_deltas, slopes, users):
    _fig = Figure(figsize=(10, 4.4), layout="constrained")
    _ax = _fig.subplots()
    _K = scale["users"]
    for _name, _ls in (("paper", "-"), ("tight", "--")):
        _ax.loglog(_K, scale["curves"][_name]["fixed_p"], "C0" + _ls,
                   label=f"{_name}, p = 0.5 fixed: slope {slopes[(_name, 'fixed_p')]:.3f}, "
                         f"δ = {delta_text(scale_deltas[(_name, 'fixed_p')])}")
        _ax.loglog(_K, scale["curves"][_name]["sqrt_p"], "C3" + _ls,
                   label=f"{_name}, p = 5 / sqrt(K): slope {slopes[(_name, 'sqrt_p')]:.3f}, "
                         f"δ = {delta_text(scale_deltas[(_name, 'sqrt_p')])}")
    _ax.axvline(users.value, color="gray", lw=1, ls=":", label=f"K = {users.value} (slider)")
    _ax.set(xlabel="users K", ylabel="central epsilon per round",
            title="the paper's O(1/K^{3/4}): central epsilon vs K (theory: -1/2 and -3/4)")
    _ax.grid(True, which="both", alpha=0.3)
    _ax.legend(fontsize=8)
    mo.vstack([
        mo.md(r"""
    ### The $K^{-3/4}$ story (log-log slopes)

    Amplification multiplies the Gaussian step's $e^{\varepsilon_0} - 1 \approx \varepsilon_0$ by $q \approx p$,
    and $\varepsilon_0 \propto \Delta / (\sigma\sqrt{Kp})$ (the noise of $\approx Kp$ participants), so
    $\varepsilon_c \approx p \cdot \frac{1}{\sqrt{Kp}} = \sqrt{p / K}$: slope $-1/2$ at fixed $p$. Letting the
    participation shrink as $p = a/\sqrt K$ gives $\varepsilon_c \propto K^{-3/4}$ — the paper's headline,
    here with the fitted slopes of the paper's bound and of `tight`. The fit over $10^2 \le K \le 10^6$ is
    closest to theory where the Gaussian step's $\varepsilon_0 \ll 1$ (large $\sigma / L$: try $\sigma^2 = 1$ or $L = 0.1$).
    """),
        _fig,
    ])
    return


@app.cell
def local_figure(Figure, P_FINE, closed, delta_text, mo):
    _fig = Figure(figsize=(10, 4.2), layout="constrained")
    _ax = _fig.subplots()
    for _name, _c in (("paper", "C0"), ("tight", "C1")):
        _ax.semilogy(P_FINE, [r["epsilon_local"] for r in closed[_name]], _c + "-", lw=2,
                     label=f"{_name}: local, δ = {delta_text(r['delta_local'] for r in closed[_name])}")
        _ax.semilogy(P_FINE, [r["epsilon_central"] for r in closed[_name]], _c + ":",
                     label=f"{_name}: central, δ = {delta_text(r['delta_central'] for r in closed[_name])}")
    _ax.set(xlabel="participation probability p", ylabel="epsilon per round",
            title="local (against the server) vs central (of the released model)")
    _ax.grid(True, which="both", alpha=0.3)
    _ax.legend(fontsize=8)
    _tl = closed["tight"][0]["epsilon_local"]
    _tl_d = delta_text(r["delta_local"] for r in closed["tight"])
    mo.vstack([
        mo.md(f"""
    ### Local vs central

    Locally, only user $k$'s own $\\sigma^2$ protects it, so local epsilons are far larger than
    central ones. `paper` amplifies its local epsilon by $p$ — but the server can *see* who
    transmitted (the received energy differs), so that amplification is not a theorem for $p < 1$.
    `tight` does not amplify: its local epsilon is {_tl:.3g} whatever $p$ is (at δ = {_tl_d}: the
    slider's δ scaled by $p$, by joint convexity), and the audit (`otafl audit --scope local`) finds it attained.
    """),
        _fig,
    ])
    return


@app.cell
def table(P_EXACT, closed, curves, fmt_sig, mo):
    _by_p = {name: {r["p"]: r for r in closed[name]} for name in ("paper", "tight")}

    def _local(name, p, key):
        return fmt_sig(_by_p[name][p][key]) if p in _by_p[name] else None

    table_rows = [{
        "p": p,
        **{f"{name} central {col}": fmt_sig(curves[name][key][i])
           for name in ("paper", "tight", "exact") for col, key in (("ε", "epsilon"), ("δ", "delta"))},
        **{f"{name} local {col}": _local(name, p, key)
           for name in ("paper", "tight") for col, key in (("ε", "epsilon_local"), ("δ", "delta_local"))},
        "paper flagged": not curves["paper_classic_valid"][i],
    } for i, p in enumerate(P_EXACT)]
    mo.vstack([mo.md("### The numbers (per round)"), mo.ui.table(table_rows, selection=None)])
    return


@app.cell
def summary_line(clip, delta, mo, sigma2, slopes, trends, users):
    _t = trends
    summary = (
        f"lecture-02 summary: K={users.value} sigma2={sigma2.value} L={clip.value} delta={delta.value} | "
        f"central eps p=0.05->1: paper {_t['paper']['first']:.4g}->{_t['paper']['last']:.4g} ({_t['paper']['word']}) "
        f"at delta {_t['paper']['d_first']:.3g}->{_t['paper']['d_last']:.3g}, "
        f"tight {_t['tight']['first']:.4g}->{_t['tight']['last']:.4g} ({_t['tight']['word']}) "
        f"at delta {_t['tight']['d_first']:.3g}->{_t['tight']['d_last']:.3g}, "
        f"exact min {_t['exact']['min']:.4g} at p={_t['exact']['argmin']:g} then {_t['exact']['tail']} "
        f"to {_t['exact']['last']:.4g} at delta {_t['exact']['d_last']:.3g} | paper slopes fixed-p "
        f"{slopes[('paper', 'fixed_p')]:.3f} sqrt-p {slopes[('paper', 'sqrt_p')]:.3f}"
    )
    print(summary)
    mo.md(f"`{summary}`")
    return


if __name__ == "__main__":
    app.run()
