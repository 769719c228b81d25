"""Real crawls: a healthy host whose every URL fails twice, then answers (per-URL flakiness, not an outage).

Found attacking host pauses: the first attempts of the URLs in flight fail
alike, so the host is paused; its probe is then always a fresh URL (retries
wait behind new requests in the scheduler), whose first attempt fails too, so
the pause never ends and the probe interval grows to RETRY_AFTER_BACKOFF_MAX.
20 URLs under Scrapy's defaults with the add-on: 0 fetched in 200 s
(arrivals at 0.8, 7.3, 21.1, 43.0, 74.3, 132.3, 180.7 s), against every URL
in a few seconds with RETRY_AFTER_HOST_DOWN_THRESHOLD=100. A cold cache
(a CDN's 504 on each page's first request, then the page, default backoff
base) is the same: 40 URLs, 0 fetched in 30 s. Open: the probe should be
the request that failed most often, or a host called down only once the
same URLs fail again.
"""

from __future__ import annotations

import time

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

PAGES = 10
LIMIT = 20


async def flaky_crawl(server, fail_first=2, failure="502", base=0.2, **extra):
    host = server.add_host(HostConfig(fail_first=fail_first, failure=failure))
    server.start()
    started = time.monotonic()
    settings = {**ADDON, "RETRY_AFTER_BACKOFF_BASE": base, "CLOSESPIDER_TIMEOUT": LIMIT, **extra}
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(PAGES)], settings)
    took = time.monotonic() - started
    ok = {url for url, status in crawler.spider.seen if status == 200}
    print(f"\nflaky URLs {extra}: {len(ok)}/{PAGES} in {took:.1f}s, {len(server.arrivals(host))} requests")
    return ok, took


@pytest_twisted.ensureDeferred
async def test_without_host_pauses_every_flaky_url_is_fetched_quickly(server):
    ok, took = await flaky_crawl(server, RETRY_AFTER_HOST_DOWN_THRESHOLD=100)
    assert len(ok) == PAGES
    assert took < LIMIT / 2


@pytest.mark.xfail(strict=True, reason="per-URL failures pause the host and fresh probes keep it paused (open)")
@pytest_twisted.ensureDeferred
async def test_urls_that_fail_twice_each_are_fetched_under_the_default_threshold(server):
    ok, took = await flaky_crawl(server, 2, "502", 0.2)
    assert len(ok) == PAGES
    assert took < LIMIT / 2

