"""RETRY_AFTER_ALL_RETRIES outside the add-on's defaults: turned off, without our queue, without our RetryMiddleware."""

from __future__ import annotations

import logging

import pytest_twisted
from scrapy import Request, signals

from scrapy_retryafter.backoff import Backoff
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, ListSpider, crawl

OUR_RETRY = {
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "scrapy_retryafter.RetryMiddleware": 550,
    "scrapy_retryafter.RetryAfterMiddleware": 560,
}


@pytest_twisted.ensureDeferred
async def test_turned_off_the_add_on_leaves_scrapy_retries_as_they_were(server):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    crawler = await crawl(
        [Request(host.url("/post"), method="POST")],
        {**ADDON, "RETRY_AFTER_ALL_RETRIES": False, "RETRY_AFTER_BACKOFF_BASE": 5},
    )
    arrivals = server.arrivals(host)
    # Stock: a POST repeated after a 502, at once.
    assert [a.status for a in arrivals] == [502, 200]
    assert arrivals[1].t - arrivals[0].t < 1
    assert crawler.stats.get_value("retry/count") == 1
    assert crawler.stats.get_value("retry_after/backoff_retried") is None


@pytest_twisted.ensureDeferred
async def test_without_our_queue_the_backoff_is_waited_out_in_the_downloader(server):
    host = server.add_host(HostConfig(fail_first=2, failure="502"))
    server.start()
    settings = {
        "DOWNLOADER_MIDDLEWARES": OUR_RETRY,
        "RETRY_AFTER_ALL_RETRIES": True,
        "RETRY_AFTER_BACKOFF_STRATEGY": "equal",
        "RETRY_AFTER_BACKOFF_BASE": 0.4,
    }
    crawler = await crawl([Request(host.url("/a")), Request(host.url("/b"))], settings)
    assert sorted(crawler.spider.seen) == [(host.url("/a"), 200), (host.url("/b"), 200)]
    backoff = Backoff("equal", 0.4, 60.0)
    for path in ("/a", "/b"):
        arrivals = [a for a in server.arrivals(host) if a.path == path]
        assert [a.status for a in arrivals] == [502, 502, 200]
        for attempt, (before, after) in enumerate(zip(arrivals, arrivals[1:]), start=1):
            low, high = backoff.bounds(attempt)
            assert low - 0.01 <= after.t - before.t <= high + 0.5


@pytest_twisted.ensureDeferred
async def test_without_our_retry_middleware_one_line_says_scrapy_keeps_retrying(server, caplog):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    settings = {
        "DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560},
        "RETRY_AFTER_ALL_RETRIES": True,
    }
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter"):
        crawler = await crawl([Request(host.url("/"))], settings)
    said = [r.getMessage() for r in caplog.records if "RETRY_AFTER_ALL_RETRIES" in r.getMessage()]
    assert len(said) == 1 and "scrapy_retryafter.RetryMiddleware is not installed" in said[0]
    assert [a.status for a in server.arrivals(host)] == [502, 200]
    assert crawler.stats.get_value("retry/count") == 1


class MiddlewaresSpider(ListSpider):
    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._opened, signal=signals.spider_opened)
        return spider

    def _opened(self, **kwargs):
        self.middlewares = [type(m) for m in self.crawler.engine.downloader.middleware.middlewares]


@pytest_twisted.ensureDeferred
async def test_the_add_on_leaves_exactly_one_retry_middleware_its_own(server, caplog):
    from scrapy.downloadermiddlewares.retry import RetryMiddleware as Stock

    from scrapy_retryafter import RetryMiddleware

    host = server.add_host()
    server.start()
    with caplog.at_level(logging.WARNING):
        crawler = await crawl([Request(host.url("/"))], ADDON, spider_cls=MiddlewaresSpider)
    retries = [cls for cls in crawler.spider.middlewares if issubclass(cls, Stock)]
    assert retries == [RetryMiddleware]
    assert not [r for r in caplog.records if "multiple keys" in r.getMessage()]


@pytest_twisted.ensureDeferred
async def test_retry_enabled_false_turns_every_retry_off_without_a_warning(server, caplog):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter"):
        crawler = await crawl([Request(host.url("/"))], {**ADDON, "RETRY_ENABLED": False, "RETRY_AFTER_PARKING": False})
    assert [a.status for a in server.arrivals(host)] == [502]
    assert not [r for r in caplog.records if "RETRY_AFTER_ALL_RETRIES" in r.getMessage()]
    [failure] = crawler.spider.failures
    assert failure.value.response.status == 502


