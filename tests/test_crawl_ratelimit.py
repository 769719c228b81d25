"""Real crawls against a limiter that announces itself in rate-limit headers."""

from __future__ import annotations

import time

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


def _oks(crawler) -> int:
    return len({url for url, status in crawler.spider.seen if status == 200})


@pytest_twisted.ensureDeferred
async def test_a_long_window_quota_with_room_to_spare_is_spent_not_spread(server):
    # The host: 60 left for the next 50 minutes, 8 requests. Spreading
    # the quota paced them one per 50 s (55 s in all); the budget covers them.
    host = server.add_host(HostConfig(rate=60 / 3000, window=3000.0, ratelimit="x-epoch"))
    server.start()
    started = time.monotonic()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(8)], ADDON)
    elapsed = time.monotonic() - started
    assert _oks(crawler) == 8
    assert not server.arrivals(host, status=429)
    assert elapsed < 5.0, f"8 requests took {elapsed:.1f} s"


@pytest_twisted.ensureDeferred
async def test_an_hourly_quota_with_room_to_spare_costs_no_time(server):
    # GitHub-style, 5,000 an hour, 100 requests: as fast as unthrottled.
    host = server.add_host(HostConfig(rate=5000 / 3600, window=3600.0, ratelimit="x-epoch"))
    server.start()
    started = time.monotonic()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(100)], {**ADDON, "CONCURRENT_REQUESTS": 16})
    elapsed = time.monotonic() - started
    assert _oks(crawler) == 100
    assert not server.arrivals(host, status=429)
    assert elapsed < 8.0, f"100 requests took {elapsed:.1f} s"


@pytest_twisted.ensureDeferred
async def test_a_quota_the_crawl_would_run_dry_is_still_spread_until_its_reset(server):
    # 30 per 3 s window, 75 requests: more than the first two windows hold, so the
    # budget never covers them and the crawl spreads what is left; no 429.
    host = server.add_host(HostConfig(rate=10.0, window=3.0, penalty=1.0, ratelimit="x-epoch"))
    server.start()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(75)], {**ADDON, "RETRY_AFTER_WAKE_JITTER": 0.1})
    assert _oks(crawler) == 75
    assert len(server.arrivals(host, status=429)) <= 2
    for start in range(0, 9, 3):  # never more than the quota in a window
        window = [a for a in server.arrivals(host, status=200) if start <= a.t - server.started < start + 3]
        assert len(window) <= 30


@pytest_twisted.ensureDeferred
async def test_the_pace_goes_once_what_is_left_covers_what_the_crawl_still_wants(server):
    # 30 per 6 s window, 40 requests: the first window cannot hold them, so it is
    # spread; the second holds the last ten with room to spare, so they go at once.
    host = server.add_host(HostConfig(rate=5.0, window=6.0, penalty=1.0, ratelimit="x-epoch"))
    server.start()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(40)], {**ADDON, "RETRY_AFTER_WAKE_JITTER": 0.1})
    assert _oks(crawler) == 40
    assert len(server.arrivals(host, status=429)) <= 2
    assert crawler.stats.get_value("retry_after/quota_budget_freed", 0) >= 1
    times = sorted(a.t for a in server.arrivals(host, status=200))
    assert times[-1] - times[-8] < 1.0, f"the last eight took {times[-1] - times[-8]:.2f} s"
