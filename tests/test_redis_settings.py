"""The fleet's settings: where the board's Redis comes from, and a clear error per bad value."""

from __future__ import annotations

import logging

import pytest
from scrapy.settings import Settings

from scrapy_retryafter import Addon
from scrapy_retryafter.settings import RetryAfterSettingError, load_config


@pytest.mark.parametrize(
    ("settings", "url"),
    [
        ({}, None),
        ({"RETRY_AFTER_REDIS_URL": "redis://127.0.0.1:6379/2"}, "redis://127.0.0.1:6379/2"),
        ({"REDIS_URL": "redis://10.0.0.1:6379/0"}, "redis://10.0.0.1:6379/0"),
        ({"REDIS_PARAMS": {"url": "rediss://cache:6380/1"}}, "rediss://cache:6380/1"),
        ({"REDIS_HOST": "cache", "REDIS_PORT": "6380"}, "redis://cache:6380"),
        ({"REDIS_PORT": 6390}, "redis://localhost:6390"),
        ({"RETRY_AFTER_REDIS_URL": "redis://a/0", "REDIS_URL": "redis://b/0"}, "redis://a/0"),
        ({"RETRY_AFTER_REDIS_URL": "", "REDIS_URL": "redis://b/0"}, None),
        ({"RETRY_AFTER_REDIS_URL": "unix:///run/redis.sock"}, "unix:///run/redis.sock"),
    ],
)
def test_where_the_board_lives(settings, url):
    redis = load_config(settings).redis
    assert (redis.url if redis is not None else None) == url


def test_defaults_and_scrapy_redis_params_pass_through():
    redis = load_config(Settings({"REDIS_URL": "redis://h/0", "REDIS_PARAMS": {"password": "pw", "redis_cls": "x.Y"}})).redis
    assert redis is not None
    assert (redis.prefix, redis.fallback, redis.refresh, redis.timeout) == ("retry_after", False, 0.1, 0.5)
    assert dict(redis.params) == {"password": "pw"}


@pytest.mark.parametrize(
    ("name", "raw", "attr", "expected"),
    [
        ("RETRY_AFTER_REDIS_PREFIX", "crawl:shop", "prefix", "crawl:shop"),
        ("RETRY_AFTER_REDIS_FALLBACK", "true", "fallback", True),
        ("RETRY_AFTER_REDIS_FALLBACK", 0, "fallback", False),
        ("RETRY_AFTER_REDIS_REFRESH", "0.25", "refresh", 0.25),
        ("RETRY_AFTER_REDIS_TIMEOUT", 1, "timeout", 1.0),
    ],
)
def test_accepted_values(name, raw, attr, expected):
    redis = load_config({"RETRY_AFTER_REDIS_URL": "redis://h/0", name: raw}).redis
    assert getattr(redis, attr) == expected


BOARD = {"RETRY_AFTER_REDIS_URL": "redis://h/0"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"RETRY_AFTER_REDIS_URL": "http://h/0"}, "RETRY_AFTER_REDIS_URL must be a Redis URL"),
        ({"REDIS_URL": "h:6379"}, "REDIS_URL must be a Redis URL"),
        ({"RETRY_AFTER_REDIS_URL": 6379}, "RETRY_AFTER_REDIS_URL must be a Redis URL"),
        ({"REDIS_PARAMS": "host=h"}, "REDIS_PARAMS must be a dict"),
        ({**BOARD, "RETRY_AFTER_REDIS_PREFIX": " "}, "RETRY_AFTER_REDIS_PREFIX must be a non-empty string"),
        ({**BOARD, "RETRY_AFTER_REDIS_FALLBACK": "maybe"}, "RETRY_AFTER_REDIS_FALLBACK must be True or False"),
        ({**BOARD, "RETRY_AFTER_REDIS_REFRESH": 1}, r"RETRY_AFTER_REDIS_REFRESH must be a number of seconds > 0 and <= 0.25"),
        ({**BOARD, "RETRY_AFTER_REDIS_REFRESH": 0}, r"RETRY_AFTER_REDIS_REFRESH must be"),
        ({**BOARD, "RETRY_AFTER_REDIS_TIMEOUT": "slow"}, r"RETRY_AFTER_REDIS_TIMEOUT must be a number of seconds > 0 and <= 5"),
    ],
)
def test_bad_values_name_the_setting(settings, message):
    with pytest.raises(RetryAfterSettingError, match=message):
        load_config(settings)


def test_a_password_never_reaches_a_message():
    redis = load_config({"RETRY_AFTER_REDIS_URL": "redis://user:s3cret@h:6379/0"}).redis
    assert redis.safe_url == "redis://user:***@h:6379/0"


REDIS_QUEUE = "scrapy_retryafter.redis.queue.CooldownAwareRedisQueue"


def test_the_addon_gives_scrapy_redis_scheduler_the_cooldown_aware_queue(caplog):
    settings = Settings()
    settings.setdict({"SCHEDULER": "scrapy_redis.scheduler.Scheduler", "REDIS_URL": "redis://h/0"}, priority="project")
    with caplog.at_level(logging.WARNING):
        Addon().update_settings(settings)
    assert settings["SCHEDULER_QUEUE_CLASS"] == REDIS_QUEUE
    assert settings["SCHEDULER_PRIORITY_QUEUE"] != "scrapy_retryafter.CooldownAwarePriorityQueue"
    assert caplog.text == ""


@pytest.mark.parametrize(("url", "board"), [("redis://h/0", "a shared Redis board"), (None, "a per-process board")])
def test_a_project_scheduler_queue_class_is_kept_with_a_warning(url, board, caplog):
    settings = Settings()
    project = {"SCHEDULER": "scrapy_redis.scheduler.Scheduler", "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.FifoQueue"}
    settings.setdict({**project, **({"REDIS_URL": url} if url else {})}, priority="project")
    with caplog.at_level(logging.WARNING):
        Addon().update_settings(settings)
    assert settings["SCHEDULER_QUEUE_CLASS"] == "scrapy_redis.queue.FifoQueue"
    assert "SCHEDULER_QUEUE_CLASS=scrapy_redis.queue.FifoQueue is kept" in caplog.text
    assert REDIS_QUEUE in caplog.text
    assert board in caplog.text


@pytest.mark.parametrize(
    ("project", "expected"),
    [
        ("scrapy_redis.dupefilter.RFPDupeFilter", "scrapy_retryafter.redis.dupefilter.OutageTolerantDupeFilter"),
        ("myproject.dupefilters.Mine", "myproject.dupefilters.Mine"),  # a project's own is kept
    ],
)
def test_the_addon_gives_scrapy_redis_scheduler_the_outage_tolerant_dupefilter(project, expected):
    settings = Settings()
    settings.setdict(
        {"SCHEDULER": "scrapy_redis.scheduler.Scheduler", "REDIS_URL": "redis://h/0", "DUPEFILTER_CLASS": project},
        priority="project",
    )
    Addon().update_settings(settings)
    assert settings["DUPEFILTER_CLASS"] == expected


def test_without_scrapy_redis_scheduler_its_dupefilter_is_left_alone():
    settings = Settings()
    settings.setdict({"DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter"}, priority="project")
    Addon().update_settings(settings)
    assert settings["DUPEFILTER_CLASS"] == "scrapy_redis.dupefilter.RFPDupeFilter"
