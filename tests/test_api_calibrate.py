"""otafl.api.calibrate: the search (no click), checked by re-running the bounds-only run."""

import math

import pytest

from otafl.api.calibrate import (KNOBS, CalibrationInfeasible, bounds_only_summary, calibrate, make_grid,
                                 solution_intervals, spec_toml, write_spec)
from otafl.config import load_spec, spec_from_mapping
from otafl.errors import OtaflInputError
from otafl.fl.loop import run_experiment

TINY = ["data.name='synthetic'", "data.users=20", "train.rounds=5", "privacy.accountants=['paper','tight']",
        "privacy.delta_total=1e-2"]  # K = 20: tight's count tails 2 exp(-2 mu^2/K) ~ 1e-4 a round need room
TOL = 1e-3


@pytest.fixture(scope="module")
def tiny():
    return load_spec(None, TINY)


def total(spec, accountant="tight", scope="central", **overrides):
    """The run's total epsilon with ``section.key=value`` overrides (a fresh bounds-only run)."""
    s = load_spec(None, TINY + [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()])
    assert s.train.seed == spec.train.seed
    return run_experiment(s, train=False).summary[f"{accountant}_epsilon_{scope}_total"]


# --------------------------------------------------------------------------- the pure interval search


def test_solution_intervals_finds_every_interval_of_a_non_monotone_function():
    calls = []

    def f(x):
        calls.append(x)
        return math.sin(x)

    grid = make_grid(0.1, 4 * math.pi - 0.1, 13, log=False, integer=False)
    ivs = solution_intervals(f, grid, 0.0, 1e-6)
    assert len(ivs) == 2
    (a, b), (c, d) = ivs
    assert a == pytest.approx(math.pi, abs=1e-6) and b == pytest.approx(2 * math.pi, abs=1e-6)
    assert c == pytest.approx(3 * math.pi, abs=1e-6) and d == grid[-1]
    assert all(math.sin(x) <= 0.0 for iv in ivs for x in iv)  # the kept ends are feasible
    assert len(calls) < 13 + 3 * 30  # grid + bisection, nothing exhaustive


def test_solution_intervals_integer_log_and_nan():
    assert solution_intervals(lambda n: n, [1.0, 4.0, 16.0, 64.0], 20.5, 1e-3, log=True, integer=True) == [(1.0, 20.0)]
    assert solution_intervals(lambda x: 1.0 / x, make_grid(1e-3, 1e3, 7, log=True, integer=False), 2.0, 1e-4,
                              log=True)[0][0] == pytest.approx(0.5, rel=1e-4)
    assert solution_intervals(lambda x: math.nan, [0.0, 1.0], 1.0, 1e-3) == []
    assert solution_intervals(lambda x: x, [0.0, 1.0, 2.0], -1.0, 1e-3) == []
    with pytest.raises(OtaflInputError, match="increasing"):
        solution_intervals(lambda x: x, [1.0, 0.5], 1.0, 1e-3)


# --------------------------------------------------------------------------- calibrated values, re-run


def test_sigma2_meets_the_target_and_a_little_less_noise_does_not(tiny):
    r = calibrate(tiny, knob="transmit.sigma2", target_epsilon=30.0, accountant="tight", tol=TOL)
    assert r.intervals[-1][1] == 1e3 and r.value == r.intervals[0][0]
    assert r.spec.transmit.sigma2 == r.value
    assert run_experiment(r.spec, train=False).summary["tight_epsilon_central_total"] <= 30.0
    assert r.epsilon_total <= 30.0
    assert total(tiny, transmit__sigma2=r.value * (1 - 2 * TOL)) > 30.0
    assert r.evaluations < 40


def test_rounds_is_an_integer_and_one_more_round_breaks_the_target(tiny):
    r = calibrate(tiny, knob="train.rounds", target_epsilon=100.0, accountant="tight", value_range=(1, 60))
    assert isinstance(r.value, int) and r.spec.train.rounds == r.value and r.value == r.intervals[-1][1]
    assert total(tiny, train__rounds=r.value) <= 100.0
    assert total(tiny, train__rounds=r.value + 1) > 100.0


