"""The settings of RETRY_AFTER_ALL_RETRIES: defaults, accepted values, clear errors, per slot, the add-on's default."""

from __future__ import annotations

import math

import pytest
from scrapy.settings import Settings

from scrapy_retryafter import Addon
from scrapy_retryafter.settings import RetryAfterSettingError, load_config


def test_defaults():
    config = load_config({})
    assert config.all_retries is False
    policy = config.default
    assert policy.backoff_strategy == "full"
    assert policy.deadline == math.inf
    assert policy.server_error_methods == frozenset({"GET", "HEAD"})
    assert policy.host_down_threshold == 5


@pytest.mark.parametrize(
    ("name", "raw", "attr", "expected"),
    [
        ("RETRY_AFTER_BACKOFF_STRATEGY", "equal", "backoff_strategy", "equal"),
        ("RETRY_AFTER_BACKOFF_STRATEGY", " Decorrelated ", "backoff_strategy", "decorrelated"),
        ("RETRY_AFTER_BACKOFF_STRATEGY", "none", "backoff_strategy", "none"),
        ("RETRY_AFTER_BACKOFF_STRATEGY", "additive", "backoff_strategy", "additive"),
        ("RETRY_AFTER_DEADLINE", "30", "deadline", 30.0),
        ("RETRY_AFTER_DEADLINE", 0.5, "deadline", 0.5),
        ("RETRY_AFTER_DEADLINE", 0, "deadline", math.inf),
        ("RETRY_AFTER_DEADLINE", "none", "deadline", math.inf),
        ("RETRY_AFTER_SERVER_ERROR_METHODS", "get,head,options", "server_error_methods",
         frozenset({"GET", "HEAD", "OPTIONS"})),
        ("RETRY_AFTER_SERVER_ERROR_METHODS", ["GET"], "server_error_methods", frozenset({"GET"})),
        ("RETRY_AFTER_SERVER_ERROR_METHODS", [], "server_error_methods", frozenset()),
        ("RETRY_AFTER_HOST_DOWN_THRESHOLD", "3", "host_down_threshold", 3),
        ("RETRY_AFTER_HOST_DOWN_THRESHOLD", 1, "host_down_threshold", 1),
    ],
)
def test_accepted_values(name, raw, attr, expected):
    assert getattr(load_config({name: raw}).default, attr) == expected


@pytest.mark.parametrize(
    ("name", "raw", "accepted"),
    [
        ("RETRY_AFTER_BACKOFF_STRATEGY", "fibonacci", "one of 'none', 'full', 'equal', 'decorrelated', 'additive'"),
        ("RETRY_AFTER_BACKOFF_STRATEGY", 3, "one of 'none'"),
        ("RETRY_AFTER_DEADLINE", -1, "a number of seconds > 0, or None for no deadline"),
        ("RETRY_AFTER_DEADLINE", "soon", "a number of seconds > 0"),
        ("RETRY_AFTER_DEADLINE", float("inf"), "a number of seconds > 0"),
        ("RETRY_AFTER_SERVER_ERROR_METHODS", [1], "a list of HTTP methods"),
        ("RETRY_AFTER_SERVER_ERROR_METHODS", "GET /x", "a list of HTTP methods"),
        ("RETRY_AFTER_SERVER_ERROR_METHODS", 5, "a list of HTTP methods"),
        ("RETRY_AFTER_HOST_DOWN_THRESHOLD", 0, "a whole number >= 1"),
        ("RETRY_AFTER_HOST_DOWN_THRESHOLD", 2.5, "a whole number >= 1"),
        ("RETRY_AFTER_ALL_RETRIES", "sometimes", "True or False"),
    ],
)
def test_bad_values_name_the_setting_and_what_it_accepts(name, raw, accepted):
    with pytest.raises(RetryAfterSettingError, match=f"^{name} must be ") as error:
        load_config({name: raw})
    assert accepted in str(error.value)


@pytest.mark.parametrize(("raw", "expected"), [(True, True), ("1", True), ("False", False), (0, False), (None, False)])
def test_all_retries(raw, expected):
    assert load_config({"RETRY_AFTER_ALL_RETRIES": raw}).all_retries is expected


def test_per_slot_overrides_and_a_slot_lifting_the_global_deadline():
    config = load_config({
        "RETRY_AFTER_DEADLINE": 10,
        "RETRY_AFTER_SLOTS": {
            "api.example": {"deadline": None, "backoff_strategy": "decorrelated", "server_error_methods": ["GET"]},
            "flaky.example": {"host_down_threshold": 2},
        },
    })
    assert config.default.deadline == 10
    api = config.policy_for("api.example")
    assert (api.deadline, api.backoff_strategy, api.server_error_methods) == (math.inf, "decorrelated", frozenset({"GET"}))
    assert config.policy_for("flaky.example").host_down_threshold == 2
    assert config.policy_for("flaky.example").deadline == 10


def test_a_bad_slot_value_names_slot_and_key():
    with pytest.raises(RetryAfterSettingError, match=r"RETRY_AFTER_SLOTS\['a'\]\['backoff_strategy'\] must be one of"):
        load_config({"RETRY_AFTER_SLOTS": {"a": {"backoff_strategy": "random"}}})


def test_the_policy_backoff_follows_the_settings():
    backoff = load_config({
        "RETRY_AFTER_BACKOFF_STRATEGY": "equal", "RETRY_AFTER_BACKOFF_BASE": 2, "RETRY_AFTER_BACKOFF_MAX": 9,
    }).default.backoff
    assert (backoff.name, backoff.base, backoff.cap) == ("equal", 2.0, 9.0)
    assert backoff.bounds(3) == (4.0, 8.0)


def _installed(**project: object) -> Settings:
    settings = Settings()
    settings.setdict(project, priority="project")
    Addon().update_settings(settings)
    return settings


def test_the_add_on_turns_all_retries_on():
    assert load_config(_installed()).all_retries is True


def test_a_project_that_turns_all_retries_off_keeps_it_off():
    assert load_config(_installed(RETRY_AFTER_ALL_RETRIES=False)).all_retries is False
