"""The run-level ``digital`` accountant (docs/privacy/digital.md#digital): each round's digital
mechanism and the exact law of its participant count, composed over the rounds.

See :mod:`otafl.privacy.accountants.digital` for the model (participation revealed, the
sum's noise from the participants only, local DP = the user's own share) and
:mod:`otafl.privacy.analysis.distributed` for the mixture bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from otafl.errors import OtaflInputError, check_range
from otafl.privacy.accountants.base import REASON_NO_CENTRAL_NOISE, REASON_NO_LOCAL_NOISE, reason_text
from otafl.privacy.accountants.result import AccountantResult
from otafl.privacy.analysis.distributed import (
    DIGITAL_ORDERS,
    gaussian_conditional_epsilon,
    gaussian_round_pld,
    others_count_law,
    participant_window,
    rdp_mixture,
    rdp_to_epsilon,
)
from otafl.privacy.analysis.ddg import ddg_rdp
from otafl.privacy.analysis.pbm import pbm_rdp
from otafl.privacy.analysis.skellam import integer_l1_bound, rounded_norm_bound, skellam_rdp
from otafl.privacy.facts import DigitalMechanism, RoundFacts

__all__ = ["ROUNDING_BETA", "MECHANISM_NAMES", "account_digital_run", "mechanism_rdp"]

MECHANISM_NAMES = ("gaussian", "skellam", "ddg", "pbm")
ROUNDING_BETA = 1e-100
"""Probability that a user's stochastically rounded vector exceeds the Hoeffding norm bound
(:func:`~otafl.privacy.analysis.skellam.rounded_norm_bound`); charged as
(1 + e^eps) T beta to delta, and only used where that is below 1e-6 delta (else the
deterministic bound, which never fails)."""


def mechanism_rdp(mech: DigitalMechanism, participants, *, sensitivity: float, beta: float = 0.0,
                  orders=DIGITAL_ORDERS) -> torch.Tensor:
    """[N, A] Renyi DP eps_n(alpha) of the released sum with n = ``participants`` [N] shares.

    Skellam: integer units, Delta_2 = 2 * (bound on the rounded norm of a vector of norm
    scale * Delta / 2 in ``coordinates`` dimensions, failing w.p. ``beta``), Delta_1 =
    min(Delta_2^2, sqrt(D) Delta_2), variance n sigma^2 scale^2. DDG: the same Delta_2 and
    Delta_1, per-share sigma^2 scale^2, the bound of :func:`~otafl.privacy.analysis.ddg.ddg_rdp`
    (Kairouz, Liu & Steinke 2021) in D coordinates. PBM: the bound of
    :func:`~otafl.privacy.analysis.pbm.pbm_rdp`. Gaussian: alpha Delta^2 / (2 n sigma^2).
    """
    n = torch.as_tensor(participants, dtype=torch.float64).reshape(-1)
    a = torch.as_tensor(orders, dtype=torch.float64)
    if mech.name == "gaussian":
        var = n * mech.noise_var
        out = a * sensitivity ** 2 / (2 * var.unsqueeze(-1))
        return torch.where(var.unsqueeze(-1) > 0, out, torch.full_like(out, math.inf))
    if mech.name in ("skellam", "ddg"):
        d2 = 2.0 * rounded_norm_bound(norm=mech.scale * sensitivity / 2.0, dim=mech.coordinates, beta=beta)
        d1 = integer_l1_bound(l2=d2, dim=mech.coordinates)
        if mech.name == "ddg":
            return ddg_rdp(orders=orders, l2_sensitivity=d2, l1_sensitivity=d1,
                           sigma2=mech.noise_var * mech.scale ** 2, participants=n.long(), dim=mech.coordinates)
        return skellam_rdp(orders=orders, l2_sensitivity=d2, l1_sensitivity=d1,
                           variance=n * mech.noise_var * mech.scale ** 2)
    if mech.name == "pbm":
        return pbm_rdp(orders=orders, participants=n.long(), trials=mech.trials, theta=mech.theta,
                       sensitivity=sensitivity, box=mech.box)
    raise OtaflInputError(f"mechanism = {mech.name!r} is not one of: {', '.join(MECHANISM_NAMES)}")


@dataclass
class _Round:
    p: float  # the worst user's participation probability
    pmf: torch.Tensor  # law of the number of other participants
    n: torch.Tensor  # participant counts of the folded window (privacy profiles)
    w: torch.Tensor

    def cut(self, tau: float) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The window with the counts of lower-tail mass <= tau dropped (Renyi mixtures)."""
        return participant_window(self.pmf, cut_below=tau)


