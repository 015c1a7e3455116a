"""The ``channel`` figure: gain traces and participation over time, one column per facet value."""

from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from otafl.report.plots.common import curve_colors, facet_title, split_facets
from otafl.report.table import RunGroup
from otafl.sweep.store import ResultStore, StoredRun

__all__ = ["CHANNEL_WINDOW", "channel_figure", "regenerate_gains"]

CHANNEL_WINDOW = 200  # rounds shown in the channel traces
_GROUP_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink"]


def regenerate_gains(run: StoredRun):
    """The run's fading draw h [T, K] (float64), each user's SNR group [K] and the groups'
    SNRs, recomputed from its stored spec by :func:`otafl.setup.build_channel` (the loop's
    own channel setup: the same spec and seed give the same h)."""
    from otafl.config import spec_from_dict
    from otafl.setup import build_channel

    plan = build_channel(spec_from_dict(run.params), dim=int(run.summary.get("dim") or 1))
    return plan.h, plan.groups, list(plan.snr_db)


def _first(runs: Sequence[StoredRun]) -> StoredRun:
    return min(runs, key=lambda r: (r.params["train"]["seed"], r.id))


def _legend_right(axes_row: Sequence, **kwargs) -> None:
    """One legend right of the row's last panel, one entry per label of the row."""
    handles, labels = [], []
    for ax in axes_row:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    axes_row[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=11, **kwargs)


def channel_figure(fig: Figure, store: ResultStore, groups: list[RunGroup], *, facet: str | None = None, **_) -> None:
    """Top row: the gain h_{k,t} of one user per SNR group (first seed) and the mean gain
    over users; bottom row: |K_t| (solid) and mu_t (dashed) per configuration."""
    facets = split_facets(groups, facet)
    axes = fig.subplots(2, len(facets), squeeze=False, sharex=True, sharey="row")
    colors = curve_colors(groups, facet)
    many = len(facets) > 1
    for col, (value, fgroups) in enumerate(facets):
        ax_h, ax_k = axes[0][col], axes[1][col]
        first = _first([r for g in fgroups for r in g.runs])
        recs = store.rounds(first.id)
        T = len(recs)
        window = min(T, CHANNEL_WINDOW)
        xs = list(range(1, window + 1))
        h, user_group, snr = regenerate_gains(first)
        stored_mean = [rec["mean_gain"] for rec in recs]
        consistent = (h.shape[0] == T and all(abs(float(m) - s) <= 1e-9 * max(1.0, abs(s))
                                              for m, s in zip(h.mean(dim=1), stored_mean)))
        if consistent:  # one representative user (the first) of each SNR group
            for j, s in enumerate(snr):
                users = (user_group == j).nonzero().flatten()
                if users.numel():
                    k = int(users[0])
                    label = f"user {k} (SNR group {j + 1})" if many else f"user {k} ({s:g} dB group)"
                    ax_h.plot(xs, h[:window, k].tolist(), linewidth=1.4, color=_GROUP_COLORS[j % 6], label=label)
        ax_h.plot(xs, stored_mean[:window], color="black", linewidth=2.4, label="mean over all users")
        where = facet_title(facet, value)
        ax_h.set_title((f"{where}\n" if where else "") + f"seed {first.params['train']['seed']}"
                       + (f", first {window} of {T} rounds" if window < T else ""), fontsize=13)
        for g in fgroups:
            run = _first(g.runs)
            rr = store.rounds(run.id)[:window]
            label = g.label_without([facet] if facet else [])
            ax_k.plot(xs[:len(rr)], [r["participants"] for r in rr], color=colors[label], linewidth=1.3, alpha=0.85,
                      label=label)
            ax_k.plot(xs[:len(rr)], [r["expected_participants"] for r in rr], color=colors[label], linewidth=1.0,
                      linestyle="--")
        ax_k.set_xlabel("round t")
        ax_k.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        ax_k.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    axes[0][0].set_ylabel("channel gain h (amplitude)")
    axes[1][0].set_ylabel("participants |K_t| (users)")
    fig.suptitle("Fading and participation")
    _legend_right(axes[0])
    _legend_right(axes[1], title="solid: |K_t|\ndashed: μ_t", title_fontsize=11)
