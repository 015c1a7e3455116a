"""A run's privacy: per-round bounds of each accountant composed over rounds, as typed results.

:func:`account_run` reads the run's :class:`~otafl.privacy.facts.RoundFacts`, evaluates
every named accountant, composes local and central totals and returns a
:class:`PrivacyResult`, a mapping name -> :class:`AccountantResult`. ``paper`` and
``tight`` are evaluated on all rounds at once and composed by :func:`compose_round_bounds`
(the smallest of basic, advanced, RDP and PLD composition at one total delta);
``exact`` per distinct rounded round and composed by PLD (:func:`_account_exact`,
:mod:`otafl.privacy.accountants.exact_run`; docs/privacy/composition.md#composition). ``PrivacyResult.summary_fields()`` gives the
flat ``"{name}_..."`` columns that run stores, tables and plots read.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants.base import (
    CENTRAL_REASONS,
    REASON_BEYOND_RANGE,
    REASON_NO_CENTRAL_NOISE,
    REASON_NO_LOCAL_NOISE,
    RoundBound,
    reason_text,
)
from otafl.privacy.accountants.exact_run import (
    DEFAULT_RESOLUTION,
    Resolution,
    compose_exact_rounds,
    row_epsilons,
    run_row_keys,
)
from otafl.privacy.accountants.registry import STEPS_ACCOUNTANTS, get_accountant
from otafl.privacy.accountants.result import AccountantResult, PrivacyResult, explained, unreachable_reason
from otafl.privacy.accountants.steps_run import account_steps
from otafl.privacy.accountants.digital_run import account_digital_run
from otafl.privacy.analysis.composition import COMPOSITIONS, compose_best
from otafl.privacy.analysis.concentration import AutoShare
from otafl.privacy.csi import has_mismatch, refuse_unless_supported, target_frame
from otafl.privacy.facts import RoundFacts, stack_facts

__all__ = [
    "compose_round_bounds",
    "composition_name",
    "AccountantResult",
    "PrivacyResult",
    "account_run",
    "exact_total",
    "split_share",
]


def compose_round_bounds(bound: RoundBound, *, delta_target=None, delta_slack, rdp_resolution: float = 1e-2,
                         pld: bool = True, local_revealed_rate=None) -> dict[str, Tensor]:
    """Totals over the last dimension (rounds) of a RoundBound with fields [..., T].

    Local and central each take the smallest of basic, advanced and RDP composition
    (:func:`otafl.privacy.analysis.composition.compose_best`) at one total delta: ``delta_target``
    or, by default, the basic composition's delta plus ``delta_slack``. RDP uses the
    round's sampled-Gaussian view (rate, noise std / Delta); the central total adds
    sum_t delta'_t for the concentration events.

    With ``pld=True`` (the default; ``False`` keeps the older three) the central total may
    also be a PLD composition of the same view
    (the fixed-noise model's replace-one pair, converted at the target minus
    sum_t delta'_t), and, where ``local_revealed_rate`` [..., T] is given (``tight``: max_k
    p_k), the local total a PLD composition of the revealed-participation pair
    (:mod:`otafl.privacy.analysis.pld_gaussian`); one PLD per leading index.

    Returns
    -------
    dict of [...] tensors: ``epsilon_local_total``, ``delta_local_total``,
    ``composition_local`` (index into COMPOSITIONS), ``epsilon_central_total``,
    ``delta_central_total``, ``composition_central``.
    """
    def rdp_view(rate, std):
        if rate is None or std is None:
            return None, None
        return rate, std / bound.sensitivity

    q_l, z_l = rdp_view(bound.local_sampling_rate, bound.local_noise_std)
    local = compose_best(epsilon=bound.epsilon_local, delta=bound.delta_local, delta_target=delta_target,
                         delta_slack=delta_slack, sampling_rate=q_l, noise_multiplier=z_l,
                         rdp_resolution=rdp_resolution)
    q_c, z_c = rdp_view(bound.central_sampling_rate, bound.central_noise_std)
    central = compose_best(epsilon=bound.epsilon_central, delta=bound.delta_central, delta_target=delta_target,
                           delta_slack=delta_slack, sampling_rate=q_c, noise_multiplier=z_c,
                           event_delta=bound.delta_prime, rdp_resolution=rdp_resolution)
    if pld and q_c is not None:
        _with_pld(central, bound.epsilon_central, bound.delta_central, delta_target, delta_slack, q_c, z_c,
                  event_delta=bound.delta_prime, revealed=False)
    if pld and local_revealed_rate is not None and z_l is not None:
        _with_pld(local, bound.epsilon_local, bound.delta_local, delta_target, delta_slack,
                  torch.as_tensor(local_revealed_rate, dtype=torch.float64), z_l, event_delta=None, revealed=True)
    return {
        "epsilon_local_total": local["epsilon"], "delta_local_total": local["delta"],
        "composition_local": local["composition"],
        "epsilon_central_total": central["epsilon"], "delta_central_total": central["delta"],
        "composition_central": central["composition"],
    }


def _with_pld(best: dict, epsilon, delta, delta_target, delta_slack, rate, z, *, event_delta, revealed) -> None:
    """Replace ``best``'s entries by the PLD composition where it is smaller (in place)."""
    from otafl.privacy.analysis.pld_gaussian import gaussian_rounds_epsilon

    T = epsilon.shape[-1]
    batch = best["epsilon"].shape
    target = (delta.sum(-1).clamp(max=1.0) + delta_slack).clamp(max=1.0) if delta_target is None else \
        torch.as_tensor(delta_target, dtype=torch.float64).expand(batch)
    target = torch.broadcast_to(target, batch)
    extra = torch.zeros(batch, dtype=torch.float64) if event_delta is None else \
        torch.broadcast_to(event_delta, epsilon.shape).sum(-1)
    rate, z = torch.broadcast_to(rate, epsilon.shape), torch.broadcast_to(z, epsilon.shape)
    eps, tgt, ex = best["epsilon"].reshape(-1), target.reshape(-1), extra.reshape(-1)
    rate, z = rate.reshape(-1, T), z.reshape(-1, T)
    for i in range(eps.numel()):
        e = gaussian_rounds_epsilon(rate=rate[i], noise_multiplier=z[i], delta_target=float(tgt[i] - ex[i]),
                                    revealed=revealed)
        if e < float(eps[i]):
            best["epsilon"].view(-1)[i] = e
            best["delta"].view(-1)[i] = tgt[i]
            best["composition"].view(-1)[i] = COMPOSITIONS.index("pld")


