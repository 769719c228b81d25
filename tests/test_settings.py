"""load_config(): defaults, command-line strings, and a clear error per bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
from scrapy.settings import Settings

from scrapy_retryafter.policy import SlotPolicy
from scrapy_retryafter.settings import SETTING_NAMES, Config, RetryAfterSettingError, load_config

ACCEPTED_KEYS = sorted(SETTING_NAMES)


# --------------------------------------------------------------------------
# defaults
# --------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [{}, Settings()], ids=["dict", "scrapy-settings"])
def test_defaults(settings):
    config = load_config(settings)
    assert isinstance(config, Config)
    assert config.enabled is True
    policy = config.default
    assert policy.pad == 1.25
    assert policy.max_delay == 300
    assert policy.max_retries == 4
    assert policy.backoff_base == 1
    assert policy.backoff_max == 60
    assert policy.wake_jitter == 1
    assert policy.http_codes == frozenset({429, 503})
    assert policy == SlotPolicy()
    assert dict(config.slots) == {}
    assert config.all_codes == frozenset({429, 503})


def test_none_values_mean_default():
    config = load_config({name: None for name in SETTING_NAMES.values()} | {"RETRY_AFTER_SLOTS": None})
    assert config.default == SlotPolicy()
    assert dict(config.slots) == {}


# --------------------------------------------------------------------------
# accepted values, including strings as `scrapy crawl -s NAME=value` gives them
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "raw", "attr", "expected"),
    [
        ("RETRY_AFTER_PAD", "1.5", "pad", 1.5),
        ("RETRY_AFTER_PAD", 2, "pad", 2.0),
        ("RETRY_AFTER_PAD", 1.0, "pad", 1.0),
        ("RETRY_AFTER_MAX_DELAY", "600", "max_delay", 600.0),
        ("RETRY_AFTER_MAX_DELAY", 0.5, "max_delay", 0.5),
        ("RETRY_AFTER_MAX_RETRIES", "7", "max_retries", 7),
        ("RETRY_AFTER_MAX_RETRIES", 0, "max_retries", 0),
        ("RETRY_AFTER_MAX_RETRIES", 3.0, "max_retries", 3),
        ("RETRY_AFTER_HTTP_CODES", "429,503", "http_codes", frozenset({429, 503})),
        ("RETRY_AFTER_HTTP_CODES", "429, 503, 502", "http_codes", frozenset({429, 502, 503})),
        ("RETRY_AFTER_HTTP_CODES", "429 503", "http_codes", frozenset({429, 503})),
        ("RETRY_AFTER_HTTP_CODES", "429", "http_codes", frozenset({429})),
        ("RETRY_AFTER_HTTP_CODES", [429], "http_codes", frozenset({429})),
        ("RETRY_AFTER_HTTP_CODES", ["429", "503"], "http_codes", frozenset({429, 503})),
        ("RETRY_AFTER_HTTP_CODES", (100, 599), "http_codes", frozenset({100, 599})),
        ("RETRY_AFTER_BACKOFF_BASE", "0.5", "backoff_base", 0.5),
        ("RETRY_AFTER_BACKOFF_MAX", "120", "backoff_max", 120.0),
        ("RETRY_AFTER_WAKE_JITTER", "0", "wake_jitter", 0.0),
        ("RETRY_AFTER_WAKE_JITTER", "2.5", "wake_jitter", 2.5),
    ],
)
def test_accepted_values(name, raw, attr, expected):
    for settings in ({name: raw}, Settings({name: raw})):
        policy = load_config(settings).default
        assert getattr(policy, attr) == expected
        assert type(getattr(policy, attr)) is type(expected)
        # every other value keeps its default
        for other in SETTING_NAMES:
            if other != attr:
                assert getattr(policy, other) == getattr(SlotPolicy(), other)


@pytest.mark.parametrize(
    ("raw", "enabled"),
    [
        (True, True),
        (False, False),
        ("False", False),
        ("false", False),
        ("True", True),
        ("true", True),
        (" TRUE ", True),
        ("0", False),
        ("1", True),
        (0, False),
        (1, True),
    ],
)
def test_enabled(raw, enabled):
    assert load_config({"RETRY_AFTER_ENABLED": raw}).enabled is enabled
    assert load_config(Settings({"RETRY_AFTER_ENABLED": raw})).enabled is enabled


def test_backoff_max_equal_to_base_is_fine():
    policy = load_config({"RETRY_AFTER_BACKOFF_BASE": 5, "RETRY_AFTER_BACKOFF_MAX": 5}).default
    assert policy.backoff_base == policy.backoff_max == 5.0


# --------------------------------------------------------------------------
# each bad value: an error naming the setting and what it accepts
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "raw", "accepted"),
    [
        ("RETRY_AFTER_PAD", -1, ">= 1.0"),
        ("RETRY_AFTER_PAD", 0.5, ">= 1.0"),
        ("RETRY_AFTER_PAD", 0, ">= 1.0"),
        ("RETRY_AFTER_PAD", "abc", ">= 1.0"),
        ("RETRY_AFTER_PAD", "", ">= 1.0"),
        ("RETRY_AFTER_PAD", True, ">= 1.0"),
        ("RETRY_AFTER_PAD", float("nan"), ">= 1.0"),
        ("RETRY_AFTER_PAD", float("inf"), ">= 1.0"),
        ("RETRY_AFTER_PAD", [1.5], ">= 1.0"),
        ("RETRY_AFTER_MAX_DELAY", -5, "> 0"),
        ("RETRY_AFTER_MAX_DELAY", 0, "> 0"),
        ("RETRY_AFTER_MAX_DELAY", float("nan"), "> 0"),
        ("RETRY_AFTER_MAX_DELAY", "nan", "> 0"),
        ("RETRY_AFTER_MAX_DELAY", 10**400, "> 0"),
        ("RETRY_AFTER_MAX_DELAY", False, "> 0"),
        ("RETRY_AFTER_MAX_RETRIES", -1, "whole number >= 0"),
        ("RETRY_AFTER_MAX_RETRIES", 1.5, "whole number >= 0"),
        ("RETRY_AFTER_MAX_RETRIES", "1.5", "whole number >= 0"),
        ("RETRY_AFTER_MAX_RETRIES", "three", "whole number >= 0"),
        ("RETRY_AFTER_MAX_RETRIES", float("inf"), "whole number >= 0"),
        ("RETRY_AFTER_MAX_RETRIES", float("nan"), "whole number >= 0"),
        ("RETRY_AFTER_MAX_RETRIES", True, "whole number >= 0"),
        ("RETRY_AFTER_HTTP_CODES", [700], "from 100 to 599"),
        ("RETRY_AFTER_HTTP_CODES", [99], "from 100 to 599"),
        ("RETRY_AFTER_HTTP_CODES", [429, 600], "from 100 to 599"),
        ("RETRY_AFTER_HTTP_CODES", [], "non-empty"),
        ("RETRY_AFTER_HTTP_CODES", "", "non-empty"),
        ("RETRY_AFTER_HTTP_CODES", ["x"], "HTTP status codes"),
        ("RETRY_AFTER_HTTP_CODES", "429,abc", "HTTP status codes"),
        ("RETRY_AFTER_HTTP_CODES", [429.5], "HTTP status codes"),
        ("RETRY_AFTER_HTTP_CODES", [True], "HTTP status codes"),
        ("RETRY_AFTER_HTTP_CODES", 429, "HTTP status codes"),
        ("RETRY_AFTER_BACKOFF_BASE", 0, "> 0"),
        ("RETRY_AFTER_BACKOFF_BASE", -1, "> 0"),
        ("RETRY_AFTER_BACKOFF_MAX", 0, "> 0"),
        ("RETRY_AFTER_WAKE_JITTER", -0.1, ">= 0"),
        ("RETRY_AFTER_WAKE_JITTER", "x", ">= 0"),
    ],
)
def test_bad_value(name, raw, accepted):
    with pytest.raises(RetryAfterSettingError) as info:
        load_config({name: raw})
    message = str(info.value)
    assert name in message
    assert accepted in message
    assert repr(raw) in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "settings",
    [
        {"RETRY_AFTER_BACKOFF_MAX": 0.5},  # below the default base of 1
        {"RETRY_AFTER_BACKOFF_BASE": 10, "RETRY_AFTER_BACKOFF_MAX": 5},
        {"RETRY_AFTER_BACKOFF_BASE": 100},  # above the default max of 60
    ],
)
def test_backoff_max_below_base(settings):
    with pytest.raises(RetryAfterSettingError) as info:
        load_config(settings)
    message = str(info.value)
    assert "RETRY_AFTER_BACKOFF_MAX" in message
    assert "RETRY_AFTER_BACKOFF_BASE" in message
    assert ">=" in message


@pytest.mark.parametrize("raw", ["maybe", "", "yes", 2, -1, 1.0, [True]])
def test_bad_enabled(raw):
    with pytest.raises(RetryAfterSettingError) as info:
        load_config({"RETRY_AFTER_ENABLED": raw})
    message = str(info.value)
    assert "RETRY_AFTER_ENABLED" in message
    assert "True or False" in message


# --------------------------------------------------------------------------
# RETRY_AFTER_SLOTS
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        [1, 2],
        ["host"],
        5,
        "not json",
        "[1, 2]",
        {"host": 5},
        {"host": [("pad", 2)]},
        {1: {"pad": 2}},
    ],
)
def test_slots_not_a_dict(raw):
    with pytest.raises(RetryAfterSettingError) as info:
        load_config({"RETRY_AFTER_SLOTS": raw})
    message = str(info.value)
    assert "RETRY_AFTER_SLOTS" in message
    assert "dict" in message


def test_slots_unknown_key_lists_accepted_keys():
    with pytest.raises(RetryAfterSettingError) as info:
        load_config({"RETRY_AFTER_SLOTS": {"host": {"pad": 2, "delay": 3, "retries": 1}}})
    message = str(info.value)
    assert "RETRY_AFTER_SLOTS['host']" in message
    assert "'delay'" in message
    assert "'retries'" in message
    assert "'pad'" not in message.split("accepted")[0]
    for key in ACCEPTED_KEYS:
        assert key in message


def test_slots_unknown_keys_of_mixed_types():
    with pytest.raises(RetryAfterSettingError, match="unknown key"):
        load_config({"RETRY_AFTER_SLOTS": {"host": {1: 2, "foo": 3}}})


@pytest.mark.parametrize(
    ("key", "raw", "accepted"),
    [
        ("pad", 0.5, ">= 1.0"),
        ("max_delay", 0, "> 0"),
        ("max_retries", -1, "whole number >= 0"),
        ("http_codes", [700], "from 100 to 599"),
        ("wake_jitter", -1, ">= 0"),
    ],
)
def test_slots_bad_value_names_slot_and_key(key, raw, accepted):
    with pytest.raises(RetryAfterSettingError) as info:
        load_config({"RETRY_AFTER_SLOTS": {"host": {key: raw}}})
    message = str(info.value)
    assert f"RETRY_AFTER_SLOTS['host']['{key}']" in message
    assert accepted in message


def test_slots_backoff_max_below_base_names_slot():
    with pytest.raises(RetryAfterSettingError) as info:
        load_config({"RETRY_AFTER_SLOTS": {"host": {"backoff_base": 10, "backoff_max": 5}}})
    message = str(info.value)
    assert "RETRY_AFTER_SLOTS['host']['backoff_max']" in message
    assert "RETRY_AFTER_SLOTS['host']['backoff_base']" in message


def test_slots_inherit_global_values():
    config = load_config(
        {
            "RETRY_AFTER_PAD": 2,
            "RETRY_AFTER_MAX_RETRIES": 9,
            "RETRY_AFTER_HTTP_CODES": [429],
            "RETRY_AFTER_SLOTS": {
                "api.example": {"max_delay": 10, "http_codes": [503, 502]},
                "www.example": {"pad": "1.5"},
            },
        }
    )
    default = config.default
    assert default.pad == 2.0
    assert default.max_retries == 9
    assert default.http_codes == frozenset({429})

    api = config.policy_for("api.example")
    assert api.max_delay == 10.0
    assert api.http_codes == frozenset({502, 503})
    assert api.pad == 2.0  # inherited from the global setting, not the built-in default
    assert api.max_retries == 9
    assert api.backoff_max == 60.0

    www = config.policy_for("www.example")
    assert www.pad == 1.5
    assert www.max_retries == 9
    assert www.max_delay == 300.0
    assert www.http_codes == frozenset({429})

    assert config.policy_for("unknown.example") is default
    assert config.policy_for("") is default
    assert config.all_codes == frozenset({429, 502, 503})


def test_slots_from_command_line_json():
    config = load_config(Settings({"RETRY_AFTER_SLOTS": '{"host": {"pad": 3, "http_codes": "429,418"}}'}))
    assert config.policy_for("host").pad == 3.0
    assert config.policy_for("host").http_codes == frozenset({418, 429})
    assert config.all_codes == frozenset({418, 429, 503})


@pytest.mark.parametrize("raw", [{}, "", "  ", None])
def test_empty_slots(raw):
    config = load_config({"RETRY_AFTER_SLOTS": raw})
    assert dict(config.slots) == {}
    assert config.all_codes == frozenset({429, 503})


def test_all_codes_unions_slots():
    config = load_config(
        {
            "RETRY_AFTER_SLOTS": {
                "a": {"http_codes": [420]},
                "b": {"http_codes": "502"},
                "c": {"pad": 2},
            }
        }
    )
    assert config.all_codes == frozenset({420, 429, 502, 503})
    assert config.default.http_codes == frozenset({429, 503})


def test_config_is_not_shared_with_settings():
    overrides = {"pad": 2}
    raw = {"RETRY_AFTER_SLOTS": {"host": overrides}}
    config = load_config(raw)
    overrides["pad"] = 0.1
    assert config.policy_for("host").pad == 2.0


@pytest.mark.parametrize(
    "raw, parking, park_file",
    [
        ({}, True, None),
        ({"RETRY_AFTER_PARKING": False}, False, None),
        ({"RETRY_AFTER_PARKING": "false", "RETRY_AFTER_PARK_FILE": "/tmp/p.jsonl"}, False, "/tmp/p.jsonl"),
        ({"RETRY_AFTER_PARK_FILE": Path("/tmp/q.jsonl")}, True, "/tmp/q.jsonl"),
        ({"RETRY_AFTER_PARK_FILE": ""}, True, None),
    ],
)
def test_parking_settings(raw, parking, park_file):
    config = load_config(raw)
    assert (config.parking, config.park_file) == (parking, park_file)


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"RETRY_AFTER_PARKING": "maybe"}, "RETRY_AFTER_PARKING must be True or False"),
        ({"RETRY_AFTER_PARK_FILE": 3}, "RETRY_AFTER_PARK_FILE must be a file path"),
        ({"RETRY_AFTER_PARK_FILE": "a\0b"}, "RETRY_AFTER_PARK_FILE must be a file path"),
    ],
)
def test_bad_parking_settings(raw, message):
    with pytest.raises(RetryAfterSettingError, match=message):
        load_config(raw)