@pytest_twisted.ensureDeferred
async def test_without_our_queue_a_retry_waiting_in_the_downloader_when_the_crawl_stops_is_parked_not_sent(
    server, tmp_path
):
    import json

    from scrapy.crawler import CrawlerRunner
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor, task

    from .conftest import BASE_SETTINGS

    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **BASE_SETTINGS,
        "DOWNLOADER_MIDDLEWARES": OUR_RETRY,
        "RETRY_AFTER_ALL_RETRIES": True,
        "RETRY_AFTER_BACKOFF_STRATEGY": "none",
        "RETRY_AFTER_BACKOFF_BASE": 3.0,
        "RETRY_AFTER_PARK_FILE": str(park_file),
    }
    crawler = CrawlerRunner(settings).create_crawler(ListSpider)
    done = crawler.crawl(requests=[Request(host.url("/waiting"))])
    await task.deferLater(reactor, 1.0, lambda: None)
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    await task.deferLater(reactor, 0.5, lambda: None)  # a request wrongly let through would arrive by now
    records = [json.loads(line) for line in park_file.read_text().splitlines() if line.strip()]
    assert [(r["url"], r["reason"]) for r in records] == [(host.url("/waiting"), "held_at_close")]
    assert "backoff" in records[0]["detail"]
    assert [a.status for a in server.arrivals(host)] == [502]


def test_our_retry_middleware_works_on_a_crawler_that_is_not_crawling():
    """Built and called by hand, as Scrapy's own tests do: no engine (2.19 raises RuntimeError for it), and
    the spider given as an argument only (2.13), so the slot is the request's host or download_slot."""
    from scrapy import Spider
    from scrapy.http import Response
    from scrapy.utils.test import get_crawler
    from twisted.internet.error import TimeoutError as TwistedTimeoutError

    from scrapy_retryafter import RetryMiddleware

    crawler = get_crawler(Spider, {"RETRY_AFTER_ALL_RETRIES": True, "RETRY_AFTER_PARKING": False})
    spider = crawler._create_spider("by_hand")
    try:
        crawler.stats.open_spider()
    except TypeError:  # Scrapy < 2.14 passes the spider
        crawler.stats.open_spider(spider)
    middleware = RetryMiddleware.from_crawler(crawler)
    crawler.spider = None  # as on Scrapy 2.13, where only the argument carries it
    request = Request("http://a.example/x")
    retry = middleware.process_exception(request, TwistedTimeoutError(), spider)
    assert isinstance(retry, Request) and retry.meta["retry_times"] == 1
    slotted = Request("http://a.example/y", meta={"download_slot": "mine"})
    retry = middleware.process_response(slotted, Response(slotted.url, status=502, request=slotted), spider)
    assert isinstance(retry, Request) and retry.meta["retry_times"] == 1
    assert middleware._retry_after.slot_of(request) == "a.example"
    assert middleware._retry_after.send_back("a.example") == 0
    assert crawler.stats.get_value("retry/count") == 2


@pytest_twisted.ensureDeferred
async def test_our_retry_middleware_alone_says_once_that_throttles_go_unretried(server, caplog):
    host = server.add_host(HostConfig(reject_first=1, penalty=0.01, retry_after="0.1"))
    server.start()
    settings = {
        "DOWNLOADER_MIDDLEWARES": {
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
            "scrapy_retryafter.RetryMiddleware": 550,
        },
        "RETRY_AFTER_PARKING": False,
    }
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter"):
        await crawl([Request(host.url("/"))], settings)
    said = [r for r in caplog.records if "without scrapy_retryafter.RetryAfterMiddleware" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "[429, 503]" in said[0].getMessage()
    assert [a.status for a in server.arrivals(host)] == [429]  # what the line says: not retried
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter"):
        caplog.clear()
        await crawl([Request(host.url("/again"))], {**ADDON, "RETRY_AFTER_PARKING": False})
    assert not [r for r in caplog.records if "without scrapy_retryafter.RetryAfterMiddleware" in r.getMessage()]
