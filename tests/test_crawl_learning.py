"""Real crawls against a strict limiter whose rate the crawler is not told, and that changes it mid-crawl.

The limiter has no burst: two requests closer than 1/rate apart get a 429
with Retry-After: 1 and a penalty. Figures here are loose bounds that a
working controller meets with room on a loaded machine; bench/learn.py
measures the real ones.
"""

from __future__ import annotations

import collections

import pytest_twisted
from scrapy import Request
from scrapy.crawler import Crawler
from twisted.internet import reactor

from scrapy_retryafter.testing.server import Host, HostConfig, ThrottlingServer

from .conftest import ADDON, crawl

SETTINGS = {**ADDON, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}


def per_second(server: ThrottlingServer, host: Host, since: float) -> list[int]:
    bins: collections.Counter[int] = collections.Counter(
        int(a.t - since) for a in server.arrivals(host, status=200) if a.t >= since
    )
    return [bins[second] for second in range(max(bins) + 1)] if bins else []


def change_rate(server: ThrottlingServer, host: Host, after: float, rate: float) -> list[float]:
    """Set the host's limit ``after`` seconds from now; the list gets the server-clock time of the change."""
    changed: list[float] = []

    def change() -> None:
        host.set_rate(rate)
        changed.append(server.clock())

    reactor.callLater(after, change)
    return changed


async def crawl_all(host: Host, pages: int) -> Crawler:
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(pages)], SETTINGS)
    assert len({url for url, status in crawler.spider.seen if status == 200}) == pages
    return crawler


@pytest_twisted.ensureDeferred
async def test_the_crawl_settles_just_under_an_untold_limit_with_few_429s(server):
    host = server.add_host(HostConfig(rate=20.0, burst=1.0, penalty=1.0))
    server.start()
    crawler = await crawl_all(host, 240)
    sent, throttled = len(server.arrivals(host)), len(server.arrivals(host, status=429))
    assert throttled <= 0.06 * sent, (throttled, sent)
    seconds = per_second(server, host, server.arrivals(host)[0].t)
    settled = seconds[5:-1]  # after the first burst, slow start and its throttle; the last second is partial
    assert sum(settled) / len(settled) >= 0.75 * 20, seconds
    assert crawler.stats.get_value("retry_after/paced_slots") == 1


@pytest_twisted.ensureDeferred
async def test_a_limit_raised_mid_crawl_is_found_within_seconds(server):
    host = server.add_host(HostConfig(rate=5.0, burst=1.0, penalty=1.0))
    server.start()
    changed = change_rate(server, host, 6.0, 20.0)
    await crawl_all(host, 220)
    after = per_second(server, host, changed[0])
    reached = next((second for second, count in enumerate(after) if count >= 0.7 * 20), None)
    assert reached is not None and reached <= 12, after


@pytest_twisted.ensureDeferred
async def test_a_limit_lowered_mid_crawl_costs_a_handful_of_429s(server):
    host = server.add_host(HostConfig(rate=20.0, burst=1.0, penalty=1.0))
    server.start()
    changed = change_rate(server, host, 6.0, 5.0)
    await crawl_all(host, 110)
    throttled_after = [a for a in server.arrivals(host, status=429) if a.t >= changed[0]]
    assert len(throttled_after) <= 10, [round(a.t - changed[0], 2) for a in throttled_after]
