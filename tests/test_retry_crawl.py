"""Real crawls: every retryable failure retried safely (RETRY_AFTER_ALL_RETRIES, on with the add-on)."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.spidermiddlewares.httperror import HttpError

from scrapy_retryafter.backoff import Backoff
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, ListSpider, crawl

DISPATCH = 1.0
"""Slack for a released retry to reach the server (engine wake-up, connection)."""
BASE = 0.4
CAP = 3.0


def attempts_by_path(server, host):
    paths = defaultdict(list)
    for arrival in server.arrivals(host):
        paths[arrival.path].append(arrival)
    return paths


def settings_for(strategy: str = "full", **extra):
    return {
        **ADDON,
        "RETRY_AFTER_BACKOFF_STRATEGY": strategy,
        "RETRY_AFTER_BACKOFF_BASE": BASE,
        "RETRY_AFTER_BACKOFF_MAX": CAP,
        "DOWNLOAD_TIMEOUT": 1,
        **extra,
    }


@pytest.mark.parametrize(
    ("failure", "strategy"),
    [("reset", "full"), ("timeout", "equal"), ("502", "equal"), ("502", "none"), ("reset", "decorrelated"), ("502", "additive")],
)
@pytest_twisted.ensureDeferred
async def test_every_get_recovers_and_the_gaps_fall_inside_the_strategy_bounds(server, failure, strategy):
    # A fresh connection per attempt: Twisted's pool would repeat a GET on a reused one by itself.
    host = server.add_host(HostConfig(fail_first=2, failure=failure, keep_alive=False))
    server.start()
    urls = [host.url(f"/{i}") for i in range(4)]
    # Each request's own backoff is pinned here: eight failures of one kind in a row would pause
    # the host (test_crawl_outage.py), so the pause waits for a longer run.
    crawler = await crawl([Request(url) for url in urls], settings_for(strategy, RETRY_AFTER_HOST_DOWN_THRESHOLD=100))
    assert sorted(crawler.spider.seen) == [(url, 200) for url in urls]
    backoff = Backoff(strategy, BASE, CAP)
    timeout = 1.0 if failure == "timeout" else 0.0
    for path, arrivals in attempts_by_path(server, host).items():
        assert len(arrivals) == 3, path
        assert [a.status for a in arrivals][-1] == 200
        for attempt, (before, after) in enumerate(zip(arrivals, arrivals[1:]), start=1):
            low, high = backoff.bounds(attempt, prev=CAP)
            gap = after.t - before.t - timeout
            assert low - 0.01 <= gap <= high + DISPATCH + (0.5 if timeout else 0.0), (path, attempt, gap)
    stats = crawler.stats.get_stats()
    assert stats["retry/count"] == 8
    assert stats["retry_after/backoff_retried"] == 8
    assert "retry/max_reached" not in stats


@pytest.mark.parametrize(("key", "attempts", "recovered"), [(False, 1, False), (True, 2, True)])
@pytest_twisted.ensureDeferred
async def test_a_post_is_retried_after_a_read_timeout_only_with_an_idempotency_key(server, key, attempts, recovered):
    host = server.add_host(HostConfig(fail_first=1, failure="timeout"))
    server.start()
    headers = {"Idempotency-Key": "order-42"} if key else {}
    request = Request(host.url("/orders"), method="POST", body=b"{}", headers=headers)
    crawler = await crawl([request], settings_for("full"))
    arrivals = server.arrivals(host)
    assert len(arrivals) == attempts
    assert {a.method for a in arrivals} == {"POST"}
    if key:
        assert {a.headers["idempotency-key"] for a in arrivals} == {"order-42"}
    if recovered:
        assert crawler.spider.seen == [(host.url("/orders"), 200)]
    else:
        # The real error reaches the errback, not a generic one.
        assert crawler.spider.seen == []
        [failure] = crawler.spider.failures
        assert "Timeout" in type(failure.value).__name__
        assert crawler.stats.get_value("retry_after/not_retried") == 1
        assert crawler.stats.get_value("retry/count") is None


@pytest.mark.parametrize("listed", [False, True], ids=["stock codes", "404 added to RETRY_HTTP_CODES"])
@pytest_twisted.ensureDeferred
async def test_a_404_is_never_retried(server, listed):
    host = server.add_host(HostConfig(fail_first=5, failure="404"))
    server.start()
    extra = {"RETRY_HTTP_CODES": [404, 500, 502, 503, 504, 522, 524, 408, 429]} if listed else {}
    crawler = await crawl([Request(host.url("/missing"))], settings_for(**extra))
    assert [a.status for a in server.arrivals(host)] == [404]
    [failure] = crawler.spider.failures
    assert isinstance(failure.value, HttpError) and failure.value.response.status == 404
    assert crawler.stats.get_value("retry/count") is None


@pytest.mark.parametrize(
    ("method", "methods", "attempts"),
    [("GET", None, 2), ("HEAD", None, 2), ("POST", None, 1), ("PUT", None, 1), ("POST", ["POST"], 2)],
)
@pytest_twisted.ensureDeferred
async def test_a_500_is_retried_only_for_the_listed_methods(server, method, methods, attempts):
    host = server.add_host(HostConfig(fail_first=1, failure="500"))
    server.start()
    extra = {"RETRY_AFTER_SERVER_ERROR_METHODS": methods} if methods else {}
    await crawl([Request(host.url("/x"), method=method)], settings_for(**extra))
    assert [a.status for a in server.arrivals(host)] == [500, 200][:attempts]


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest_twisted.ensureDeferred
async def test_a_refused_connection_is_retried_for_any_method_until_the_host_is_up(server, method):
    host = server.add_refusing_host()
    server.start()
    from twisted.internet import reactor, task

    # The host opens after two refused retries, not after a fixed time: a slow start of the crawl
    # on a loaded machine would leave room for only one. Ten seconds is the fallback for a crawl
    # that never retries, which then fails below.
    opened: list[str] = []

    def open_when_retried_twice(crawler) -> None:
        def look() -> None:
            retried = crawler.stats.get_value("retry/count", 0) >= 2
            if retried or time.monotonic() - since > 10:
                opened.append("retried" if retried else "fallback")
                watch.stop()
                server.open(host)

        since = time.monotonic()
        watch = task.LoopingCall(look)
        watch.clock = reactor
        watch.start(0.02, now=False)

    crawler = await crawl(
        [Request(host.url("/up"), method=method)],
        settings_for("equal", RETRY_TIMES=8, RETRY_AFTER_HOST_DOWN_THRESHOLD=100),
        made=open_when_retried_twice,
    )
    assert opened == ["retried"]
    assert crawler.spider.seen == [(host.url("/up"), 200)]
    assert [a.method for a in server.arrivals(host)] == [method]
    assert crawler.stats.get_value("retry/count") >= 2


@pytest_twisted.ensureDeferred
async def test_a_burst_of_refused_connections_pauses_the_whole_slot(server):
    host = server.add_refusing_host()
    server.start()
    requests = [Request(host.url(f"/{i}")) for i in range(8)]
    settings = settings_for("equal", RETRY_TIMES=2, RETRY_AFTER_HOST_DOWN_THRESHOLD=3, RETRY_AFTER_PARKING=False)
    crawler = await crawl(requests, settings)
    stats = crawler.stats.get_stats()
    assert stats["retry_after/host_down"] >= 1
    assert stats["retry/max_reached"] == 8
    assert len(crawler.spider.failures) == 8
    assert all("Refused" in type(f.value).__name__ for f in crawler.spider.failures)


@pytest_twisted.ensureDeferred
async def test_scrapy_retry_knobs_keep_working(server):
    host = server.add_host(HostConfig(fail_first=10, failure="502"))
    server.start()
    requests = [
        Request(host.url("/default")),
        Request(host.url("/three"), meta={"max_retry_times": 3}),
        Request(host.url("/none"), meta={"dont_retry": True}),
    ]
    # The knobs of a request failing alone: a host failing every request would be paused instead,
    # its requests' failures spending no retries (test_crawl_outage.py).
    settings = settings_for(
        "full", RETRY_TIMES=1, RETRY_AFTER_BACKOFF_BASE=0.1, RETRY_AFTER_PARKING=False, RETRY_AFTER_HOST_DOWN_THRESHOLD=100
    )
    crawler = await crawl(requests, settings)
    paths = attempts_by_path(server, host)
    assert {path: len(a) for path, a in paths.items()} == {"/default": 2, "/three": 4, "/none": 1}
    stats = crawler.stats.get_stats()
    assert stats["retry/count"] == 4
    assert stats["retry/reason_count/502 Bad Gateway"] == 4
    assert stats["retry/max_reached"] == 2
    # On give-up the original response reaches the spider (as HttpError, like Scrapy's).
    statuses = sorted(f.value.response.status for f in crawler.spider.failures)
    assert statuses == [502, 502, 502]


class PrioritySpider(ListSpider):
    def parse(self, response):
        super().parse(response)
        self.priorities = [*getattr(self, "priorities", []), response.request.priority]


@pytest_twisted.ensureDeferred
async def test_retry_priority_adjust_lowers_retries(server):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    crawler = await crawl(
        [Request(host.url("/p"), priority=10)], settings_for("full", RETRY_PRIORITY_ADJUST=-7), spider_cls=PrioritySpider
    )
    assert crawler.spider.seen == [(host.url("/p"), 200)]
    assert crawler.spider.priorities == [3]


@pytest_twisted.ensureDeferred
async def test_a_retry_that_would_end_past_the_deadline_gives_up_now(server):
    host = server.add_host(HostConfig(fail_first=3, failure="502"))
    server.start()
    requests = [
        Request(host.url("/tight")),
        Request(host.url("/loose"), meta={"retry_after_deadline": 30}),
    ]
    started = time.monotonic()
    # Equal jitter with base 2 waits at least 1 s: never inside a 0.5 s deadline.
    settings = settings_for(
        "equal", RETRY_TIMES=5, RETRY_AFTER_BACKOFF_BASE=2.0, RETRY_AFTER_DEADLINE=0.5, RETRY_AFTER_PARKING=False
    )
    crawler = await crawl(requests, settings)
    paths = attempts_by_path(server, host)
    assert len(paths["/tight"]) == 1
    assert [a.status for a in paths["/loose"]] == [502, 502, 502, 200]
    assert crawler.stats.get_value("retry_after/deadline") == 1
    assert crawler.stats.get_value("retry_after/gave_up") == 1
    [failure] = crawler.spider.failures
    assert failure.value.response.status == 502
    assert paths["/tight"][0].t - started < 2


@pytest_twisted.ensureDeferred
async def test_a_throttle_whose_cooldown_ends_past_the_deadline_gives_up_now(server):
    host = server.add_host(HostConfig(reject_first=1, penalty=5.0))
    server.start()
    started = time.monotonic()
    crawler = await crawl([Request(host.url("/"))], {**ADDON, "RETRY_AFTER_DEADLINE": 3, "RETRY_AFTER_PARKING": False})
    assert [a.status for a in server.arrivals(host)] == [429]
    assert time.monotonic() - started < 3
    assert crawler.stats.get_value("retry_after/deadline") == 1
    [failure] = crawler.spider.failures
    assert failure.value.response.status == 429


async def _healthy_seconds(server_factory, with_failing: bool) -> tuple[float, int]:
    server = server_factory()
    healthy = server.add_host(HostConfig(latency=0.05))
    failing = server.add_host(HostConfig(fail_first=2, failure="502"))
    server.start()
    requests = [Request(healthy.url(f"/h/{i}")) for i in range(120)]
    if with_failing:
        requests = [Request(failing.url(f"/f/{i}")) for i in range(20)] + requests
    # Every failing URL fails twice: a run of 502s that would pause the host, whose fresh probes
    # fail in turn; this test is about waiting retries beside a healthy host, not outages.
    settings = {
        **ADDON,
        "CONCURRENT_REQUESTS": 4,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "LOG_LEVEL": "WARNING",
        "RETRY_AFTER_HOST_DOWN_THRESHOLD": 100,
    }
    started = time.monotonic()
    crawler = await crawl(requests, settings)
    await server.stop()
    healthy_done = max(a.t for a in server.arrivals(healthy)) - started
    recovered = sum(url.startswith(failing.base_url) for url, status in crawler.spider.seen)
    return healthy_done, recovered


@pytest_twisted.ensureDeferred
async def test_waiting_retries_leave_the_healthy_host_at_its_solo_speed():
    """bench/retry_isolation.py measures this precisely; here the bound is tolerant of a busy machine."""
    from scrapy_retryafter.testing.server import ThrottlingServer

    alone, _ = await _healthy_seconds(ThrottlingServer, with_failing=False)
    beside, recovered = await _healthy_seconds(ThrottlingServer, with_failing=True)
    assert recovered == 20
    # Each of the 20 failing URLs waits out two backoffs (up to 1 s, then 2 s);
    # held in the downloader they would take most of the 4 places for seconds.
    assert beside <= alone * 1.5 + 0.3, (alone, beside)


@pytest_twisted.ensureDeferred
async def test_with_jobdir_waiting_retries_recover(server, tmp_path):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    urls = [host.url(f"/{i}") for i in range(5)]
    crawler = await crawl([Request(url) for url in urls], {**settings_for("equal"), "JOBDIR": str(tmp_path / "job")})
    assert sorted(crawler.spider.seen) == [(url, 200) for url in urls]
    assert crawler.stats.get_value("scheduler/enqueued/disk") >= 10


@pytest_twisted.ensureDeferred
async def test_a_retry_still_waiting_when_the_job_stops_is_resumed_after_its_backoff(server, tmp_path):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    settings = {**settings_for("none", RETRY_AFTER_BACKOFF_BASE=3.0), "JOBDIR": str(tmp_path / "job")}
    from scrapy.crawler import CrawlerRunner
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor, task

    from .conftest import BASE_SETTINGS

    crawler = CrawlerRunner({**BASE_SETTINGS, **settings}).create_crawler(ListSpider)
    done = crawler.crawl(requests=[Request(host.url("/later"))])
    await task.deferLater(reactor, 1.0, lambda: None)
    assert crawler.stats.get_value("retry_after/backoff_retried") == 1
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    assert [a.status for a in server.arrivals(host)] == [502]
    resumed = await crawl([], settings)
    arrivals = server.arrivals(host)
    assert [a.status for a in arrivals] == [502, 200]
    assert arrivals[1].t - arrivals[0].t >= 3.0
    assert resumed.spider.seen == [(host.url("/later"), 200)]


@pytest_twisted.ensureDeferred
async def test_with_jobdir_a_retry_that_cannot_go_to_disk_waits_in_memory(server, tmp_path):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    request = Request(host.url("/unpicklable"), meta={"handle": lambda: None})
    crawler = await crawl([request], {**settings_for("equal"), "JOBDIR": str(tmp_path / "job")})
    assert crawler.spider.seen == [(host.url("/unpicklable"), 200)]
    assert [a.status for a in server.arrivals(host)] == [502, 200]
    assert crawler.stats.get_value("scheduler/unserializable") >= 1


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest_twisted.ensureDeferred
async def test_a_deadline_parks_but_exhausted_retries_reach_the_spider(server, tmp_path):
    host = server.add_host(HostConfig(fail_first=10, failure="502"))
    slow = server.add_host(HostConfig(reject_first=1, penalty=5.0))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    requests = [
        Request(host.url("/exhausted")),
        Request(host.url("/deadline"), meta={"retry_after_deadline": 0.2}),
        Request(slow.url("/throttled"), meta={"retry_after_deadline": 3}),
        Request(host.url("/post"), method="POST"),
    ]
    settings = settings_for("equal", RETRY_TIMES=1, RETRY_AFTER_BACKOFF_BASE=0.5, RETRY_AFTER_PARK_FILE=str(park_file))
    crawler = await crawl(requests, settings)
    records = {r["url"]: r for r in _records(park_file)}
    assert records[host.url("/deadline")]["reason"] == "deadline"
    assert records[slow.url("/throttled")]["reason"] == "deadline"
    # The next run starts the request's clock afresh, or the deadline would park it again at once.
    meta = records[host.url("/deadline")]["request"]["meta"]
    assert "retry_after_deadline" in meta
    assert not {"retry_after_started", "retry_after_not_before", "retry_after_backoff", "retry_times"} & set(meta)
    # Retries exhausted, or a POST refused for want of an Idempotency-Key: the failure is final,
    # the spider gets the real 502 and nothing is parked.
    assert host.url("/exhausted") not in records and host.url("/post") not in records
    failed = {f.value.response.url: f.value.response.status for f in crawler.spider.failures}
    assert failed == {host.url("/exhausted"): 502, host.url("/post"): 502}
    assert crawler.stats.get_value("retry_after/parked") == 2


@pytest_twisted.ensureDeferred
async def test_a_retry_waiting_when_the_crawl_stops_is_parked_not_lost(server, tmp_path):
    host = server.add_host(HostConfig(fail_first=1, failure="502"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = settings_for("none", RETRY_AFTER_BACKOFF_BASE=3.0, RETRY_AFTER_PARK_FILE=str(park_file))
    from scrapy.crawler import CrawlerRunner
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor, task

    from .conftest import BASE_SETTINGS

    crawler = CrawlerRunner({**BASE_SETTINGS, **settings}).create_crawler(ListSpider)
    done = crawler.crawl(requests=[Request(host.url("/waiting"))])
    await task.deferLater(reactor, 1.0, lambda: None)
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    [record] = _records(park_file)
    assert record["url"] == host.url("/waiting")
    assert record["reason"] == "held_at_close"
    assert "backoff" in record["detail"]
