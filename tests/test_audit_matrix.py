"""Every combination validation accepts is audited by ``otafl audit-run``, or refused in one line.

aggregation (the digital one per mechanism) x algorithm x sampling scheme x superposition x
accountant, from the registries (docs/privacy/auditing.md#every-combination). The accountants do
not change the run, so each (aggregation, algorithm, scheme, superposition) is audited once with
every accountant that validation accepts there, and the audit's lower bounds are compared with
each guaranteed one's upper bound. The refused combinations must be the table of the docs. Small
runs (3 users, d = 2, one round, 400 trials, q = 1) and the accountants' results cached across the
two superpositions (same facts) and in pytest's cache directory, keyed by a hash of the accounting
code, keep the matrix in the default suite.
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
import re
from pathlib import Path

import pytest

from otafl.api.audit_run import audit_run
from otafl.config import load_audit_spec
from otafl.errors import OtaflInputError
from otafl.fl.strategies import AGGREGATIONS, ALGORITHMS, MECHANISMS, SUPERPOSITIONS
from otafl.privacy.accountants import ACCOUNTANTS
from otafl.sampling import SAMPLING_SCHEMES

BASE = "experiments/audit-ota.toml"
TRIALS = 200
SMALL = ["data.users=3", "audit.dim=2", "train.rounds=1", f"audit.trials={TRIALS}", "audit.seed=3",
         "audit.records=4", "channel.fading='rayleigh'", "digital.sigma2=1.0", "transmit.sigma2=2.0"]
SCHEMES = {
    "uniform": ["sampling.p=1.0"],
    "time-varying": ["sampling.schedule='linear'", "sampling.p_start=0.5", "sampling.p_end=0.9"],
    "channel-aware": ["sampling.h_th=0.8"],
}
LOCAL = ["train.local_steps=2", "train.local_lr=0.1", "transmit.step_noise=1.0", "transmit.record_clip=1.0",
         "train.record_sampling=1.0"]
KINDS = [a for a in AGGREGATIONS if a != "digital"] + [f"digital-{m}" for m in MECHANISMS]
"""The aggregation axis: ota, ideal, and the digital aggregation once per mechanism."""
DOC = Path(__file__).resolve().parents[1] / "docs" / "privacy" / "auditing.md"
REFUSED = {}  # (aggregation, algorithm, scheme, superposition, accountant) -> the one-line reason
_ACCOUNTED: dict = {}  # the accountants' results by their inputs: superposition does not change the facts
_SOURCES = sorted((Path(__file__).resolve().parents[1] / "otafl").glob("privacy/**/*.py")) + [
    Path(__file__).resolve().parents[1] / "otafl" / "fl" / "accounting.py"]


def _code_hash() -> str:
    digest = hashlib.sha256()
    for path in _SOURCES:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(autouse=True)
def _cached_accounting(monkeypatch, request):
    """The accountants are the slow part: their results are cached by their inputs (the facts, the
    privacy section, the digital mechanism) and a hash of the accounting code, in memory (the two
    superpositions give the same facts) and in pytest's cache directory (later runs)."""
    import otafl.api.audit_run as module

    honest = module.account_facts
    folder = request.config.cache.mkdir("audit-matrix-accounting")
    code = _code_hash()

    def cached(spec, facts, digital=None, delta_target=None, extra=()):
        key = repr((repr(spec.privacy), repr(facts), repr(digital.facts()) if digital is not None else None, extra,
                    delta_target, code))
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        if name not in _ACCOUNTED:
            path = folder / f"{name}.pkl"
            try:
                _ACCOUNTED[name] = pickle.loads(path.read_bytes())
            except (OSError, pickle.PickleError, EOFError, AttributeError):
                _ACCOUNTED[name] = honest(spec, facts, digital, delta_target, extra)
                try:
                    path.write_bytes(pickle.dumps(_ACCOUNTED[name]))
                except (OSError, pickle.PickleError):
                    pass
        return _ACCOUNTED[name]

    monkeypatch.setattr(module, "account_facts", cached)


def _overrides(kind: str, algorithm: str, scheme: str, superposition: str) -> list[str]:
    aggregation, _, mechanism = kind.partition("-")
    out = SMALL + [f"train.aggregation='{aggregation}'", f"train.algorithm='{algorithm}'",
                   f"sampling.scheme='{scheme}'", f"train.superposition='{superposition}'"] + SCHEMES[scheme]
    out += [f"digital.mechanism='{mechanism}'"] if mechanism else []
    return out + (LOCAL if ALGORITHMS[algorithm].local else [])


def _documented_refusals() -> set[tuple[str, str, str]]:
    """(aggregation, algorithm, accountant) refused, from the docs' "Every combination" table:
    rows | `aggregation` | algorithm or "any" | `acc`, `acc` | why |."""
    text = DOC.read_text()
    section = text[text.index("### Every combination"):]
    out = set()
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        aggregation = cells[0].strip("`")
        algorithms = list(ALGORITHMS) if cells[1] == "any" else re.findall(r"`([^`]+)`", cells[1])
        for algorithm in algorithms:
            for accountant in re.findall(r"`([^`]+)`", cells[2]):
                out.add((aggregation, algorithm, accountant))
    return out


def test_the_matrix_covers_every_registered_name_and_the_docs_list_every_refusal():
    assert set(SCHEMES) == set(SAMPLING_SCHEMES)
    refused = set()
    for kind, algorithm, scheme, superposition in itertools.product(KINDS, ALGORITHMS, SCHEMES, SUPERPOSITIONS):
        for name in ACCOUNTANTS:
            try:
                load_audit_spec(BASE, _overrides(kind, algorithm, scheme, superposition)
                                + [f"privacy.accountants=['{name}']"])
            except OtaflInputError as e:
                assert str(e) and "\n" not in str(e)
                refused.add((kind.partition("-")[0], algorithm, name))
    assert refused == _documented_refusals()


@pytest.mark.parametrize("aggregation,algorithm,scheme,superposition",
                         list(itertools.product(KINDS, ALGORITHMS, SAMPLING_SCHEMES, SUPERPOSITIONS)))
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
