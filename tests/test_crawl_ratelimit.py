"""Real crawls against a limiter that announces itself in rate-limit headers."""

from __future__ import annotations

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

PAGES = 60
RATE = 20.0


@pytest.mark.parametrize("dialect", ["ietf", "draft", "x", "x-epoch"])
@pytest_twisted.ensureDeferred
async def test_announced_limits_are_obeyed_before_any_429(server, dialect):
    host = server.add_host(HostConfig(rate=RATE, window=1.0, penalty=1.0, ratelimit=dialect))
    server.start()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(PAGES)], {**ADDON, "RETRY_AFTER_WAKE_JITTER": 0.1})
    assert len({url for url, status in crawler.spider.seen if status == 200}) == PAGES
    throttles = len(server.arrivals(host, status=429))
    assert throttles <= 2, f"{throttles} responses 429 with {dialect} headers"
    assert crawler.stats.get_value("retry_after/ratelimit_invalid") is None


@pytest_twisted.ensureDeferred
async def test_without_reading_the_headers_the_same_limiter_throttles(server):
    # The control for the test above: same server, headers ignored.
    host = server.add_host(HostConfig(rate=RATE, window=1.0, penalty=1.0, ratelimit="ietf"))
    server.start()
    settings = {**ADDON, "RETRY_AFTER_RATELIMIT_HEADERS": False, "RETRY_AFTER_WAKE_JITTER": 0.1}
    await crawl([Request(host.url(f"/{i}")) for i in range(PAGES)], settings)
    assert len(server.arrivals(host, status=429)) > 2


@pytest_twisted.ensureDeferred
async def test_a_quota_with_an_epoch_reset_is_paced_at_its_window_not_at_what_the_rounding_leaves(server):
    # The reset epoch is whole seconds, the window one second at a random phase:
    # spreading "remaining" over the rounded reset would pace at 10-19 requests/s.
    host = server.add_host(HostConfig(rate=RATE, window=1.0, penalty=1.0, ratelimit="x-epoch"))
    server.start()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(120)], {**ADDON, "RETRY_AFTER_WAKE_JITTER": 0.1})
    assert len({url for url, status in crawler.spider.seen if status == 200}) == 120
    assert len(server.arrivals(host, status=429)) <= 2
    times = sorted(a.t for a in server.arrivals(host, status=200))
    settled = [t for t in times if t >= times[0] + 2.0]  # after the first window and the one that tells its length
    assert len(settled) / (settled[-1] - settled[0]) >= 0.8 * RATE
