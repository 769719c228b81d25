"""Scrapy's own retry stats and give-up level, checked against stock get_retry_request."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetryMiddleware
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.http import Response
from scrapy.utils.test import get_crawler
from twisted.internet.error import TimeoutError as TwistedTimeoutError

from scrapy_retryafter.retry_reporting import (
    SCRAPY_HAS_GIVE_UP_LEVEL,
    check_give_up_log_level,
    count_give_up,
    count_retry,
    give_up_log_level,
    log_level,
    stock_reason,
)
from scrapy_retryafter.settings import RetryAfterSettingError


def _open_stats(crawler: Any, spider: Spider) -> None:
    try:
        crawler.stats.open_spider()
    except TypeError:  # Scrapy < 2.14 passes the spider
        crawler.stats.open_spider(spider)


def _retry_stats(crawler: Any) -> dict[str, Any]:
    return {k: v for k, v in crawler.stats.get_stats().items() if k.startswith("retry/")}


def _stock(reason: Any) -> dict[str, Any]:
    """What stock Scrapy records: its RetryMiddleware for a status, get_retry_request otherwise."""
    crawler = get_crawler(Spider, settings_dict={"RETRY_HTTP_CODES": [429, 500, 503]})
    spider = crawler._create_spider("s")
    crawler.spider = spider
    _open_stats(crawler, spider)
    request = Request("http://a.example")
    if isinstance(reason, int):
        middleware = ScrapyRetryMiddleware.from_crawler(crawler)
        response = Response("http://a.example", status=reason, request=request)
        try:
            retried = middleware.process_response(request, response)
        except TypeError:  # Scrapy < 2.14 wants the spider
            retried = middleware.process_response(request, response, spider)
        assert isinstance(retried, Request)
    else:
        assert get_retry_request(request, spider=spider, reason=reason) is not None
    return _retry_stats(crawler)


def _ours(reason: Any) -> dict[str, Any]:
    crawler = get_crawler(Spider)
    spider = crawler._create_spider("s")
    _open_stats(crawler, spider)
    count_retry(crawler.stats, reason)
    return _retry_stats(crawler)


@pytest.mark.parametrize(
    "reason",
    [429, 503, 500, TwistedTimeoutError(), TwistedTimeoutError, "custom reason"],
)
def test_count_retry_records_what_stock_scrapy_records(reason: Any) -> None:
    assert _ours(reason) == _stock(reason)


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        (429, "429 Unknown Status"),  # Twisted has no phrase for 429: stock says so too
        (503, "503 Service Unavailable"),
        (599, "599 Unknown Status"),
        (TwistedTimeoutError(), "twisted.internet.error.TimeoutError"),
        (ConnectionRefusedError, "builtins.ConnectionRefusedError"),
        ("slot cooling", "slot cooling"),
    ],
)
def test_stock_reason(reason: Any, label: str) -> None:
    assert stock_reason(reason) == label


def test_count_give_up_is_stock_max_reached() -> None:
    crawler = get_crawler(Spider)
    _open_stats(crawler, crawler._create_spider("s"))
    count_give_up(crawler.stats)
    count_give_up(crawler.stats)
    assert _retry_stats(crawler) == {"retry/max_reached": 2}


@pytest.mark.parametrize(
    ("value", "level"),
    [
        ("ERROR", logging.ERROR),
        ("warning", logging.WARNING),
        (" INFO ", logging.INFO),
        (logging.DEBUG, logging.DEBUG),
        (35, 35),
        ("LOUD", None),
        ("", None),
        (-1, None),
        (True, None),
        (None, None),
        (2.5, None),
        ([], None),
    ],
)
def test_log_level(value: Any, level: int | None) -> None:
    assert log_level(value) == level


@pytest.mark.parametrize(
    ("meta", "setting", "level"),
    [
        ({}, "ERROR", logging.ERROR),
        ({}, "WARNING", logging.WARNING),
        ({}, logging.INFO, logging.INFO),
        ({"give_up_log_level": "DEBUG"}, "ERROR", logging.DEBUG),
        ({"give_up_log_level": logging.CRITICAL}, "INFO", logging.CRITICAL),
        ({"give_up_log_level": None}, "WARNING", logging.WARNING),
        ({"give_up_log_level": "nonsense"}, "WARNING", logging.WARNING),
        ({"give_up_log_level": "nonsense"}, "nonsense", logging.ERROR),
        ({}, None, logging.ERROR),
    ],
)
def test_give_up_log_level_on_a_scrapy_with_the_setting(meta: dict[str, Any], setting: Any, level: int) -> None:
    assert give_up_log_level(meta, setting, supported=True) == level


@pytest.mark.parametrize(
    ("meta", "setting"),
    [({}, "WARNING"), ({"give_up_log_level": "DEBUG"}, "INFO"), ({}, "nonsense")],
)
def test_give_up_is_error_before_scrapy_217(meta: dict[str, Any], setting: Any) -> None:
    assert give_up_log_level(meta, setting, supported=False) == logging.ERROR


@given(meta=st.one_of(st.none(), st.integers(), st.text(max_size=12), st.floats()), setting=st.one_of(
    st.none(), st.integers(), st.text(max_size=12), st.booleans()))
def test_give_up_log_level_is_always_a_usable_level(meta: Any, setting: Any) -> None:
    level = give_up_log_level({"give_up_log_level": meta}, setting, supported=True)
    assert isinstance(level, int) and not isinstance(level, bool) and level >= 0
    logging.getLogger("scrapy_retryafter.test").log(level, "a give-up")


@pytest.mark.skipif(not SCRAPY_HAS_GIVE_UP_LEVEL, reason="Scrapy < 2.17 has no RETRY_GIVE_UP_LOG_LEVEL")
@pytest.mark.parametrize(
    ("meta", "setting"),
    [({}, "ERROR"), ({}, "WARNING"), ({"give_up_log_level": "DEBUG"}, "ERROR"), ({"give_up_log_level": None}, "INFO")],
)
def test_give_up_log_level_matches_stock(
    meta: dict[str, Any], setting: str, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = get_crawler(Spider, settings_dict={"RETRY_GIVE_UP_LOG_LEVEL": setting})
    spider = crawler._create_spider("s")
    _open_stats(crawler, spider)
    request = Request("http://a.example", meta={"retry_times": 2, **meta})
    # Stock RetryMiddleware._retry: the meta key, else the setting.
    stock_level = meta.get("give_up_log_level") or crawler.settings["RETRY_GIVE_UP_LOG_LEVEL"]
    with caplog.at_level(logging.DEBUG, logger="scrapy.downloadermiddlewares.retry"):
        assert get_retry_request(request, spider=spider, reason="x", give_up_log_level=stock_level) is None
    (record,) = [r for r in caplog.records if r.getMessage().startswith("Gave up")]
    assert give_up_log_level(request.meta, crawler.settings["RETRY_GIVE_UP_LOG_LEVEL"]) == record.levelno


def test_check_give_up_log_level() -> None:
    check_give_up_log_level({"RETRY_GIVE_UP_LOG_LEVEL": "WARNING"}, supported=True)
    check_give_up_log_level({}, supported=True)
    check_give_up_log_level({"RETRY_GIVE_UP_LOG_LEVEL": "LOUD"}, supported=False)
    with pytest.raises(RetryAfterSettingError, match="RETRY_GIVE_UP_LOG_LEVEL.*'LOUD'"):
        check_give_up_log_level({"RETRY_GIVE_UP_LOG_LEVEL": "LOUD"}, supported=True)
