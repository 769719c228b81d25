"""Real crawls against a strict limiter whose rate the crawler is not told, and that changes it mid-crawl.

The limiter has no burst: two requests closer than 1/rate apart get a 429
with Retry-After: 1 and a penalty. Figures here are loose bounds that a
working controller meets with room on a loaded machine; bench/learn.py
measures the real ones.
"""

from __future__ import annotations

import collections

import pytest
import pytest_twisted
from scrapy import Request, signals
from scrapy.crawler import Crawler
from twisted.internet import reactor

from scrapy_retryafter.extension import RetryAfterExtension
from scrapy_retryafter.testing.server import Host, HostConfig, ThrottlingServer

from .conftest import ADDON, ListSpider, crawl

SETTINGS = {**ADDON, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}
MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}


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


@pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["add-on", "middleware only"])
@pytest_twisted.ensureDeferred
async def test_a_small_crawl_does_not_probe_when_a_refusal_costs_more_than_it_could_save(server, mode):
    # The unpaced burst gets one page through (read as 2/s) and a 2 s cooldown. Five pages
    # left at 1.4/s would save 1.8 s at 2.8/s, which this 2.5/s host refuses: no probe.
    host = server.add_host(HostConfig(rate=2.5, burst=1.0, penalty=2.0))
    server.start()
    settings = {**mode, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16, "RETRY_AFTER_PAD": 1.0}
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(6)], settings)
    assert len({url for url, status in crawler.spider.seen if status == 200}) == 6
    refused = [a.t for a in server.arrivals(host, status=429)]
    assert refused and max(refused) - min(refused) < 1.0, refused  # the first burst's only
    paced = [a.t for a in server.arrivals(host, status=200) if a.t > max(refused)]
    gaps = [later - earlier for earlier, later in zip(paced, paced[1:])]
    assert gaps and max(gaps) < 0.7, gaps  # not held at 1.4/s: risen to what the burst got through


class CountingSpider(ListSpider):
    """Records, at each answer, what the extension says the answer's slot has left to send, and how
    many requests the server had received by then (``arrived``, when a test sets ``watch``)."""

    watch: tuple[ThrottlingServer, Host] | None = None

    def parse(self, response):  # type: ignore[no-untyped-def]
        super().parse(response)
        extension = RetryAfterExtension.of(self.crawler)
        self.left = getattr(self, "left", [])
        self.arrived = getattr(self, "arrived", [])
        self.left.append(extension.left_at_most(extension.slot_of(response.request)))
        if self.watch is not None:
            self.arrived.append(len(self.watch[0].arrivals(self.watch[1])))


@pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["add-on", "middleware only"])
@pytest_twisted.ensureDeferred
async def test_what_a_slot_has_left_counts_the_queue_and_the_downloader(server, mode, monkeypatch):
    host = server.add_host(HostConfig(latency=0.1))  # callbacks run while the next request is on the wire
    server.start()
    monkeypatch.setattr(CountingSpider, "watch", (server, host))
    settings = {**mode, "CONCURRENT_REQUESTS": 1}
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(6)], settings, spider_cls=CountingSpider)
    left, arrived = crawler.spider.left, crawler.spider.arrived
    assert len(left) == 6
    counted = [(count, 6 - got) for count, got in zip(left, arrived) if count is not None]
    # Not yet at the server, less the one request that may be on its way. Without the add-on's
    # queue the scheduler's length is read at most once a second: an upper bound, not a count.
    assert counted and all(unsent - 1 <= count for count, unsent in counted), (left, arrived)
    if mode is ADDON:
        assert all(count <= unsent for count, unsent in counted), (left, arrived)
    else:
        assert all(count <= 5 for count, _ in counted), (left, arrived)
    assert any(count > 0 for count, _ in counted), (left, arrived)  # it counts something at all


@pytest_twisted.ensureDeferred
async def test_a_queue_that_holds_slots_without_counting_them_says_nothing_is_known(server):
    host = server.add_host()
    server.start()

    def uncounted(crawler: Crawler) -> None:
        def opened(**kwargs: object) -> None:
            RetryAfterExtension.of(crawler).queue_holds_slots = True  # as the scrapy-redis queue: no count per slot

        crawler.signals.connect(opened, signal=signals.spider_opened, weak=False)

    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(3)], MIDDLEWARE_ONLY, CountingSpider, uncounted)
    assert crawler.spider.left == [None, None, None]
