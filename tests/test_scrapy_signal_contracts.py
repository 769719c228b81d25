"""What Scrapy's own tests expect of every extension's signal handlers, with the add-on on.

Found by the compatibility suite (.ci/compat): Scrapy's test_engine.py
TestSpiderIdle::test_dont_close_spider and test_spider_crawl.py
TestCrawlSpider::test_closed_signal_call.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.test import get_crawler

from scrapy_retryafter.parkfile import ParkFile

from .conftest import ADDON, BASE_SETTINGS


class IdleSpider(Spider):
    name = "idle"

    async def start(self):  # type: ignore[override]
        return
        yield

    def parse(self, response: Any) -> None:
        pass


@pytest_twisted.ensureDeferred
async def test_a_spider_idle_handler_sees_scrapys_idle_rounds_while_there_is_no_park_file(tmp_path, monkeypatch):
    """No park file, nothing to read: parking keeps no spider open, however slow the disk."""
    claims = []
    claim = ParkFile.claim

    def slow_claim(self: ParkFile, take: Any) -> Any:
        claims.append(self.path)
        time.sleep(0.5)
        return claim(self, take)

    monkeypatch.setattr(ParkFile, "claim", slow_claim)
    idle_calls = 0

    def spider_idle() -> None:
        nonlocal idle_calls
        idle_calls += 1
        if idle_calls == 1:
            crawler.engine.crawl(Request("data:,"))
            raise DontCloseSpider

    park_file = tmp_path / "parked.jsonl"
    settings = {**BASE_SETTINGS, **ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)}
    crawler = get_crawler(IdleSpider, settings)
    crawler.signals.connect(spider_idle, signals.spider_idle)
    await crawler.crawl()
    assert idle_calls == 2
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert claims == []
    assert not park_file.exists()
    # A park file that exists is still read at start: test_crawl_parking.py's
    # test_a_record_due_soon_is_held_until_its_not_before.


@pytest.mark.parametrize("parking", [True, False])
def test_a_synchronous_spider_closed_send_gets_no_coroutine_when_nothing_was_parked(tmp_path, parking):
    """Scrapy's test_closed_signal_call sends spider_opened and spider_closed synchronously."""
    settings = {**ADDON, "RETRY_AFTER_PARKING": parking, "RETRY_AFTER_PARK_FILE": str(tmp_path / "p.jsonl")}
    crawler = get_crawler(settings_dict=settings)
    spider = Spider.from_crawler(crawler, "example.com")
    crawler.signals.send_catch_log(signal=signals.spider_opened, spider=spider)
    results = crawler.signals.send_catch_log(signal=signals.spider_closed, spider=spider, reason=None)
    assert results
    assert not [(receiver, result) for receiver, result in results if inspect.isawaitable(result)]
    assert not Path(tmp_path / "p.jsonl").exists()
