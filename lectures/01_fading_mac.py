"""Lecture 1: the fading MAC, power control, alignment and what the server receives.

A marimo notebook (a plain Python file):

    marimo edit lectures/01_fading_mac.py    # edit, with live sliders
    marimo run lectures/01_fading_mac.py     # serve as an app
    python lectures/01_fading_mac.py         # run headless (CI); prints one summary line

Every number comes from the library: the channel from ``otafl.setup.build_channel``, the
round from ``otafl.fl.round.ota_aggregate``, the estimators from ``otafl.estimate``.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def imports():
    import math

    import marimo as mo
    import torch
    from matplotlib.figure import Figure

    from otafl.api import PAPER_DIM
    from otafl.config import spec_from_mapping
    from otafl.estimate import estimate_known, estimate_unknown
    from otafl.fl.grads import StackedGradients
    from otafl.fl.round import ota_aggregate
    from otafl.sampling import draw_participants
    from otafl.setup import build_channel, make_generators

    torch.set_num_threads(1)
    return (
        Figure,
        PAPER_DIM,
        StackedGradients,
        build_channel,
        draw_participants,
        estimate_known,
        estimate_unknown,
        make_generators,
        math,
        mo,
        ota_aggregate,
        spec_from_mapping,
        torch,
    )


@app.cell
def intro(mo):
    mo.md(r"""
    # Lecture 1 — the fading MAC: power control, alignment, what the server receives

    $K$ users send their clipped gradients $g_k$ ($\|g_k\| \le L$) **at the same time, on
    the same frequencies**. The multiple-access channel (MAC) adds the signals up, so the
    server receives a noisy *sum* without ever seeing one user's gradient alone.

    * **Fading.** User $k$'s amplitude gain in block $t$ is
      $h_{k,t} = \left|\sqrt{G/(G+1)} + \sqrt{1/(G+1)}\, r_{k,t}\right|$ (Rician, $K$-factor $G$),
      with the scattered part an AR(1) process $r_{k,t} = \rho\, r_{k,t-1} + \sqrt{1-\rho^2}\, w_{k,t}$.
    * **Sampling.** Each user joins round $t$ with probability $p$: the random set $K_t$.
    * **Power control and alignment.** User $k$ sends $x_k = \alpha_k (g_k + n_k)$,
      $n_k \sim N(0, \sigma^2 I_d)$, with $\alpha_k = c_t / h_{k,t}$, so that every signal
      arrives with the same amplitude $c_t$. The budget $\alpha_k^2 (L^2 + d\sigma^2) \le P$
      forces $c_t \le h_{k,t}\sqrt{P/(L^2 + d\sigma^2)}$ for every user: the `min`
      policy takes $c_t = \min_k h_{k,t} \sqrt{P / (L^2 + d \sigma^2)}$ — **the worst fade sets
      the gain for everybody**.
    * **What the server receives**, divided by $c_t$:
      $y_t / c_t = \sum_{k \in K_t} g_k + \sum_{k \in K_t} n_k + m_t / c_t$, with $m_t \sim N(0, N_0 I_d)$,
      i.e. the sum of the gradients plus Gaussian noise of variance
      $\sigma_{z,t}^2 = |K_t|\,\sigma^2 + N_0 / c_t^2$ per coordinate.
    * **Estimators.** `known`: $\hat g = (y_t/c_t)/|K_t|$; `unknown`: $\hat g = (y_t/c_t)/\mu_t$,
      $\mu_t = \sum_k p_{k,t}$ (the server only knows the $p$'s).

    The model dimension is the paper's single-layer MNIST model, $d = 7850$; the transmit SNR is
    $P / (d N_0)$. The gradients below are synthetic (a shared direction plus a personal one,
    norm $\approx L$), so the estimator error is about the channel, not about learning.
    """)
    return


@app.cell
def controls(mo):
    users = mo.ui.slider(10, 300, step=10, value=50, label="users K", show_value=True)
    snr_db = mo.ui.slider(-10, 30, step=1, value=0, label="transmit SNR (dB)", show_value=True)
    sigma2 = mo.ui.slider(steps=[0.0, 0.0001, 0.001, 0.01, 0.1, 1.0], value=0.001,
                          label="artificial noise sigma^2", show_value=True)
    clip = mo.ui.slider(steps=[0.1, 0.3, 1.0, 3.0, 10.0], value=1.0, label="clip L", show_value=True)
    p = mo.ui.slider(0.05, 1.0, step=0.05, value=0.5, label="participation p", show_value=True)
    rician_k = mo.ui.slider(steps=[0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0], value=5.0,
                            label="Rician K-factor G", show_value=True)
    rho = mo.ui.slider(0.0, 1.0, step=0.05, value=0.9, label="AR(1) correlation rho", show_value=True)
    n0 = mo.ui.slider(steps=[0.0, 0.1, 1.0, 10.0], value=1.0, label="receiver noise N0", show_value=True)
    rounds = mo.ui.slider(20, 200, step=10, value=60, label="rounds T", show_value=True)
    seed = mo.ui.number(0, 1000, step=1, value=0, label="seed")
    mo.vstack([
        mo.md("### Parameters"),
        mo.hstack([users, snr_db, p], justify="start"),
        mo.hstack([sigma2, clip, n0], justify="start"),
        mo.hstack([rician_k, rho, rounds, seed], justify="start"),
    ])
    return clip, n0, p, rho, rician_k, rounds, seed, sigma2, snr_db, users


@app.cell
def channel(
    PAPER_DIM,
    build_channel,
    clip,
    make_generators,
    n0,
    p,
    rho,
    rician_k,
    rounds,
    seed,
    sigma2,
    snr_db,
    spec_from_mapping,
    users,
):
    # One spec, as a TOML file would give it; build_channel draws h[T, K] and p[T, K]
    # exactly as a training run of this spec and seed would.
    spec = spec_from_mapping({
        "data": {"users": users.value},
        "channel": {"fading": "ar-rician", "rician_k": rician_k.value, "rho": rho.value,
                    "n0": n0.value, "snr_db": float(snr_db.value)},
        "transmit": {"clip": clip.value, "sigma2": sigma2.value, "alignment": "min"},
        "sampling": {"scheme": "uniform", "p": p.value},
        "train": {"rounds": rounds.value, "seed": int(seed.value), "device": "cpu"},
    })
    dim = PAPER_DIM
    generators = make_generators(spec.train.seed)
    plan = build_channel(spec, dim=dim, generators=generators)
    return dim, generators, plan, spec


@app.cell
def gradients(dim, spec, torch):
    # Synthetic user gradients: a shared direction u plus a personal one v_k, norm ~ L.
    # The estimators target the full-participation mean of the *clipped* gradients.
    _g = torch.Generator().manual_seed(1000 + spec.train.seed)
    _K, _L = spec.data.users, spec.transmit.clip
    _u = torch.randn(dim, generator=_g)
    _u /= _u.norm()
    _v = torch.randn(_K, dim, generator=_g)
    _v /= _v.norm(dim=1, keepdim=True)
    user_grads = _L * (0.6 * _u + 0.8 * _v)
    _factor = (_L / user_grads.norm(dim=1)).clamp(max=1.0)
    target = (user_grads * _factor[:, None]).mean(0)
    return target, user_grads


@app.cell
def rounds_sim(
    StackedGradients,
    draw_participants,
    estimate_known,
    estimate_unknown,
    generators,
    math,
    ota_aggregate,
    plan,
    target,
    user_grads,
):
    # The rounds, one library call each: coins -> over-the-air aggregation -> estimators.
    rows = []
    _ref = float(target.pow(2).sum())
    for _t in range(plan.h.shape[0]):
        _active = draw_participants(plan.p[_t], generators["coins"])
        _agg = ota_aggregate(StackedGradients(user_grads[_active]), plan.h[_t], _active, plan.setup,
                             generators["noise"])
        _mu = float(plan.p[_t].sum())
        _known = estimate_known(_agg.aligned_sum, _agg.participants)
        _unknown = estimate_unknown(_agg.aligned_sum, _mu)
        _n = _agg.participants
        _signal = float(_agg.aligned_sum.pow(2).sum()) if _n else math.nan
        rows.append({
            "round": _t + 1,
            "participants": _n,
            "mu": _mu,
            "c_t": _agg.alignment_gain,
            "sigma_z2": _agg.effective_noise_var,
            "artificial": _n * float(plan.setup.noise_var[0]),
            "channel": plan.setup.n0 / _agg.alignment_gain ** 2 if plan.setup.n0 > 0 else 0.0,
            "err_known": math.nan if _known is None else float((_known - target).pow(2).sum()) / _ref,
            "err_unknown": math.nan if _unknown is None else float((_unknown - target).pow(2).sum()) / _ref,
            "noise_floor_known": (plan.setup.dim * _agg.effective_noise_var / _n ** 2) / _ref if _n else math.nan,
            "max_power_ratio": _agg.max_power_ratio,
        })
    return (rows,)


@app.cell
def channel_figure(Figure, mo, plan, rows):
    _T = len(rows)
    _t = list(range(1, _T + 1))
    _fig = Figure(figsize=(11, 7.2), layout="constrained")
    (_a, _b), (_c, _d) = _fig.subplots(2, 2)
    for _k in range(min(4, plan.h.shape[1])):
        _a.plot(_t, plan.h[:, _k].tolist(), lw=1, label=f"user {_k}")
    _a.plot(_t, plan.h.amin(1).tolist(), "k", lw=2, label="min over all K users")
    _a.set(title="channel gains h_{k,t} (AR(1) Rician)", xlabel="round t", ylabel="amplitude h")
    _a.legend(fontsize=8, ncols=2)

    _b.semilogy(_t, [r["c_t"] for r in rows], "C3", lw=2)
    _b.axhline(float(plan.setup.bound_scale[0]), color="gray", ls="--", lw=1,
               label="sqrt(P / (L^2 + d sigma^2)): c_t if h = 1")
    _b.set(title="alignment gain c_t = min_k h_k sqrt(P / (L^2 + d sigma^2))", xlabel="round t", ylabel="c_t")
    _b.legend(fontsize=8)

    _c.semilogy(_t, [max(r["artificial"], 1e-12) for r in rows], "C0", label="artificial |K_t| sigma^2")
    _c.semilogy(_t, [max(r["channel"], 1e-12) for r in rows], "C1", label="channel N0 / c_t^2")
    _c.semilogy(_t, [r["sigma_z2"] for r in rows], "k", lw=2, label="sigma_z^2 (their sum)")
    _c.set(title="effective noise variance per coordinate (gradient units)", xlabel="round t",
           ylabel="variance")
    _c.legend(fontsize=8)

    _d.step(_t, [r["participants"] for r in rows], where="mid", label="|K_t| (who transmitted)")
    _d.plot(_t, [r["mu"] for r in rows], "k--", label="mu_t = sum_k p")
    _d.set(title="participants", xlabel="round t", ylabel="users", ylim=(0, None))
    _d.legend(fontsize=8)
    mo.vstack([mo.md("### The channel, the alignment gain and the noise the server sees"), _fig])
    return


@app.cell
def estimator_figure(Figure, math, mo, rows):
    _t = [r["round"] for r in rows]
    _fig = Figure(figsize=(11, 3.6), layout="constrained")
    _ax = _fig.subplots()
    _ax.semilogy(_t, [r["err_known"] for r in rows], "o-", ms=3, label="known |K_t|: (y/c)/|K_t|")
    _ax.semilogy(_t, [r["err_unknown"] for r in rows], "s-", ms=3, label="unknown |K_t|: (y/c)/mu_t")
    _ax.semilogy(_t, [r["noise_floor_known"] for r in rows], "k:", label="noise part of known: d sigma_z^2 / |K_t|^2")
    _ax.set(title="relative estimator error ||g_hat - g||^2 / ||g||^2 per round", xlabel="round t",
            ylabel="relative squared error")
    _ax.legend(fontsize=8)

    def _mean(key):
        vals = [r[key] for r in rows if not math.isnan(r[key])]
        return sum(vals) / len(vals) if vals else math.nan

    err_known, err_unknown = _mean("err_known"), _mean("err_unknown")
    mo.vstack([
        mo.md(
            f"""
            ### What the server's estimate is worth

            Mean relative error over the rounds: **known {err_known:.3g}**, **unknown {err_unknown:.3g}**.
            The known-count estimator divides by the true $|K_t|$; the unknown one by $\\mu_t$,
            so it also carries the error of $|K_t| / \\mu_t \\neq 1$ (largest when $p$ is small).
            Both are dominated by $d\\,\\sigma_z^2 / |K_t|^2$ when $c_t$ is small (a deep fade, a
            low SNR) or $\\sigma^2$ is large: each coordinate is noisy, and there are $d$ of them.
            """
        ),
        _fig,
    ])
    return err_known, err_unknown


@app.cell
def summary_line(err_known, err_unknown, mo, rows, spec):
    _n = len(rows)
    _c = sorted(r["c_t"] for r in rows)
    summary = (
        f"lecture-01 summary: K={spec.data.users} T={_n} snr_db={spec.channel.snr_db} "
        f"sigma2={spec.transmit.sigma2} L={spec.transmit.clip} p={spec.sampling.p} "
        f"G={spec.channel.rician_k} rho={spec.channel.rho} N0={spec.channel.n0} | "
        f"median c_t={_c[_n // 2]:.4g} "
        f"mean sigma_z^2={sum(r['sigma_z2'] for r in rows) / _n:.4g} "
        f"mean |K_t|={sum(r['participants'] for r in rows) / _n:.2f} "
        f"max power ratio={max(r['max_power_ratio'] for r in rows):.3f} | "
        f"rel. error known={err_known:.4g} unknown={err_unknown:.4g}"
    )
    print(summary)
    mo.md(f"`{summary}`")
    return


if __name__ == "__main__":
    app.run()
