"""Sweep grid expansion: product, extra points, seeds, overrides, validation before running."""

import json

import pytest

from otafl.errors import OtaflInputError
from otafl.sweep.grid import expand_grid, parse_sweep

BASE = {"data": {"name": "synthetic", "users": 10}, "train": {"rounds": 3, "seed": 5}}


def grid(sweep, base=BASE, overrides=()):
    return expand_grid({**base, "sweep": sweep}, overrides=overrides)


def test_product_of_axes_crossed_with_seeds_last_axis_fastest():
    sweep, points = grid({"axes": {"sampling.p": [0.2, 0.8], "channel.snr_db": [0.0, 10.0, 20.0]}, "seeds": [0, 1]})
    assert len(points) == 2 * 3 * 2
    got = [(pt.spec.sampling.p, pt.spec.channel.snr_db, pt.spec.train.seed) for pt in points]
    assert got[:4] == [(0.2, 0.0, 0), (0.2, 0.0, 1), (0.2, 10.0, 0), (0.2, 10.0, 1)]
    assert got[-1] == (0.8, 20.0, 1)
    assert [pt.index for pt in points] == list(range(12))
    assert points[3].values == {"sampling.p": 0.2, "channel.snr_db": 10.0, "train.seed": 1}
    assert sweep.train is True and all(pt.train for pt in points)


def test_points_are_appended_to_the_product_and_keep_the_base_for_other_keys():
    _, points = grid({"axes": {"sampling.p": [0.1, 0.5]}, "seeds": [0, 1],
                      "points": [{"sampling.scheme": "channel-aware", "sampling.h_th": 2.0}]})
    schemes = [(pt.spec.sampling.scheme, pt.spec.sampling.p, pt.spec.sampling.h_th) for pt in points]
    assert schemes == [("uniform", 0.1, 2.0)] * 2 + [("uniform", 0.5, 2.0)] * 2 + [("channel-aware", 0.5, 2.0)] * 2
    assert points[-1].spec.data.users == 10


def test_seeds_default_to_the_spec_seed_and_empty_sweep_is_one_point():
    _, points = grid({})
    assert len(points) == 1 and points[0].spec.train.seed == 5
    _, points = expand_grid(BASE)
    assert len(points) == 1


def test_params_is_the_canonical_spec_json_and_distinct_per_point():
    _, points = grid({"axes": {"transmit.clip": [1.0, 0.1]}, "seeds": [0, 1]})
    params = [pt.params for pt in points]
    assert len(set(params)) == 4
    assert json.loads(params[1])["train"]["seed"] == 1
    assert json.loads(params[2])["transmit"]["clip"] == 0.1


def test_duplicate_points_are_kept_once():
    _, points = grid({"axes": {"sampling.p": [0.5, 0.9]}, "points": [{"sampling.p": 0.5}], "seeds": [0]})
    assert [pt.spec.sampling.p for pt in points] == [0.5, 0.9]


def test_list_valued_axis_entries_are_single_values():
    base = {**BASE, "channel": {"group_sizes": [5, 5]}}
    _, points = grid({"axes": {"channel.snr_db": [[0.0, 10.0], [5.0, 15.0]]}}, base=base)
    assert [pt.spec.channel.snr_db for pt in points] == [[0.0, 10.0], [5.0, 15.0]]


def test_grid_values_win_over_set_overrides_and_set_reaches_the_sweep_table():
    sweep, points = grid({"axes": {"sampling.p": [0.3]}},
                         overrides=["sampling.p=0.9", "train.rounds=7", "sweep.train=false", "sweep.seeds=[1,2]"])
    assert [pt.spec.sampling.p for pt in points] == [0.3, 0.3]
    assert points[0].spec.train.rounds == 7
    assert sweep.train is False and not points[0].train
    assert [pt.spec.train.seed for pt in points] == [1, 2]


def test_channel_preset_applies_to_every_point():
    _, points = grid({"axes": {"data.users": [30, 60]}}, base={"channel": {"preset": "paper-three-groups"},
                                                                "data": {"name": "synthetic"}})
    assert [pt.spec.data.users for pt in points] == [30, 60]
    assert points[0].spec.channel.snr_db == [2.0, 10.0, 30.0]


