"""Every combination validation accepts is audited by ``otafl audit-run``, or refused in one line.

aggregation x algorithm x sampling scheme x superposition x accountant, from the registries
(docs/privacy/auditing.md#every-combination). The accountants do not change the run, so each
(aggregation, algorithm, scheme, superposition) is audited once with every accountant that
validation accepts there, and the audit's lower bound is compared with each one's upper bound.
Small runs (3 users, d = 2, 2 rounds, few trials) keep the matrix in the default suite.
"""

from __future__ import annotations

import itertools

import pytest

from otafl.api.audit_run import audit_run
from otafl.config import load_audit_spec
from otafl.errors import OtaflInputError
from otafl.fl.strategies import AGGREGATIONS, ALGORITHMS, SUPERPOSITIONS
from otafl.privacy.accountants import ACCOUNTANTS
from otafl.sampling import SAMPLING_SCHEMES

BASE = "experiments/audit-ota.toml"
TRIALS = 400
SMALL = ["data.users=3", "audit.dim=2", "train.rounds=1", f"audit.trials={TRIALS}", "audit.seed=3",
         "audit.records=4", "channel.fading='rayleigh'", "digital.sigma2=1.0", "transmit.sigma2=2.0"]
SCHEMES = {
    "uniform": ["sampling.p=1.0"],
    "time-varying": ["sampling.schedule='linear'", "sampling.p_start=0.5", "sampling.p_end=0.9"],
    "channel-aware": ["sampling.h_th=0.8"],
}
LOCAL = ["train.local_steps=2", "train.local_lr=0.1", "transmit.step_noise=1.0", "transmit.record_clip=1.0"]
REFUSED = {}  # (aggregation, algorithm, scheme, superposition, accountant) -> the one-line reason
_ACCOUNTED: dict = {}  # the accountants' results by their inputs: superposition does not change the facts


@pytest.fixture(autouse=True)
def _cached_accounting(monkeypatch):
    """The accountants are the slow part, and the two superpositions give them the same facts."""
    import otafl.api.audit_run as module

    honest = module.account_facts

    def cached(spec, facts, digital=None, delta_target=None, extra=()):
        key = (repr(spec.privacy), repr(facts), repr(digital.facts()) if digital is not None else None, extra)
        if key not in _ACCOUNTED:
            _ACCOUNTED[key] = honest(spec, facts, digital, delta_target, extra)
        return _ACCOUNTED[key]

    monkeypatch.setattr(module, "account_facts", cached)


def _overrides(aggregation: str, algorithm: str, scheme: str, superposition: str) -> list[str]:
    out = SMALL + [f"train.aggregation='{aggregation}'", f"train.algorithm='{algorithm}'",
                   f"sampling.scheme='{scheme}'", f"train.superposition='{superposition}'"] + SCHEMES[scheme]
    return out + (LOCAL if ALGORITHMS[algorithm].local else [])


def test_the_matrix_covers_every_registered_name():
    assert set(SCHEMES) == set(SAMPLING_SCHEMES)


@pytest.mark.parametrize("aggregation,algorithm,scheme,superposition",
                         list(itertools.product(AGGREGATIONS, ALGORITHMS, SAMPLING_SCHEMES, SUPERPOSITIONS)))
def test_every_accepted_combination_is_audited_below_every_guaranteed_bound(aggregation, algorithm, scheme,
                                                                            superposition):
    base = _overrides(aggregation, algorithm, scheme, superposition)
    accepted = []
    for name in ACCOUNTANTS:
        try:
            load_audit_spec(BASE, base + [f"privacy.accountants=['{name}']"])
        except OtaflInputError as e:
            assert "\n" not in str(e) and str(e), (name, str(e))
            REFUSED[(aggregation, algorithm, scheme, superposition, name)] = str(e)
            continue
        accepted.append(name)
    if not accepted:
        return  # every accountant refused, each in one line
    spec, audit = load_audit_spec(BASE, base + [f"privacy.accountants={accepted!r}"])
    result = audit_run(spec, audit)
    assert result["rounds"] == 1
    for name, row in result["accountants"].items():
        assert row["delta"] > 0 and row["unit"] in ("user", "record"), row
        assert row["epsilon_lower"] is not None and row["epsilon_lower"] >= 0.0
        if row["guaranteed"]:
            assert row["epsilon_lower"] <= row["epsilon"], (name, row, result["fit"])
            assert row["epsilon_lower_threshold"] <= row["epsilon"], (name, row)
            assert not row["exceeded"]
