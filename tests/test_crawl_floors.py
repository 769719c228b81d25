"""robots.txt Crawl-delay as a floor on a slot's gap that no jitter goes below (real crawls)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, signals

from scrapy_retryafter.testing.server import Host, ThrottlingServer, default_page

from .conftest import crawl

SLACK = 0.010
FLOOR = {"EXTENSIONS": {"scrapy_retryafter.slotfloors.SlotFloors": 0}, "ROBOTSTXT_OBEY": True}
ADDON = {"ADDONS": {"scrapy_retryafter.Addon": 0}, "ROBOTSTXT_OBEY": True}
MIDDLEWARE_ONLY = {
    "DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560},
    "ROBOTSTXT_OBEY": True,
}
HAS_SIGNAL = hasattr(signals, "robots_parsed")
needs_signal = pytest.mark.skipif(not HAS_SIGNAL, reason="robots_parsed came with Scrapy 2.18")


def robots_page(host: Host, path: str, status: int) -> str:
    if path == "/robots.txt":
        return "User-agent: *\nCrawl-delay: 0.5\nDisallow: /private\n"
    return default_page(host, path, status)


@pytest.fixture
def robots_server():
    srv = ThrottlingServer(page=robots_page)
    yield srv
    pytest_twisted.blockon(srv.stop())


def gaps(server: ThrottlingServer, host: Host) -> list[float]:
    times = [a.t for a in server.arrivals(host)]
    return [b - a for a, b in zip(times, times[1:])]


@needs_signal
@pytest.mark.parametrize(
    "scrapy_delay",
    [
        {},  # DOWNLOAD_DELAY 0: nothing of Scrapy's own spaces the requests
        {"DOWNLOAD_DELAY": 0.4, "DOWNLOAD_DELAY_JITTER": 0.5},  # Scrapy alone would draw gaps of 0.2 to 0.6 s
    ],
)
@pytest.mark.parametrize("wiring", [FLOOR, ADDON, MIDDLEWARE_ONLY], ids=["extension", "addon", "middleware"])
@pytest_twisted.ensureDeferred
async def test_crawl_delay_half_a_second_spaces_every_request_to_the_host(
    robots_server: Any, scrapy_delay: dict, wiring: dict
) -> None:
    host = robots_server.add_host()
    robots_server.start()
    settings = {**wiring, **scrapy_delay, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    crawler = await crawl([Request(host.url(f"/page/{i}")) for i in range(8)], settings)
    paths = [a.path for a in robots_server.arrivals(host)]
    assert paths[0] == "/robots.txt" and len(paths) == 9
    assert len(crawler.spider.seen) == 8
    assert min(gaps(robots_server, host)) >= 0.5 - SLACK
    assert crawler.stats.get_value("retry_after/crawl_delay/hosts") == 1


@needs_signal
@pytest.mark.parametrize(
    "install",
    [
        {"ADDONS": {"scrapy_retryafter.Addon": 500}},
        # The design card's way: the middleware, with the floor extension beside it.
        {
            "DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560},
            "EXTENSIONS": {"scrapy_retryafter.slotfloors.SlotFloors": 502},
        },
    ],
    ids=["addon", "middleware"],
)
@pytest_twisted.ensureDeferred
async def test_crawl_delay_holds_with_the_add_on_and_with_the_middleware(robots_server: Any, install: dict) -> None:
    host = robots_server.add_host()
    robots_server.start()
    settings = {**install, "ROBOTSTXT_OBEY": True, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    crawler = await crawl([Request(host.url(f"/page/{i}")) for i in range(8)], settings)
    assert len(crawler.spider.seen) == 8
    assert min(gaps(robots_server, host)) >= 0.5 - SLACK
    assert crawler.stats.get_value("retry_after/crawl_delay/hosts") == 1


@needs_signal
@pytest_twisted.ensureDeferred
async def test_the_floor_holds_when_a_slot_jitters_by_its_own_setting(robots_server: Any) -> None:
    host = robots_server.add_host()
    robots_server.start()
    settings = {**FLOOR, "DOWNLOAD_SLOTS": {host.address: {"concurrency": 8, "delay": 0.3, "jitter": 0.9}}}
    await crawl([Request(host.url(f"/page/{i}")) for i in range(8)], settings)
    assert min(gaps(robots_server, host)) >= 0.5 - SLACK


@pytest.mark.parametrize(
    "ignored",
    [
        {"RETRY_AFTER_ROBOTSTXT_OBEY": False},
        {"RETRY_AFTER_SLOTS": {"127.0.0.2": {"ignore_robots_txt": True}}},
        {"EXTENSIONS": {}},  # without the extension: Scrapy does not act on Crawl-delay
    ],
)
@pytest_twisted.ensureDeferred
async def test_ignoring_crawl_delay_sends_at_scrapy_s_own_pace(robots_server: Any, ignored: dict) -> None:
    host = robots_server.add_host(address="127.0.0.2")
    robots_server.start()
    settings = {**FLOOR, **ignored, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    await crawl([Request(host.url(f"/page/{i}")) for i in range(8)], settings)
    assert min(gaps(robots_server, host)) < 0.1


@pytest_twisted.ensureDeferred
async def test_without_the_robots_parsed_signal_it_says_so_once(
    robots_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if HAS_SIGNAL:
        monkeypatch.delattr(signals, "robots_parsed")
        monkeypatch.setattr("scrapy.downloadermiddlewares.robotstxt.signals", _SignalsWithRobots(), raising=True)
    host = robots_server.add_host()
    robots_server.start()
    with caplog.at_level(logging.INFO, logger="scrapy_retryafter.slotfloors"):
        await crawl([Request(host.url(f"/page/{i}")) for i in range(3)], FLOOR)
    lines = [r.getMessage() for r in caplog.records if r.name == "scrapy_retryafter.slotfloors"]
    assert len(lines) == 1 and "Crawl-delay is not read" in lines[0] and "2.18" in lines[0]


class FloorOfAThirdOfASecond:
    """Another part of the package adding a floor (the board's pace, say)."""

    @classmethod
    def from_crawler(cls, crawler: Any) -> FloorOfAThirdOfASecond:
        return cls(crawler)

    def __init__(self, crawler: Any) -> None:
        crawler.signals.connect(self._opened, signal=signals.engine_started)
        self.crawler = crawler

    def _opened(self) -> None:
        from scrapy_retryafter.slotfloors import SlotFloors

        (floors,) = [m for m in self.crawler.extensions.middlewares if isinstance(m, SlotFloors)]
        floors.add_floor_source(lambda slot: 0.3)


@pytest_twisted.ensureDeferred
async def test_an_added_floor_holds_under_scrapy_s_own_random_delay(robots_server: Any) -> None:
    host = robots_server.add_host()
    robots_server.start()
    # DOWNLOAD_DELAY 0.3 with Scrapy's default ±50 % alone draws gaps of 0.15 to 0.45 s.
    settings = {
        "EXTENSIONS": {"scrapy_retryafter.slotfloors.SlotFloors": 0, f"{__name__}.FloorOfAThirdOfASecond": 1},
        "DOWNLOAD_DELAY": 0.3,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    }
    await crawl([Request(host.url(f"/page/{i}")) for i in range(10)], settings)
    assert min(gaps(robots_server, host)) >= 0.3 - SLACK


class _SignalsWithRobots:
    """Scrapy 2.19's RobotsTxtMiddleware still sends its signal; an older Scrapy has none to send."""

    robots_parsed = object()

    def __getattr__(self, name: str) -> Any:
        return getattr(signals, name)