def _round_law(f: RoundFacts, cache: dict) -> _Round:
    p = torch.as_tensor(f.participation_prob, dtype=torch.float64).reshape(-1)
    pos = p[p > 0]
    key = (float(pos[0]), int(pos.numel()), p.numel()) if pos.numel() and bool((pos == pos[0]).all()) \
        else tuple(sorted(p.tolist()))
    if key not in cache:
        p_max, pmf = others_count_law(pos if pos.numel() else p)
        n, w, _ = participant_window(pmf)
        cache[key] = _Round(p_max if pos.numel() else 0.0, pmf, n, w)
    return cache[key]


def _gaussian_share(f: RoundFacts) -> tuple[float, float]:
    """(sigma^2 per share, channel noise N0/c^2) of a round read as Gaussian shares."""
    if f.digital is not None:
        return float(f.digital.noise_var), 0.0
    p = torch.as_tensor(f.participation_prob, dtype=torch.float64)
    var = torch.as_tensor(f.noise_var, dtype=torch.float64).expand_as(p)
    sigma2 = float(var[p > 0].min()) if bool((p > 0).any()) else float(var.min())
    c = float(f.alignment_gain)
    return sigma2, (0.0 if f.n0 == 0 else float(f.n0) / (c * c))


def _rdp_totals(rounds, facts, sensitivity_of, delta_l: float, delta_total: float, kind: str):
    """Per-round conditional eps at delta_l and the composed total, Renyi path (skellam, ddg, pbm).

    Counts below the lower quantile of mass tau are a failure event charged to delta
    (1 % of the delta, spread over the rounds; docs/privacy/digital.md#digital): conditioning the
    revealed counts on the product event "no round fails" leaves independent rounds whose
    Renyi orders add.
    """
    orders = DIGITAL_ORDERS
    T = len(facts)
    tau_round, tau_total = 1e-2 * delta_l, 1e-2 * delta_total / T
    best_total, best_rounds = math.inf, None
    for beta in (ROUNDING_BETA, 0.0):
        total = torch.zeros(len(orders), dtype=torch.float64)
        per_round, memo, failed = [], {}, 0.0
        for law, f in zip(rounds, facts):
            key = (id(law), f.digital, kind)
            if key not in memo:
                parts = []
                for tau in (tau_round, tau_total):
                    if kind == "local":
                        n, w, cut = torch.ones(1, dtype=torch.int64), torch.ones(1, dtype=torch.float64), 0.0
                    else:
                        n, w, cut = law.cut(tau)
                    rdp_n = mechanism_rdp(f.digital, n, sensitivity=sensitivity_of(f), beta=beta, orders=orders)
                    parts.append((rdp_n, w, cut))
                (rdp_r, w_r, _), (rdp_t, w_t, cut_t) = parts
                conditional = rdp_mixture(participation_prob=1.0, weights=w_r, rdp=rdp_r, orders=orders)
                eps_t = rdp_to_epsilon(conditional, orders, delta_l * (1 - 2e-2))[0] if law.p > 0 else 0.0
                mixed = rdp_mixture(participation_prob=law.p, weights=w_t, rdp=rdp_t, orders=orders)
                memo[key] = (eps_t, mixed, law.p * cut_t)
            eps_t, mixed, fail = memo[key]
            per_round.append(eps_t)
            total = total + mixed
            failed += fail
        eps, _ = rdp_to_epsilon(total, orders, delta_total * (1 - 1e-6) - failed)
        slack_ok = beta == 0.0 or (1 + math.exp(min(eps, 700.0))) * T * beta <= 1e-6 * delta_total
        rounds_ok = beta == 0.0 or all((1 + math.exp(min(e, 700.0))) * beta <= 1e-6 * delta_l for e in per_round)
        if slack_ok and rounds_ok and eps < best_total:
            best_total, best_rounds = eps, per_round
        if best_rounds is None and beta == 0.0:
            best_total, best_rounds = eps, per_round
    return best_rounds, best_total


