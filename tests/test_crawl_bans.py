"""Ban pages that are not 429s (a 200 CAPTCHA page, Shopify's 430) take the throttle path (real crawls)."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.banrules import BanDetected
from scrapy_retryafter.testing.scoped_server import Captcha, ScopedHostConfig, ScopedServer

from .conftest import ListSpider, crawl

SLACK = 0.010
WAIT = 1.0
CAPTCHA_RULE = {"RETRY_AFTER_BAN_RULES": [{"name": "captcha", "body": r'<form id="captcha"'}]}
ADDON = {"ADDONS": {"scrapy_retryafter.Addon": 500}}
MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}


class PageSpider(ListSpider):
    def parse(self, response: Any) -> None:
        self.seen.append((response.url, response.status, 'id="captcha"' in response.text))  # type: ignore[arg-type]


class FlaggingSpider(PageSpider):
    """No rule: the callback itself says the page is a ban."""

    def parse(self, response: Any) -> None:
        if 'id="captcha"' in response.text:
            raise BanDetected("captcha form")
        super().parse(response)


@pytest.fixture
def scoped():
    srv = ScopedServer()
    yield srv
    pytest_twisted.blockon(srv.stop())


def check_retried_after_the_wait(srv: ScopedServer, host: Any, crawler: Any, urls: list[str]) -> None:
    arrivals = srv.arrivals(host)
    first_ban = min(a.t for a in arrivals if a.captcha)
    assert all(not a.captcha for a in arrivals if a.t >= first_ban + WAIT), "the ban outlived its wait"
    retries = [a for a in arrivals if a.t > first_ban and not a.captcha]
    assert retries, "nothing was retried"
    # Not one request went out between the ban and the end of its wait.
    assert min(a.t for a in arrivals if a.t > first_ban and not a.captcha) >= first_ban + WAIT - SLACK
    assert all(not captcha for _, _, captcha in crawler.spider.seen), "a ban page reached the callback"
    assert sorted(url for url, _, _ in crawler.spider.seen) == sorted(urls), "a request was lost or doubled"
    assert crawler.spider.failures == []


@pytest.mark.parametrize("wiring", [ADDON, MIDDLEWARE_ONLY], ids=["addon", "middleware"])
@pytest.mark.parametrize("announced", [True, False], ids=["retry-after", "backoff"])
@pytest_twisted.ensureDeferred
async def test_a_200_captcha_page_a_rule_matches_is_retried_after_the_wait(scoped: Any, wiring: dict, announced: bool) -> None:
    host = scoped.add_host(ScopedHostConfig(captcha=Captcha(after=3, wait=WAIT, retry_after=announced)))
    scoped.start()
    urls = [host.url(f"/p/{i}") for i in range(8)]
    settings = {**wiring, **CAPTCHA_RULE, "CONCURRENT_REQUESTS": 2, "RETRY_AFTER_PAD": 1.1,
                "RETRY_AFTER_BACKOFF_BASE": WAIT * 1.1, "RETRY_AFTER_WAKE_JITTER": 0}
    crawler = await crawl([Request(u) for u in urls], settings, PageSpider)
    check_retried_after_the_wait(scoped, host, crawler, urls)
    assert crawler.stats.get_value("retry_after/ban/captcha") >= 1


@pytest.mark.parametrize("wiring", [ADDON, MIDDLEWARE_ONLY], ids=["addon", "middleware"])
@pytest_twisted.ensureDeferred
async def test_shopify_s_430_with_the_preset_is_a_throttle(scoped: Any, wiring: dict) -> None:
    host = scoped.add_host(ScopedHostConfig(captcha=Captcha(after=3, wait=WAIT, retry_after=True, status=430)))
    scoped.start()
    urls = [host.url(f"/p/{i}") for i in range(8)]
    settings = {**wiring, "RETRY_AFTER_BAN_RULES": ["shopify"], "CONCURRENT_REQUESTS": 2, "RETRY_AFTER_PAD": 1.1,
                "HTTPERROR_ALLOW_ALL": True}
    crawler = await crawl([Request(u) for u in urls], settings, PageSpider)
    check_retried_after_the_wait(scoped, host, crawler, urls)
    assert {status for _, status, _ in crawler.spider.seen} == {200}
    assert crawler.stats.get_value("retry_after/ban/shopify-430") >= 1


@pytest.mark.parametrize(
    "wiring",
    [ADDON, {**MIDDLEWARE_ONLY, "SPIDER_MIDDLEWARES": {"scrapy_retryafter.banflag.BanSpiderMiddleware": 560}}],
    ids=["addon", "middleware"],
)
@pytest_twisted.ensureDeferred
async def test_a_callback_s_ban_detected_takes_the_same_path(scoped: Any, wiring: dict) -> None:
    host = scoped.add_host(ScopedHostConfig(captcha=Captcha(after=3, wait=WAIT, retry_after=True)))
    scoped.start()
    urls = [host.url(f"/p/{i}") for i in range(8)]
    settings = {**wiring, "CONCURRENT_REQUESTS": 2, "RETRY_AFTER_PAD": 1.1}
    crawler = await crawl([Request(u) for u in urls], settings, FlaggingSpider)
    check_retried_after_the_wait(scoped, host, crawler, urls)
    assert crawler.stats.get_value("retry_after/ban/captcha form") >= 1
    assert crawler.stats.get_value("retry_after/ban/spider") >= 1
