from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.crawler import Crawler, CrawlerRunner

from scrapy_retryafter.testing.clock import FakeClock
from scrapy_retryafter.testing.server import ThrottlingServer

BASE_SETTINGS: dict[str, Any] = {
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "COOKIES_ENABLED": False,
    "LOGSTATS_INTERVAL": 0,
    "DOWNLOAD_DELAY": 0,
    "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
}

ADDON = {"ADDONS": {"scrapy_retryafter.Addon": 500}}


class ListSpider(Spider):
    """Fetches the given requests and records what came back, and when."""

    name = "list"

    def __init__(self, requests: list[Request] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.to_send = requests or []
        self.seen: list[tuple[str, int]] = []
        self.failures: list[Any] = []

    async def start(self):  # type: ignore[override]
        for request in self.to_send:
            yield request.replace(callback=self.parse, errback=self.failed)

    def parse(self, response: Any) -> None:
        self.seen.append((response.url, response.status))

    def failed(self, failure: Any) -> None:
        self.failures.append(failure)


@pytest.fixture
def server():
    srv = ThrottlingServer()
    yield srv
    pytest_twisted.blockon(srv.stop())


async def crawl(
    requests: list[Request],
    settings: dict[str, Any] | None = None,
    spider_cls: type[Spider] = ListSpider,
    made: Callable[[Crawler], object] | None = None,
):
    """One real crawl; ``made`` sees the crawler before it starts, to watch its stats while it runs."""
    settings = {**BASE_SETTINGS, **(settings or {})}
    if not settings.get("JOBDIR"):
        # Each crawl its own park file: parked requests must not leak into the next test.
        settings.setdefault("RETRY_AFTER_PARK_FILE", str(Path(tempfile.mkdtemp(prefix="parked-")) / "parked.jsonl"))
    runner = CrawlerRunner(settings)
    crawler = runner.create_crawler(spider_cls)
    if made is not None:
        made(crawler)
    await crawler.crawl(requests=requests)
    return crawler


@pytest.fixture
def clock() -> FakeClock:
    """The one clock of the unit tests: it moves only when the test says so (``clock.advance(2)``)."""
    return FakeClock()
