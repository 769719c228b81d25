"""A spider flags a ban from its callback: the spider middleware hands it to the throttle path (real crawls)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.banflag import register_ban_handler
from scrapy_retryafter.banrules import BanDetected

from .conftest import ListSpider, crawl

MIDDLEWARE = {"SPIDER_MIDDLEWARES": {"scrapy_retryafter.banflag.BanSpiderMiddleware": 950}}
flagged: list[tuple[str, str, float | None]] = []


class FlaggingSpider(ListSpider):
    """Finds a CAPTCHA on the first visit of each page."""

    def parse(self, response: Any) -> Any:
        if not response.meta.get("retried"):
            raise BanDetected("captcha form", retry_after=2)
        yield from ()
        self.seen.append((response.url, response.status))


class RetryOnce:
    """Stands for the package's throttle path: records the flag, answers the retry."""

    def __init__(self, crawler: Any) -> None:
        register_ban_handler(crawler, self.handle)

    @classmethod
    def from_crawler(cls, crawler: Any) -> RetryOnce:
        return cls(crawler)

    def handle(self, response: Any, reason: str, retry_after: float | None) -> list[Request]:
        flagged.append((response.url, reason, retry_after))
        retry = response.request.replace(dont_filter=True)
        retry.meta["retried"] = True
        return [retry]


@pytest_twisted.ensureDeferred
async def test_a_flagged_response_goes_to_the_throttle_path_and_its_retry_is_crawled(server: Any) -> None:
    flagged.clear()
    host = server.add_host()
    server.start()
    settings = {**MIDDLEWARE, "EXTENSIONS": {f"{__name__}.RetryOnce": 0}}
    crawler = await crawl([Request(host.url(f"/page/{i}")) for i in range(3)], settings, FlaggingSpider)
    assert sorted(flagged) == [(host.url(f"/page/{i}"), "captcha form", 2.0) for i in range(3)]
    assert sorted(crawler.spider.seen) == [(host.url(f"/page/{i}"), 200) for i in range(3)]
    assert len(server.arrivals(host)) == 6
    assert crawler.stats.get_value("retry_after/ban/spider") == 3
    assert crawler.stats.get_value("spider_exceptions/BanDetected") is None


@pytest_twisted.ensureDeferred
async def test_without_a_throttle_path_the_flag_is_a_callback_error_with_one_warning(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    host = server.add_host()
    server.start()
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter.banflag"):
        crawler = await crawl([Request(host.url(f"/page/{i}")) for i in range(3)], MIDDLEWARE, FlaggingSpider)
    assert crawler.spider.seen == []
    assert crawler.stats.get_value("spider_exceptions/BanDetected") == 3
    assert crawler.stats.get_value("retry_after/ban/spider") == 3
    warnings = [r for r in caplog.records if r.name == "scrapy_retryafter.banflag"]
    assert len(warnings) == 1 and "no throttle path takes it" in warnings[0].getMessage()