def test_tight_central_epsilon_is_not_monotone_in_p_so_several_intervals_are_reported():
    tiny = load_spec(None, TINY + ["privacy.delta_total=1e-3"])  # there 15.3 at p = 0.7, 16.1 at 0.95, 14.4 at 1
    r = calibrate(tiny, knob="sampling.p", target_epsilon=15.4, accountant="tight", tol=TOL)
    assert len(r.intervals) >= 2
    assert r.value == r.intervals[-1][1] == 1.0  # the largest p that meets the target
    for lo, hi in r.intervals:
        assert total(tiny, sampling__p=lo) <= 15.4 and total(tiny, sampling__p=hi) <= 15.4
    assert r.intervals[0][1] < r.intervals[1][0]  # (at one delta tight's curve is jagged: no fixed gap probe)


def test_snr_and_clip_take_the_least_private_end(tiny):
    snr = calibrate(tiny, knob="channel.snr_db", target_epsilon=14.0, accountant="tight", tol=TOL)
    assert snr.value == snr.intervals[-1][1] < 40.0
    assert total(tiny, channel__snr_db=snr.value) <= 14.0 < total(tiny, channel__snr_db=snr.value + 2 * TOL)
    clip = calibrate(tiny, knob="transmit.clip", target_epsilon=60.0, accountant="paper", tol=TOL)
    assert clip.value == clip.intervals[-1][1]
    assert total(tiny, "paper", transmit__clip=clip.value) <= 60.0
    assert total(tiny, "paper", transmit__clip=clip.value * (1 + 2 * TOL)) > 60.0


def test_local_scope_and_a_fixed_total_delta(tiny):
    r = calibrate(tiny, knob="transmit.sigma2", target_epsilon=10.0, accountant="tight", scope="local")
    assert r.summary["tight_epsilon_local_total"] == r.epsilon_total <= 10.0
    assert r.epsilon_round == r.summary["tight_epsilon_local_max"]
    d = calibrate(tiny, knob="transmit.sigma2", target_epsilon=10.0, accountant="tight", target_delta=1e-3)
    assert d.delta <= 1e-3 and d.target_delta == 1e-3
    s = bounds_only_summary(d.spec, delta_target=1e-3)
    assert s["tight_epsilon_central_total"] <= 10.0 and s["tight_delta_central_total"] <= 1e-3
    # the default delta is the run's own: the same numbers as a plain bounds-only run
    plain, ours = run_experiment(tiny, train=False).summary, bounds_only_summary(tiny)
    plain.pop("wall_seconds"), ours.pop("wall_seconds")
    assert ours == plain
    assert s["tight_delta_central_total"] == pytest.approx(1e-3) != plain["tight_delta_central_total"]


def test_exact_accountant_one_small_case(tiny):
    spec = load_spec(None, TINY + ["train.rounds=2"])
    r = calibrate(spec, knob="transmit.sigma2", target_epsilon=10.0, accountant="exact", grid_points=3,
                  value_range=(0.1, 10.0), tol=0.05)
    assert run_experiment(r.spec, train=False).summary["exact_epsilon_central_total"] <= 10.0
    assert "exact" in r.spec.privacy.accountants  # added, so `otafl run` on it reports it


def test_no_solution_names_the_best_epsilon_and_the_range(tiny):
    with pytest.raises(CalibrationInfeasible) as e:
        calibrate(tiny, knob="transmit.sigma2", target_epsilon=0.5, accountant="tight", value_range=(1e-3, 1.0),
                  grid_points=4)
    msg = str(e.value)
    assert "\n" not in msg and "[0.001, 1]" in msg and f"{e.value.best_epsilon:.6g}" in msg
    assert e.value.best_value == 1.0 and e.value.best_epsilon > 0.5


# --------------------------------------------------------------------------- bad input, spec writing


