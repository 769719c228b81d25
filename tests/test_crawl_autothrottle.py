"""AutoThrottle and the learned pace: one owner each, so they never fight over a slot.

AutoThrottle owns the downloader slot's ``delay``; this package never writes
it and enforces its pace where the queue releases a request. Both apply.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.extension import RetryAfterExtension
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, ListSpider, crawl

PAGES = 40


class DelayWatching(ListSpider):
    """Notes the downloader slot's delay and the board's pace at every response."""

    delays: list[tuple[float | None, float | None]]

    def parse(self, response):
        super().parse(response)
        slot = response.meta["download_slot"]
        downloader_slot = self.crawler.engine.downloader.slots.get(slot)
        pace = RetryAfterExtension.of(self.crawler).board.rate(slot)
        self.delays = [*getattr(self, "delays", []), (downloader_slot.delay if downloader_slot else None, pace)]


@pytest.mark.parametrize("autothrottle", [False, True], ids=["alone", "with AutoThrottle"])
@pytest_twisted.ensureDeferred
async def test_the_pace_is_enforced_without_ever_writing_the_slot_delay(server, autothrottle):
    host = server.add_host(HostConfig(rate=10.0, burst=1.0, penalty=0.5))
    server.start()
    settings = {
        **ADDON,
        "AUTOTHROTTLE_ENABLED": autothrottle,
        "AUTOTHROTTLE_START_DELAY": 0.0,
        "AUTOTHROTTLE_TARGET_CONCURRENCY": 8.0,
        "RETRY_AFTER_WAKE_JITTER": 0.1,
    }
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(PAGES)], settings, spider_cls=DelayWatching)
    assert len({url for url, status in crawler.spider.seen if status == 200}) == PAGES
    delays = crawler.spider.delays
    assert any(rate is not None for _, rate in delays)  # the slot got paced
    if autothrottle:
        assert any(delay and delay > 0 for delay, _ in delays)  # AutoThrottle kept its delay
    else:
        assert {delay for delay, _ in delays} == {0.0}  # nobody else wrote it
    # Stock AutoThrottle alone gets ~98 % 429s from this limiter; with the pace on top, few.
    throttled = len(server.arrivals(host, status=429))
    assert throttled <= 0.25 * len(server.arrivals(host)), throttled
