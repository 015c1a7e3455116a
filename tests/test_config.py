"""Spec loading: defaults, presets, --set overrides, validation messages."""

import pytest

from otafl.config import load_spec, parse_override, spec_from_mapping
from otafl.errors import OtaflInputError


def test_empty_spec_takes_every_default():
    spec = load_spec(None)
    assert spec.data.name == "mnist-embedded" and spec.data.users == 200
    assert spec.sampling.p == 0.5 and spec.privacy.accountants == ["exact"]


def test_overrides_are_read_as_toml_literals():
    assert parse_override("sampling.p=0.25") == ("sampling", "p", 0.25)
    assert parse_override("channel.snr_db=[2, 10]") == ("channel", "snr_db", [2, 10])
    assert parse_override("sampling.scheme=channel-aware") == ("sampling", "scheme", "channel-aware")
    with pytest.raises(OtaflInputError, match="section.key"):
        parse_override("p=0.3")


def test_preset_fills_channel_and_users_and_spec_keys_override_it():
    spec = spec_from_mapping({"channel": {"preset": "paper-three-groups", "rho": 0.5}})
    assert spec.data.users == 200 and spec.channel.group_sizes == [68, 66, 66]
    assert spec.channel.snr_db == [2.0, 10.0, 30.0] and spec.channel.rician_k == 5.0
    assert spec.channel.rho == 0.5
    spec = spec_from_mapping({"channel": {"preset": "paper-three-groups"}, "data": {"users": 30}})
    assert spec.data.users == 30


def test_data_dir_without_name_selects_full_mnist():
    assert load_spec(None, ["data.dir='/somewhere'"]).data.name == "mnist"
    assert load_spec(None, ["data.dir='/x'", "data.name='digits'"]).data.name == "digits"


@pytest.mark.parametrize("raw, needle", [
    ({"sampling": {"p": 0.0}}, "sampling.p = 0.0 is outside the allowed range (0, 1]"),
    ({"channel": {"rho": 1.5}}, "channel.rho = 1.5 is outside the allowed range [0, 1]"),
    ({"channel": {"snr_db": [2, 10], "group_sizes": [1, 2, 3]}}, "must match"),
    ({"train": {"rounds": 2.5}}, "train.rounds = 2.5 must be an integer"),
    ({"sampling": {"p": "half"}}, "sampling.p = 'half' must be a number"),
    ({"privacy": {"delta_prime": "sometimes"}}, "delta_prime"),
    ({"transmit": {"alignment": "truncate"}}, "transmit.threshold must be set"),
    ({"radio": {}}, "unknown section [radio]"),
])
def test_bad_specs_name_the_value_and_the_range(raw, needle):
    with pytest.raises(OtaflInputError) as err:
        spec_from_mapping(raw)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_every_registered_name_is_accepted_and_a_typo_lists_the_registry():
    from otafl.validation import registries

    for where, registry in registries().items():
        section, key = where.split(".")
        for name in registry:
            value = [name] if where == "privacy.accountants" else name
            extra = {"transmit": {"threshold": 0.5}} if where == "transmit.alignment" else {}
            extra = {**extra, "sampling": {"values": [0.5]}} if where == "sampling.schedule" else extra
            extra = {**extra, "train": {"algorithm": "fedavg"}} if where == "transmit.update_scaling" else extra
            extra = {**extra, "transmit": {"threshold": 0.5}, "privacy": {"target_epsilon": 8.0}} \
                if where == "transmit.power_control" else extra  # what privacy-budget and cotaf need
            extra = {**extra, "channel": {"pilot_snr_db": 20.0}} if (where, name) == ("channel.csi", "estimated") else extra
            spec = spec_from_mapping({**extra, section: {**extra.get(section, {}), key: value}})
            assert getattr(getattr(spec, section), key) == value
        typo = "tigth" if where == "privacy.accountants" else name + "x"
        with pytest.raises(OtaflInputError) as err:
            spec_from_mapping({section: {key: [typo] if where == "privacy.accountants" else typo}})
        message = str(err.value)
        assert f"{where} = {typo!r}" in message and all(n in message for n in registry), message


@pytest.mark.parametrize("snr", [20.0, [20.0]], ids=["scalar", "one-item list"])
def test_one_snr_with_a_preset_of_several_groups_puts_every_group_at_it(snr):
    """docs/guides/spec.md: channel.snr_db is "one value, or one per group"; with the paper's
    three-group preset one value used to fail ("group_sizes has 3 entries but ... 1")."""
    spec = spec_from_mapping({"channel": {"preset": "paper-three-groups", "snr_db": snr}})
    assert spec.channel.group_sizes == [68, 66, 66] and spec.channel.snr_db == [20.0, 20.0, 20.0]
    spec = load_spec(None, ["channel.preset='paper-three-groups'", "channel.snr_db=5"])
    assert spec.channel.snr_db == [5.0, 5.0, 5.0]
    with pytest.raises(OtaflInputError, match="group_sizes has 3 entries but channel.snr_db has 2"):
        spec_from_mapping({"channel": {"preset": "paper-three-groups", "snr_db": [1.0, 2.0]}})