def composition_name(index: int) -> str:
    """Name of a composition index from :func:`compose_round_bounds` ('none' for -1)."""
    return COMPOSITIONS[index] if index >= 0 else "none"


def account_run(facts: list[RoundFacts], *, accountants: Sequence[str], delta_l: float,
                delta_prime: float | str = "auto", delta_target: float | None = None,
                rdp_resolution: float = 1e-2, exact_resolution: Resolution = DEFAULT_RESOLUTION,
                digital_delta_total: float | None = None) -> PrivacyResult:
    """Per-round and whole-run privacy of a training run, for each named accountant.

    Parameters
    ----------
    facts : one :class:`RoundFacts` per round (T >= 1, same K every round).
    accountants : names in :data:`ACCOUNTANTS`.
    delta_l : delta of the Gaussian step, in (0, 1).
    delta_prime : number in (0, 1) or "auto" (2 exp(-2 mu_t^2/K) + 1e-5 per round; with a
        ``delta_target``, 2 exp(-2 mu_t^2/K) + delta_target / (2T), :func:`split_share`).
    delta_target : delta_total, the one total delta of every accountant's totals (runs pass
        ``privacy.delta_total``); None: each accountant's own, the basic composition's
        total delta plus delta_l.
    rdp_resolution : conservative grid for the Opacus calls (see :mod:`otafl.privacy.analysis.rdp`).
    exact_resolution : the pessimistic grids of ``exact``'s cached rounds
        (:class:`~otafl.privacy.accountants.exact_run.Resolution`; ``NO_ROUNDING`` for none).

    digital_delta_total : ``digital``'s total delta (None: its own default, see
        :func:`~otafl.privacy.accountants.digital_run.account_digital_run`).

    ``exact`` is evaluated per distinct (rounded) round and composed by privacy-loss
    distributions (:func:`_account_exact`); ``paper`` and ``tight`` per round on all rounds
    at once, composed by :func:`compose_round_bounds`; ``steps`` and ``digital`` by their own
    run-level composers (:func:`~otafl.privacy.accountants.steps_run.account_steps`,
    :func:`~otafl.privacy.accountants.digital_run.account_digital_run`), which read the
    facts' local-step and digital-mechanism fields.

    Returns
    -------
    :class:`PrivacyResult` (accountants in the order given); JSON-able through
    :meth:`PrivacyResult.summary_fields` (``json.dumps`` writes +inf as ``Infinity``).
    """
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if delta_target is not None:
        check_range("delta_target", delta_target, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    refuse_unless_supported(facts, accountants)  # estimated CSI: only exact, tight, paper read the mismatch
    x_own = None
    if has_mismatch(facts):  # tight, paper: the perfect-CSI round that dominates each (docs/privacy/csi.md#csi)
        x_own = stack_facts([target_frame(f, scale_own=False) for f in facts])  # LDP: the own noise as it is
        x = stack_facts([target_frame(f, scale_own=True) for f in facts])  # central: the others' noise times kappa
    else:
        x = stack_facts(facts)
    results: dict[str, AccountantResult] = {}
    share = split_share(delta_prime, delta_target, len(facts))
    for name in accountants:
        acc = get_accountant(name)
        if name in STEPS_ACCOUNTANTS:
            results[name] = account_steps(facts, delta_l=delta_l, delta_prime=delta_prime if share is None else share,
                                          delta_target=delta_target,
                                          credit=STEPS_ACCOUNTANTS[name])
            continue
        if name == "digital":
            results[name] = account_digital_run(facts, delta_l=delta_l, delta_total=digital_delta_total)
            continue
        if name == "exact":
            results[name] = _account_exact(facts, x, delta_l=delta_l, delta_target=delta_target,
                                           resolution=exact_resolution)
            continue
        dp = delta_prime if share is None else AutoShare(share)
        bound = acc.bound(participation_prob=x["participation_prob"], noise_var=x["noise_var"],
                          alignment_gain=x["alignment_gain"], n0=x["n0"], sensitivity=x["sensitivity"],
                          delta_l=delta_l, delta_prime=dp, dim=x["dim"])
        if x_own is not None:  # estimated CSI: the local (n = 0) half from the round with the own noise unscaled
            bound = _with_local(bound, acc.bound(participation_prob=x_own["participation_prob"],
                                                 noise_var=x_own["noise_var"], alignment_gain=x_own["alignment_gain"],
                                                 n0=x_own["n0"], sensitivity=x_own["sensitivity"], delta_l=delta_l,
                                                 delta_prime=dp, dim=x_own["dim"]))
        revealed = x["participation_prob"].amax(-1) if name == "tight" else None  # tight's unamplified LDP
        totals = compose_round_bounds(bound, delta_target=delta_target, delta_slack=delta_l,
                                      rdp_resolution=rdp_resolution, pld=True, local_revealed_rate=revealed)
        reason = 0
        for code in bound.reason.tolist():
            reason |= int(code)
        total_reason = _unreached(bound, totals, delta_target)
        results[name] = AccountantResult(
            name=name,
            epsilon_local_max=float(bound.epsilon_local.max()),
            delta_local=float(bound.delta_local.max()),
            epsilon_central=float(bound.epsilon_central.max()),
            delta_central=float(bound.delta_central.max()),
            epsilon_local_total=float(totals["epsilon_local_total"]),
            delta_local_total=float(totals["delta_local_total"]),
            epsilon_central_total=float(totals["epsilon_central_total"]),
            delta_central_total=float(totals["delta_central_total"]),
            composition_central=composition_name(int(totals["composition_central"])),
            composition_local=composition_name(int(totals["composition_local"])),
            defined=bool(reason == 0),
            reason=reason_text(reason),
            classic_valid=bool((bound.classic_valid & bound.classic_valid_local).all()),
            epsilon_central_per_round=tuple(float(v) for v in bound.epsilon_central.tolist()),
            epsilon_local_per_round=tuple(float(v) for v in bound.epsilon_local.tolist()),
            total_reason=total_reason,
        )
    return PrivacyResult({name: explained(r, delta_target) for name, r in results.items()})


def _with_local(central: RoundBound, local: RoundBound) -> RoundBound:
    """``central``'s central half with ``local``'s local half (estimated CSI: a target's LDP has no
    others, so its own noise is not lowered; docs/privacy/csi.md#csi-the-dominating-round)."""
    import dataclasses

    keep = central.reason & CENTRAL_REASONS
    beyond = torch.where(torch.isinf(central.epsilon_central), central.reason & REASON_BEYOND_RANGE,
                         torch.zeros_like(central.reason))
    return dataclasses.replace(central, epsilon_local=local.epsilon_local, delta_local=local.delta_local,
                               local_noise_std=local.local_noise_std, local_sampling_rate=local.local_sampling_rate,
                               classic_valid_local=local.classic_valid_local,
                               reason=keep | beyond | (local.reason & ~CENTRAL_REASONS))


def split_share(delta_prime, delta_target: float | None, rounds: int) -> float | None:
    """The per-round share of ``delta_target`` that ``delta_prime = "auto"`` spends on the
    participant-count tails: delta_target / (2 T), so that the T rounds' tails take at most
    half of it and the composition the rest (docs/privacy/composition.md#delta-total). ``paper`` and
    ``tight``: delta'_t = 2 exp(-2 mu_t^2 / K) + share; ``steps``: its count-tail probability.
    None (the accountants' own per-round "auto") without a target or with a numeric delta'."""
    if delta_target is None or not isinstance(delta_prime, str) or delta_prime != "auto":
        return None
    return float(delta_target) / (2.0 * rounds)


def _unreached(bound: RoundBound, totals: dict, delta_target: float | None) -> str:
    """Why a paper/tight total is +inf at ``delta_target`` although every round is finite:
    central, the concentration events sum_t delta'_t (charged outside the composition);
    local, the per-round deltas (only basic/advanced compose them)."""
    if delta_target is None:
        return ""
    out = []
    if not math.isfinite(float(totals["epsilon_central_total"])) and bool(torch.isfinite(bound.epsilon_central).all()):
        tails = float(torch.broadcast_to(bound.delta_prime, bound.epsilon_central.shape).sum())
        out.append(unreachable_reason("central", tails, delta_target, "concentration tails sum_t delta'_t"))
    if not math.isfinite(float(totals["epsilon_local_total"])) and bool(torch.isfinite(bound.epsilon_local).all()):
        out.append(unreachable_reason("local", float(bound.delta_local.sum()), delta_target,
                                      "per-round deltas sum_t delta_t"))
    return "; ".join(out)


def _account_exact(facts: list[RoundFacts], x: dict, *, delta_l: float, delta_target: float | None,
                   resolution: Resolution) -> AccountantResult:
    """``exact`` over a run: rounded, cached rows per round, PLD totals (docs/privacy/composition.md#pld-composition).

    Per round and totals: :func:`exact_total`, central and local.
    """
    p, var = x["participation_prob"], x["noise_var"]
    gain, n0 = x["alignment_gain"], x["n0"]
    ch = torch.where(n0 == 0, torch.zeros_like(n0), n0 / (gain * gain))
    active = p > 0
    min_var = torch.where(active, var, torch.full_like(var, math.inf)).amin(-1)
    min_var = torch.where(torch.isinf(min_var), var.amin(-1), min_var)
    no_central = (min_var == 0) & (ch == 0)
    no_local = (((var + ch[:, None]) == 0) & active).any(-1)
    delta_local = p.amax(-1) * delta_l
    out = {kind: exact_total(facts, kind, delta_l=delta_l, delta_target=delta_target, resolution=resolution)
           for kind in ("central", "local")}
    eps_c, eps_l = out["central"]["per_round"], out["local"]["per_round"]
    reason = 0
    if bool((torch.isinf(eps_c) & no_central).any()):
        reason |= REASON_NO_CENTRAL_NOISE
    if bool((torch.isinf(eps_l) & no_local).any()):
        reason |= REASON_NO_LOCAL_NOISE
    if bool((torch.isinf(eps_c) & ~no_central).any() | (torch.isinf(eps_l) & ~no_local).any()):
        reason |= REASON_BEYOND_RANGE
    return AccountantResult(
        name="exact", epsilon_local_max=float(eps_l.max()), delta_local=float(delta_local.max()),
        epsilon_central=float(eps_c.max()), delta_central=float(delta_l),
        epsilon_local_total=out["local"]["epsilon"], delta_local_total=out["local"]["delta"],
        epsilon_central_total=out["central"]["epsilon"], delta_central_total=out["central"]["delta"],
        composition_central=out["central"]["composition"], composition_local=out["local"]["composition"],
        defined=reason == 0, reason=reason_text(reason), classic_valid=True,
        epsilon_central_per_round=tuple(eps_c.tolist()), epsilon_local_per_round=tuple(eps_l.tolist()))


def exact_total(facts: Sequence[RoundFacts], kind: str, *, delta_l: float, delta_target: float | None = None,
                resolution: Resolution = DEFAULT_RESOLUTION) -> dict:
    """``exact``'s per-round epsilons and total over the rounds ``facts`` of one kind, as a run states them.

    Per round: central eps at delta_l, local eps of the worst user at max_k p_k delta_l
    (:func:`~otafl.privacy.accountants.exact_run.row_epsilons`). Total: the rounds'
    profiles composed by :func:`~otafl.privacy.accountants.exact_run.compose_exact_rounds`
    at ``delta_target``, or basic composition where that is smaller (never at realistic T).
    The default ``delta_target`` is exact's own, whatever else is accounted: the sum of its
    per-round deltas plus delta_l, (T + 1) delta_l central and sum_t max_k p_k delta_l +
    delta_l local (capped at 1). :func:`account_run`, ``otafl bound --rounds`` and
    ``otafl audit --rounds`` all state exact's totals through this function.

    Returns
    -------
    dict: ``per_round`` ([T] float64), ``epsilon``, ``delta`` (the total's delta: the target,
    or the basic sum when basic wins) and ``composition`` (``pld`` | ``basic`` | ``none``).
    """
    if kind not in ("central", "local"):
        raise OtaflInputError(f"kind = {kind!r} is outside the allowed range {{central, local}}")
    T = len(facts)
    if kind == "central":
        delta_t = torch.full((T,), delta_l, dtype=torch.float64)
    else:
        delta_t = torch.stack([torch.as_tensor(f.participation_prob, dtype=torch.float64).amax() for f in facts]
                              ) * delta_l
    keys = run_row_keys(facts, kind, resolution)  # estimated CSI: the dominating rows (docs/privacy/csi.md#csi)
    row_eps = row_epsilons([k for ks in keys for k in ks], delta_l)
    eps = torch.tensor([max((row_eps[k] for k in ks), default=0.0) for ks in keys], dtype=torch.float64)
    delta_basic = float(delta_t.sum().clamp(max=1.0))
    target = min(1.0, delta_basic + delta_l) if delta_target is None else delta_target
    eps_basic = float(eps.sum()) if delta_basic <= target else math.inf
    if not bool(torch.isfinite(eps).all()):
        eps_pld = math.inf
    elif target >= 1.0:
        eps_pld = 0.0
    else:
        eps_pld = compose_exact_rounds(keys, delta_target=target)["epsilon"]
    total, how, total_delta = eps_pld, "pld", target
    if eps_basic < eps_pld:  # stated at the target when one is given (basic's sum is below it)
        total, how, total_delta = eps_basic, "basic", delta_basic if delta_target is None else target
    return {"per_round": eps, "epsilon": total, "delta": total_delta,
            "composition": how if math.isfinite(total) else "none"}