@pytest.mark.parametrize("kwargs, needle", [
    ({"knob": "transmit.sigma"}, "knob = 'transmit.sigma' is outside the allowed range {transmit.sigma2"),
    ({"target_epsilon": 0.0}, "target_epsilon = 0.0 is outside the allowed range (0, inf)"),
    ({"target_epsilon": -1.0}, "target_epsilon = -1.0"),
    ({"target_delta": 1.0}, "target_delta = 1.0 is outside the allowed range (0, 1)"),
    ({"knob": "sampling.p", "value_range": (0.0, 1.0)}, "sampling.p range low end = 0.0 is outside the allowed range (0, 1]"),
    ({"knob": "sampling.p", "value_range": (0.5, 1.2)}, "(0, 1]"),
    ({"value_range": (1.0, 0.1)}, "must have LO < HI"),
    ({"value_range": (1.0,)}, "two values"),
    ({"knob": "train.rounds", "value_range": (0, 10)}, "train.rounds range low end = 0.0 is outside the allowed range [1, inf)"),
    ({"knob": "train.rounds", "value_range": (1, 9.5)}, "must be an integer"),
    ({"knob": "channel.snr_db", "value_range": (-120, 0)}, "[-100, 100]"),
    ({"scope": "global"}, "scope = 'global' is outside the allowed range {central, local}"),
    ({"accountant": "tigth"}, "accountant = 'tigth'"),
    ({"grid_points": 1}, "grid_points = 1"),
    ({"tol": 0.0}, "tol = 0.0"),
])
def test_bad_inputs_are_one_line_errors_naming_value_and_range(tiny, kwargs, needle):
    args = {"knob": "transmit.sigma2", "target_epsilon": 10.0, "accountant": "tight", **kwargs}
    with pytest.raises(OtaflInputError) as e:
        calibrate(tiny, **args)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_p_needs_uniform_sampling():
    spec = load_spec(None, TINY + ["sampling.scheme='channel-aware'"])
    with pytest.raises(OtaflInputError, match="sampling.scheme = 'uniform'"):
        calibrate(spec, knob="sampling.p", target_epsilon=10.0)


def test_every_knob_has_a_valid_default_range(tiny):
    for k in KNOBS.values():
        lo, hi = k.default_range(tiny)
        assert k.check("lo", lo) == lo and k.check("hi", hi) == hi and lo < hi
        assert k.prefer in ("min", "max")


def test_spec_toml_round_trips_a_preset_spec_with_groups(tmp_path):
    import tomllib

    spec = load_spec(None, ["channel.preset='paper-three-groups'", "transmit.sigma2=[0.1, 0.2, 0.3]",
                            "privacy.delta_prime=0.001", 'data.name="synthetic"'])
    text = spec_toml(spec, ["a header"])
    assert text.startswith("# a header\n")
    back = spec_from_mapping(tomllib.loads(text))
    expected = spec.to_dict()
    expected["channel"]["preset"] = None
    assert back.to_dict() == expected
    # snr_db on a grouped channel puts every group at the one value
    snr = KNOBS["channel.snr_db"].apply(spec, 7.0)
    assert snr.channel.snr_db == [7.0, 7.0, 7.0] and snr.channel.group_sizes == spec.channel.group_sizes


def test_write_spec_is_atomic_and_refuses_an_existing_file(tmp_path, tiny):
    path = tmp_path / "out.toml"
    write_spec(path, tiny, ["first"])
    assert load_spec(path).to_dict() == tiny.to_dict()
    with pytest.raises(OtaflInputError, match="exists; pass --overwrite"):
        write_spec(path, tiny, ["second"])
    assert path.read_text().startswith("# first\n")
    write_spec(path, KNOBS["transmit.clip"].apply(tiny, 0.25), ["second"], overwrite=True)
    assert load_spec(path).transmit.clip == 0.25
    assert [p.name for p in tmp_path.iterdir()] == ["out.toml"]


def test_progress_is_called_once_per_bounds_only_run(tiny):
    calls = []
    r = calibrate(tiny, knob="transmit.sigma2", target_epsilon=30.0, accountant="tight", tol=1e-1, grid_points=4,
                  progress=lambda done, total: calls.append((done, total)))
    assert [d for d, _ in calls] == list(range(1, r.evaluations + 1)) and all(t > d or t >= 4 for d, t in calls)


DIGITAL = ["data.name='synthetic'", "data.users=20", "train.rounds=5", "train.aggregation='digital'",
           "privacy.accountants=['digital']"]


def test_digital_sigma2_meets_the_target_and_a_little_less_noise_does_not():
    """A digital run's noise is digital.sigma2: calibrating it gives the matched-privacy digital
    baseline of an over-the-air spec without a script."""
    spec = load_spec(None, DIGITAL)
    r = calibrate(spec, knob="digital.sigma2", target_epsilon=8.0, tol=TOL)
    assert r.accountant == "digital" and r.spec.digital.sigma2 == r.value == r.intervals[0][0]
    assert run_experiment(r.spec, train=False).summary["digital_epsilon_central_total"] <= 8.0
    less = load_spec(None, DIGITAL + [f"digital.sigma2={r.value * (1 - 2 * TOL)!r}"])
    assert run_experiment(less, train=False).summary["digital_epsilon_central_total"] > 8.0
    with pytest.raises(OtaflInputError, match="needs train.aggregation = 'digital'"):
        calibrate(load_spec(None, TINY), knob="digital.sigma2", target_epsilon=8.0)
