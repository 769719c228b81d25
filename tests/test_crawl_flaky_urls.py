"""Real crawls: a healthy host whose every URL fails once or twice, then answers (per-URL flakiness, not an outage).

Found attacking host pauses: the first attempts of the URLs in flight fail
alike, so the host is paused; its probe was then always a fresh URL (retries
wait behind new requests in the scheduler), whose first attempt failed too,
so the pause never ended and the probe interval grew to RETRY_AFTER_BACKOFF_MAX.
20 URLs under Scrapy's defaults with the add-on: 0 fetched in 200 s; a cold
cache (a CDN's 504 on each page's first request), 40 URLs: 0 in 30 s. A
paused host's probe is now a request that failed before, the most failed
first (hostpause.probe_priority), so the first probe that can succeed does.
"""

from __future__ import annotations

import time

import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

PAGES = 10
LIMIT = 20


async def flaky_crawl(server, fail_first=2, failure="502", base=0.2, pages=PAGES, **extra):
    host = server.add_host(HostConfig(fail_first=fail_first, failure=failure))
    server.start()
    started = time.monotonic()
    settings = {**ADDON, "RETRY_AFTER_BACKOFF_BASE": base, "CLOSESPIDER_TIMEOUT": LIMIT, **extra}
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(pages)], settings)
    took = time.monotonic() - started
    ok = {url for url, status in crawler.spider.seen if status == 200}
    print(f"\nflaky URLs {fail_first} x {failure} {extra}: {len(ok)}/{pages} in {took:.1f}s, {len(server.arrivals(host))} requests")
    print(" ".join(f"{a.t - server.started:.2f}{a.path}:{a.status}" for a in server.arrivals(host)))
    return ok, took


@pytest_twisted.ensureDeferred
async def test_without_host_pauses_every_flaky_url_is_fetched_quickly(server):
    ok, took = await flaky_crawl(server, RETRY_AFTER_HOST_DOWN_THRESHOLD=100)
    assert len(ok) == PAGES
    assert took < LIMIT / 2


@pytest_twisted.ensureDeferred
async def test_urls_that_fail_twice_each_are_fetched_under_the_default_threshold(server):
    ok, took = await flaky_crawl(server, 2, "502", 0.2)
    assert len(ok) == PAGES
    assert took < LIMIT / 2



@pytest_twisted.ensureDeferred
async def test_a_cold_cache_504_on_each_first_request_does_not_hold_the_crawl_under_the_defaults(server):
    """Scrapy's and the add-on's defaults (backoff base 1 s): once 0 of 40 in 30 s."""
    ok, took = await flaky_crawl(server, 1, "504", 1.0, pages=40)
    assert len(ok) == 40
    assert took < LIMIT / 2