@pytest.mark.parametrize("sweep, needle", [
    ({"axes": {"sampling.q": [1]}}, "unknown key 'q'"),
    ({"axes": {"sampl.p": [1]}}, "unknown section 'sampl'"),
    ({"axes": {"p": [1]}}, "must look like section.key"),
    ({"axes": {"sampling.p": []}}, "is empty"),
    ({"axes": {"sampling.p": 0.5}}, "must be a list"),
    ({"axes": {"sampling.p": ["high"]}}, "sampling.p = 'high' must be a number"),
    ({"axes": {"sampling.p": [0.5, 1.5]}}, "sampling.p=1.5"),
    ({"axes": {"train.seed": [1, 2]}}, "sweep.seeds"),
    ({"seeds": []}, "sweep.seeds is empty"),
    ({"seeds": [1, -1]}, "entry -1"),
    ({"seeds": [1, 1]}, "twice"),
    ({"train": "yes"}, "sweep.train"),
    ({"axis": {}}, "unknown key sweep.axis"),
    ({"points": [{}]}, "sweep.points[0] is empty"),
    ({"points": [{"sampling.scheme": "greedy"}]}, "sampling.scheme = 'greedy'"),
])
def test_bad_sweep_tables_raise_one_line_naming_the_problem(sweep, needle):
    with pytest.raises(OtaflInputError) as err:
        grid(sweep)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg


def test_an_invalid_point_is_named_in_the_error():
    with pytest.raises(OtaflInputError, match=r"sweep point sampling.p=0.5, transmit.clip=-1"):
        grid({"axes": {"sampling.p": [0.5], "transmit.clip": [1.0, -1.0]}})


def test_parse_sweep_defaults():
    s = parse_sweep(None)
    assert s.axes == {} and s.points == [] and s.seeds is None and s.train is True


# --------------------------------------------------------------------------- size limit, identity

HUGE = {"axes": {"sampling.p": [0.1 * i for i in range(1, 11)], "channel.snr_db": list(range(100)),
                 "transmit.clip": list(range(1, 101)), "transmit.sigma2": list(range(1, 101))},
        "points": [{"sampling.scheme": "channel-aware"}], "seeds": [0, 1]}


def test_grid_size_counts_from_the_axis_lengths():
    from otafl.sweep.grid import grid_size

    assert grid_size(parse_sweep(HUGE)) == (10 * 100 * 100 * 100 + 1) * 2
    assert grid_size(parse_sweep({"points": [{"sampling.p": 0.5}], "seeds": [1, 2]})) == 2
    assert grid_size(parse_sweep({"axes": {"sampling.p": [0.1, 0.2]}, "points": [{"sampling.p": 0.5}]})) == 3
    assert grid_size(parse_sweep(None)) == 1


def test_a_grid_over_the_limit_is_refused_before_any_point_is_built(monkeypatch):
    import otafl.sweep.grid as grid_mod

    def no_building(*a, **k):
        raise AssertionError("a grid point was built")

    monkeypatch.setattr(grid_mod, "spec_from_mapping", no_building)
    big = {**HUGE, "axes": {k: v for k, v in HUGE["axes"].items() if k != "transmit.sigma2"}}  # 200,002 points
    with pytest.raises(OtaflInputError) as err:
        grid(big)
    msg = str(err.value)
    assert "\n" not in msg
    assert ("200002 points ((10 x 100 x 100 axis values + 1 extra point(s)) x 2 seed(s)), "
            "over the limit of 100000 points") in msg and "--max-points 200002" in msg


def test_max_points_refuses_one_point_over_and_accepts_the_limit_itself():
    sweep = {"axes": {"sampling.p": [0.2, 0.8], "channel.snr_db": [0.0, 10.0, 20.0]}, "seeds": [0, 1]}
    with pytest.raises(OtaflInputError, match="has 12 points .* over the limit of 11 points"):
        expand_grid({**BASE, "sweep": sweep}, max_points=11)
    assert len(expand_grid({**BASE, "sweep": sweep}, max_points=12)[1]) == 12
    assert len(expand_grid({**BASE, "sweep": sweep}, max_points=None)[1]) == 12


def test_grid_identity_lists_sweep_keys_then_the_spec_values_all_points_share():
    from otafl.sweep.grid import grid_identity

    sweep, points = grid({"axes": {"sampling.p": [0.2, 0.8]}, "seeds": [0, 1]})
    ident = grid_identity(sweep, points)
    desc = dict(ident.description)
    assert list(desc)[:3] == ["sweep.train", "sweep.seeds", "sweep.axes.sampling.p"]
    assert desc["sweep.seeds"] == [0, 1] and desc["sweep.axes.sampling.p"] == [0.2, 0.8]
    assert desc["train.rounds"] == 3 and desc["data.users"] == 10
    assert "sampling.p" not in desc and "train.seed" not in desc  # they vary by point
    assert [e[0] for e in ident.entries] == [pt.params for pt in points]
    assert json.loads(ident.entries[1][2]) == {"sampling.p": 0.2, "train.seed": 1}
    _, again = grid({"axes": {"sampling.p": [0.8, 0.2]}, "seeds": [1, 0]})
    assert grid_identity(sweep, again).digest == ident.digest  # same runs, other order
    _, other = grid({"axes": {"sampling.p": [0.2, 0.8]}, "seeds": [0, 1]}, overrides=["train.rounds=4"])
    assert grid_identity(sweep, other).digest != ident.digest