def _gaussian_totals(rounds, facts, sensitivity_of, delta_l: float, delta_total: float, kind: str):
    """Per-round conditional eps at delta_l and the PLD-composed total (Gaussian shares)."""
    per_round, plds, memo = [], {}, {}
    for law, f in zip(rounds, facts):
        sigma2, channel = _gaussian_share(f)
        delta_s = sensitivity_of(f)
        key = (id(law), sigma2, channel, delta_s, kind)
        if key not in memo:
            n = torch.ones(1, dtype=torch.int64) if kind == "local" else law.n
            w = torch.ones(1, dtype=torch.float64) if kind == "local" else law.w
            s = torch.sqrt(n.to(torch.float64) * sigma2 + channel)
            eps_t = gaussian_conditional_epsilon(weights=w / w.sum(), noise_std=s, sensitivity=delta_s,
                                                 delta=delta_l) if law.p > 0 else 0.0
            memo[key] = (eps_t, (law.p, w, s, delta_s))
        eps_t, spec = memo[key]
        per_round.append(eps_t)
        plds[key] = (spec, plds.get(key, (spec, 0))[1] + 1)
    from otafl.privacy.analysis.pld import compose_counted, epsilon_for_delta

    # one loss grid for every round (compositions need it): fine enough that rounding the
    # losses up costs at most ~T * interval / 2 in eps, coarse enough to stay fast
    mus = [d * d / (2 * float(s.min()) ** 2) for (_, _, s, d), _ in plds.values() if float(s.min()) > 0]
    interval = max(1e-4, math.sqrt(2 * max(mus)) / 2000) if mus else 1e-4
    total = compose_counted((gaussian_round_pld(participation_prob=p, weights=w, noise_std=s, sensitivity=delta_s,
                                                interval=interval), count)
                            for (p, w, s, delta_s), count in plds.values() if p > 0)
    eps = 0.0 if total is None else epsilon_for_delta(total, delta_total)
    return per_round, max(eps, 0.0)


def account_digital_run(facts: list[RoundFacts], *, delta_l: float, delta_total: float | None = None,
                        name: str = "digital") -> AccountantResult:
    """Per-round and composed local and central DP of a digital run (module docstring).

    Parameters
    ----------
    facts : one RoundFacts per round; ``digital`` None reads the round as Gaussian shares of
        variance ``noise_var`` plus the channel noise N0/c_t^2.
    delta_l : per-round delta (the per-round epsilons are at delta_l, conditional on
        participation, so each round is (eps_t, p_max delta_l)-DP).
    delta_total : total delta of the composed epsilons; default sum_t p_max,t delta_l + delta_l.

    Returns
    -------
    AccountantResult (composition ``pld`` for Gaussian shares, ``rdp`` otherwise).
    """
    check_range("delta_l", delta_l, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if not facts:
        raise OtaflInputError("facts = [] is outside the allowed range (at least one round)")
    cache: dict = {}
    rounds = [_round_law(f, cache) for f in facts]
    if delta_total is None:
        delta_total = min(0.5, sum(r.p for r in rounds) * delta_l + delta_l)
    check_range("delta_total", delta_total, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    names = {f.digital.name if f.digital is not None else "gaussian" for f in facts}
    if len(names) != 1:
        raise OtaflInputError(f"a run mixes digital mechanisms {sorted(names)}; one per run")
    mech = names.pop()
    if mech not in MECHANISM_NAMES:
        raise OtaflInputError(f"mechanism = {mech!r} is not one of: {', '.join(MECHANISM_NAMES)}")

    def sensitivity_of(f):
        return float(f.sensitivity)

    compose = _gaussian_totals if mech == "gaussian" else _rdp_totals
    central, central_total = compose(rounds, facts, sensitivity_of, delta_l, delta_total, "central")
    local, local_total = compose(rounds, facts, sensitivity_of, delta_l, delta_total, "local")
    delta_round = max(r.p for r in rounds) * delta_l
    reason = 0
    if any(not math.isfinite(e) for e in central):
        reason |= REASON_NO_CENTRAL_NOISE
    if any(not math.isfinite(e) for e in local):
        reason |= REASON_NO_LOCAL_NOISE
    method = "pld" if mech == "gaussian" else "rdp"
    return AccountantResult(
        name=name, epsilon_local_max=max(local), delta_local=delta_round, epsilon_central=max(central),
        delta_central=delta_round, epsilon_local_total=local_total, delta_local_total=delta_total,
        epsilon_central_total=central_total, delta_central_total=delta_total, composition_central=method,
        composition_local=method, defined=reason == 0, reason=reason_text(reason), classic_valid=True,
        epsilon_central_per_round=tuple(central), epsilon_local_per_round=tuple(local))
