"""Real crawls against the throttling server: the core promises of the package."""

from __future__ import annotations

import json
import logging
import time

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.utils.defer import deferred_from_coro

from scrapy_retryafter import RetryAfterSettingError
from scrapy_retryafter.retry_reporting import SCRAPY_HAS_GIVE_UP_LEVEL
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

PAD = 1.25
JITTER = 1.0
DISPATCH = 0.5


def gaps(arrivals):
    return [b.t - a.t for a, b in zip(arrivals, arrivals[1:])]


@pytest.mark.parametrize("form", ["seconds", "date"])
@pytest_twisted.ensureDeferred
async def test_retry_after_2_holds_the_retry_for_2_5_seconds(server, form):
    host = server.add_host(HostConfig(reject_first=1, penalty=2.0, retry_after=form))
    server.start()
    crawler = await crawl([Request(host.url("/page/1"))], ADDON)
    arrivals = server.arrivals(host)
    assert [a.status for a in arrivals] == [429, 200]
    gap = gaps(arrivals)[0]
    assert 2 * PAD - 0.01 <= gap <= 2 * PAD + JITTER + DISPATCH
    assert crawler.spider.seen == [(host.url("/page/1"), 200)]
    stats = crawler.stats.get_stats()
    assert stats["retry_after/throttled/429"] == 1
    assert stats["retry_after/retried"] == 1
    # Scrapy's own retry stats count the throttle too, with stock's reason string.
    assert stats["retry/count"] == 1
    assert stats["retry/reason_count/429 Unknown Status"] == 1


@pytest_twisted.ensureDeferred
async def test_http_date_is_measured_against_the_response_date(server):
    # The server's clock is an hour behind ours: only its own Date makes sense of it.
    host = server.add_host(HostConfig(reject_first=1, penalty=2.0, retry_after="date", clock_skew=-3600))
    server.start()
    await crawl([Request(host.url("/"))], ADDON)
    arrivals = server.arrivals(host)
    assert [a.status for a in arrivals] == [429, 200]
    assert 2 * PAD - 0.01 <= gaps(arrivals)[0] <= 2 * PAD + JITTER + DISPATCH


@pytest_twisted.ensureDeferred
async def test_a_cooldown_holds_its_whole_slot_while_another_host_is_served(server):
    slow = server.add_host(HostConfig(reject_first=1, penalty=2.0))
    free = server.add_host(HostConfig(latency=0.05))
    server.start()
    slow_address = slow.address
    settings = {
        **ADDON,
        # A download delay keeps requests waiting inside the downloader slot:
        # those were handed over before the throttle and must not be sent.
        "DOWNLOAD_SLOTS": {slow_address: {"concurrency": 4, "delay": 0.4}},
        "CONCURRENT_REQUESTS": 16,
    }
    requests = [Request(slow.url(f"/a/{i}")) for i in range(6)]
    requests += [Request(free.url(f"/b/{i}")) for i in range(60)]
    crawler = await crawl(requests, settings)
    throttled = server.arrivals(slow, status=429)
    assert len(throttled) == 1
    window_start = throttled[0].t
    window_end = window_start + 2 * PAD
    inside = [a for a in server.arrivals(slow) if window_start < a.t < window_end]
    assert inside == []
    served_meanwhile = [a for a in server.arrivals(free) if window_start < a.t < window_end]
    assert served_meanwhile
    assert len({url for url, status in crawler.spider.seen if status == 200}) == 66
    assert crawler.stats.get_value("retry_after/sent_back") >= 1


@pytest.mark.parametrize("form", ["absent", "garbage"])
@pytest_twisted.ensureDeferred
async def test_no_usable_retry_after_falls_back_to_bounded_jittered_backoff(server, form):
    host = server.add_host(HostConfig(reject_first=3, penalty=0, retry_after=form))
    server.start()
    # Pacing (which starts at 1 request/s on a slot throttled before any success) is another layer: off here.
    settings = {**ADDON, "RETRY_AFTER_BACKOFF_BASE": 0.2, "RETRY_AFTER_BACKOFF_MAX": 0.4, "RETRY_AFTER_WAKE_JITTER": 0,
                "RETRY_AFTER_ADAPTIVE": False}
    crawler = await crawl([Request(host.url("/"))], settings)
    arrivals = server.arrivals(host)
    assert [a.status for a in arrivals] == [429, 429, 429, 200]
    for attempt, gap in enumerate(gaps(arrivals), start=1):
        assert gap <= min(0.4, 0.2 * 2 ** (attempt - 1)) + DISPATCH
    invalid = crawler.stats.get_value("retry_after/header_invalid")
    assert invalid == (3 if form == "garbage" else None)


@pytest_twisted.ensureDeferred
async def test_retry_after_over_the_cap_gives_up_the_slot_at_once(server):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    started = time.monotonic()
    settings = {**ADDON, "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "RETRY_AFTER_PARKING": False}
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(5)], settings)
    assert time.monotonic() - started < 5
    assert len(server.arrivals(host)) == 1
    assert crawler.stats.get_value("retry_after/gave_up") == 5
    assert crawler.spider.seen == []
    assert len(crawler.spider.failures) == 5


@pytest_twisted.ensureDeferred
async def test_gives_up_after_max_retries_and_scrapy_does_not_retry_again(server):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="0.2"))
    server.start()
    settings = {
        **ADDON, "RETRY_AFTER_MAX_RETRIES": 2, "RETRY_AFTER_PAD": 1.0, "RETRY_AFTER_WAKE_JITTER": 0,
        "RETRY_AFTER_PARKING": False,
    }
    crawler = await crawl([Request(host.url("/"))], settings)
    assert len(server.arrivals(host)) == 3
    stats = crawler.stats.get_stats()
    assert stats["retry_after/gave_up"] == 1
    assert stats["retry_after/retried"] == 2
    assert stats["retry/count"] == 2  # our two; Scrapy's RetryMiddleware does not retry the final 429
    assert len(crawler.spider.failures) == 1  # HttpError for the final 429


@pytest.mark.skipif(not SCRAPY_HAS_GIVE_UP_LEVEL, reason="Scrapy < 2.17 has no RETRY_GIVE_UP_LOG_LEVEL")
@pytest_twisted.ensureDeferred
async def test_a_give_up_log_level_that_is_no_level_fails_at_start(server):
    host = server.add_host()
    server.start()
    with pytest.raises(RetryAfterSettingError, match="RETRY_GIVE_UP_LOG_LEVEL"):
        await crawl([Request(host.url("/"))], {**ADDON, "RETRY_GIVE_UP_LOG_LEVEL": "LOUD"})
    assert server.arrivals(host) == []


@pytest.mark.parametrize("level", [None, "INFO"])
@pytest_twisted.ensureDeferred
async def test_the_give_up_line_honours_retry_give_up_log_level(server, caplog, level):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="0.1"))
    server.start()
    settings = {**ADDON, "RETRY_AFTER_MAX_RETRIES": 1, "RETRY_AFTER_PAD": 1.0, "RETRY_AFTER_PARKING": False}
    if level is not None:
        settings["RETRY_GIVE_UP_LOG_LEVEL"] = level
    with caplog.at_level(logging.DEBUG, logger="scrapy_retryafter"):
        crawler = await crawl([Request(host.url("/"))], settings)
    [line] = [r for r in caplog.records if r.getMessage().startswith("Gave up")]
    # Stock's default, ERROR; the setting only on Scrapy 2.17+, as stock.
    assert line.levelname == ("INFO" if level and SCRAPY_HAS_GIVE_UP_LEVEL else "ERROR")
    assert crawler.stats.get_value("retry/count") == 1


@pytest.mark.parametrize("key, expected", [(None, [503]), ("k-1", [503, 200])])
@pytest_twisted.ensureDeferred
async def test_post_on_503_is_retried_only_with_an_idempotency_key(server, key, expected):
    host = server.add_host(HostConfig(status=503, reject_first=1, penalty=0.01, retry_after="0.2"))
    server.start()
    headers = {"Idempotency-Key": key} if key else {}
    crawler = await crawl([Request(host.url("/order"), method="POST", body=b"x", headers=headers)], {**ADDON, "RETRY_AFTER_WAKE_JITTER": 0})
    assert [a.status for a in server.arrivals(host)] == expected
    if key:
        assert server.arrivals(host)[1].headers["idempotency-key"] == key
    else:
        assert crawler.stats.get_value("retry_after/gave_up") == 1


@pytest_twisted.ensureDeferred
async def test_post_on_429_is_retried_without_a_key(server):
    host = server.add_host(HostConfig(reject_first=1, penalty=0.01, retry_after="0.2"))
    server.start()
    await crawl([Request(host.url("/order"), method="POST", body=b"x")], {**ADDON, "RETRY_AFTER_WAKE_JITTER": 0})
    assert [a.status for a in server.arrivals(host)] == [429, 200]


@pytest_twisted.ensureDeferred
async def test_custom_settings_and_per_slot_overrides(server):
    strict = server.add_host(HostConfig(reject_first=1, penalty=0.01, retry_after="0.2"))
    lenient = server.add_host(HostConfig(reject_first=1, penalty=0.01, retry_after="0.2"))
    server.start()

    from .conftest import ListSpider

    class Configured(ListSpider):
        custom_settings = {
            **ADDON,
            "RETRY_AFTER_WAKE_JITTER": 0,
            "RETRY_AFTER_SLOTS": {strict.address: {"max_retries": 0}},
        }

    crawler = await crawl([Request(strict.url("/")), Request(lenient.url("/"))], spider_cls=Configured)
    assert [a.status for a in server.arrivals(strict)] == [429]
    assert [a.status for a in server.arrivals(lenient)] == [429, 200]
    assert crawler.stats.get_value("retry_after/gave_up") == 1


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"RETRY_AFTER_PAD": -1}, "RETRY_AFTER_PAD"),
        ({"RETRY_AFTER_MAX_DELAY": -5}, "RETRY_AFTER_MAX_DELAY"),
        ({"RETRY_AFTER_HTTP_CODES": [429, 700]}, "RETRY_AFTER_HTTP_CODES"),
        ({"RETRY_AFTER_SLOTS": {"example.com": {"retries": 3}}}, "RETRY_AFTER_SLOTS['example.com'] has unknown key(s) 'retries'"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_invalid_settings_stop_the_crawl_at_start(server, settings, named):
    host = server.add_host()
    server.start()
    with pytest.raises(RetryAfterSettingError, match=named.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        await crawl([Request(host.url("/"))], {**ADDON, **settings})
    assert server.arrivals(host) == []


@pytest_twisted.ensureDeferred
async def test_middleware_alone_still_obeys_the_cooldown(server):
    host = server.add_host(HostConfig(reject_first=1, penalty=2.0))
    server.start()
    settings = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(3)], {**settings, "CONCURRENT_REQUESTS_PER_DOMAIN": 1})
    arrivals = server.arrivals(host)
    assert [a.status for a in arrivals] == [429, 200, 200, 200]
    assert gaps(arrivals)[0] >= 2 * PAD - 0.01
    assert crawler.stats.get_value("retry/count") == 1


@pytest_twisted.ensureDeferred
async def test_middleware_alone_keeps_scrapy_from_retrying_after_a_give_up(server):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="0.1"))
    server.start()
    settings = {
        "DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560},
        "RETRY_AFTER_MAX_RETRIES": 1,
        "RETRY_AFTER_PAD": 1.0,
    }
    crawler = await crawl([Request(host.url("/"))], settings)
    assert len(server.arrivals(host)) == 2
    assert crawler.stats.get_value("retry/count") == 1  # ours; none by Scrapy's after the give-up


@pytest_twisted.ensureDeferred
async def test_a_throttle_is_never_served_from_the_http_cache(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=1, penalty=0.2, retry_after="1"))
    server.start()
    settings = {**ADDON, "HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path / "cache"), "RETRY_AFTER_PAD": 1.0}
    crawler = await crawl([Request(host.url("/"))], settings)
    assert [a.status for a in server.arrivals(host)] == [429, 200]
    assert crawler.spider.seen == [(host.url("/"), 200)]


@pytest_twisted.ensureDeferred
async def test_stopping_during_a_long_cooldown_ends_the_crawl_within_seconds_and_parks_the_held(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=1, penalty=60.0))
    server.start()
    from scrapy.crawler import CrawlerRunner

    from .conftest import BASE_SETTINGS, ListSpider

    park_file = tmp_path / "parked.jsonl"
    runner = CrawlerRunner({**BASE_SETTINGS, **ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    crawler = runner.create_crawler(ListSpider)
    done = crawler.crawl(requests=[Request(host.url(f"/{i}")) for i in range(4)])
    from twisted.internet import reactor, task

    await task.deferLater(reactor, 1.0, lambda: None)
    assert crawler.stats.get_value("retry_after/throttled") >= 1
    stopping = time.monotonic()
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    assert time.monotonic() - stopping < 3
    records = [json.loads(line) for line in park_file.read_text().splitlines()]
    assert sorted(r["url"] for r in records) == sorted(host.url(f"/{i}") for i in range(4))
    assert {r["reason"] for r in records} == {"held_at_close"}
    assert crawler.spider.failures == []


@pytest_twisted.ensureDeferred
async def test_held_requests_are_spread_over_the_wake_window(server):
    host = server.add_host(HostConfig(reject_first=1, penalty=1.0))
    server.start()
    # A paced slot (RETRY_AFTER_ADAPTIVE) releases one request per interval instead.
    settings = {**ADDON, "CONCURRENT_REQUESTS_PER_DOMAIN": 16, "RETRY_AFTER_WAKE_JITTER": 1.0, "RETRY_AFTER_ADAPTIVE": False}
    await crawl([Request(host.url(f"/{i}")) for i in range(12)], settings)
    # The first burst is on the wire together; everything after it was held.
    throttled = server.arrivals(host, status=429)
    first, last = throttled[0].t, throttled[-1].t
    assert last - first < 0.1
    later = [a.t for a in server.arrivals(host) if a.t > last]
    assert len(server.arrivals(host, status=200)) == len(later) == 12
    assert all(first + 1.0 * PAD - 0.01 <= t <= last + 1.0 * PAD + JITTER + DISPATCH for t in later)
    assert max(later) - min(later) > 0.2  # not one stampede at the reopening instant


@pytest_twisted.ensureDeferred
async def test_with_jobdir_held_requests_wait_on_disk_and_the_crawl_completes(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=1, penalty=1.0))
    server.start()
    jobdir = tmp_path / "job"
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(5)], {**ADDON, "JOBDIR": str(jobdir)})
    assert len({url for url, status in crawler.spider.seen if status == 200}) == 5
    assert crawler.stats.get_value("scheduler/enqueued/disk") >= 6
    assert isinstance(__import__("json").loads((jobdir / "requests.queue" / "active.json").read_text()), dict)


@pytest_twisted.ensureDeferred
async def test_disabled_leaves_scrapy_alone(server):
    host = server.add_host(HostConfig(reject_first=1, penalty=0, retry_after="5"))
    server.start()
    crawler = await crawl([Request(host.url("/"))], {**ADDON, "RETRY_AFTER_ENABLED": False})
    arrivals = server.arrivals(host)
    assert [a.status for a in arrivals] == [429, 200]
    assert arrivals[1].t - arrivals[0].t < 1  # Scrapy's immediate retry, not a 5 s cooldown
    assert crawler.stats.get_value("retry/count") == 1
    assert crawler.stats.get_value("retry_after/throttled") is None


@pytest_twisted.ensureDeferred
async def test_a_compressed_throttle_is_handled_once(server):
    # HttpCompressionMiddleware (590) replaces the response before we (560) see it.
    host = server.add_host(HostConfig(reject_first=1, penalty=0.01, retry_after="0.2", gzip=True))
    server.start()
    crawler = await crawl([Request(host.url("/"))], {**ADDON, "RETRY_AFTER_WAKE_JITTER": 0})
    assert [a.status for a in server.arrivals(host)] == [429, 200]
    assert crawler.stats.get_value("retry_after/throttled") == 1
    assert crawler.stats.get_value("retry_after/retried") == 1
    assert crawler.spider.seen == [(host.url("/"), 200)]


MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}


@pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["add-on", "middleware only"])
@pytest_twisted.ensureDeferred
async def test_an_outage_opens_the_circuit_and_probes_until_recovery(server, mode):
    outage = server.add_host(HostConfig(status=503, outage=(0.0, 4.0), retry_after="absent"))
    other = server.add_host()
    server.start()
    opened, closed = [], []
    from scrapy_retryafter import signals as ra_signals

    from .conftest import ListSpider

    class Watching(ListSpider):
        @classmethod
        def from_crawler(cls, crawler, *args, **kwargs):
            spider = super().from_crawler(crawler, *args, **kwargs)
            crawler.signals.connect(lambda **kw: opened.append(kw), signal=ra_signals.circuit_opened, weak=False)
            crawler.signals.connect(lambda **kw: closed.append(kw), signal=ra_signals.circuit_closed, weak=False)
            return spider

    settings = {
        **mode,
        "RETRY_AFTER_CIRCUIT_THRESHOLD": 3,
        "RETRY_AFTER_CIRCUIT_OPEN_SECONDS": 1.0,
        "RETRY_AFTER_BACKOFF_BASE": 0.1,
        "RETRY_AFTER_BACKOFF_MAX": 0.2,
        "RETRY_AFTER_MAX_RETRIES": 50,
        "RETRY_AFTER_BUDGET_MAX_TOKENS": 1000,  # the budget has its own test; here every page is fetched in this run
        "RETRY_AFTER_ADAPTIVE": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "CONCURRENT_REQUESTS": 2,  # at most one request waits in a downloader slot
    }
    requests = [Request(outage.url(f"/{i}")) for i in range(10)] + [Request(other.url(f"/{i}")) for i in range(10)]
    crawler = await crawl(requests, settings, spider_cls=Watching)
    during = [a for a in server.arrivals(outage) if a.t - server.started < 4.0]
    probes = len(opened)  # each reopening was caused by one probe
    # The middleware alone sees a request before the downloader slot queues it:
    # one already waiting there when the circuit opens still goes out.
    queued = len(opened) if mode is MIDDLEWARE_ONLY else 0
    assert opened and closed and closed[0]["slot"] == outage.address
    assert len(during) <= 3 + probes + queued, (len(during), probes, queued)
    assert len({url for url, status in crawler.spider.seen if status == 200}) == 20
    assert crawler.stats.get_value("retry_after/circuit_opened") == len(opened)
    assert all(a.status == 200 for a in server.arrivals(other))


@pytest_twisted.ensureDeferred
async def test_the_retry_budget_stops_blind_retries_during_an_outage_and_holds_the_rest(server, tmp_path):
    host = server.add_host(HostConfig(status=503, outage=(0.0, 4.0), retry_after="absent"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **ADDON,
        "RETRY_AFTER_PARK_FILE": str(park_file),
        "RETRY_AFTER_BACKOFF_BASE": 0.05,
        "RETRY_AFTER_BACKOFF_MAX": 1.0,
        "RETRY_AFTER_MAX_RETRIES": 50,
        "RETRY_AFTER_CIRCUIT_THRESHOLD": 1000,
        "RETRY_AFTER_HOST_DOWN_THRESHOLD": 1000,  # the budget alone pauses the host here
        "RETRY_AFTER_ADAPTIVE": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    }
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(20)], settings)
    stats = crawler.stats.get_stats()
    # 10 tokens, blind retries allowed while more than 5 are left: 4 retries, then the host is
    # paused and probed until it answers; nothing is parked, every page is fetched in this run.
    assert stats["retry_after/budget_spent"] == 1
    assert stats["retry_after/host_paused"] == 1
    assert stats["retry_after/host_resumed"] == 1
    during = [a for a in server.arrivals(host) if a.t - server.started < 4.0]
    # 5 before the pause, then one probe per interval: intervals of at least half the backoff
    # ceiling (0.05 s doubling to the 1 s cap) fit at most 11 probes in 4 s.
    assert len(during) <= 5 + 11, len(during)
    assert not park_file.exists() or park_file.read_text() == ""
    assert {url for url, status in crawler.spider.seen if status == 200} == {host.url(f"/{i}") for i in range(20)}
    assert crawler.spider.failures == []


@pytest_twisted.ensureDeferred
async def test_retries_that_obey_retry_after_spend_no_budget(server):
    host = server.add_host(HostConfig(reject_first=12, penalty=0.0, retry_after="0.05"))
    server.start()
    settings = {**ADDON, "RETRY_AFTER_MAX_RETRIES": 50, "RETRY_AFTER_ADAPTIVE": False, "RETRY_AFTER_PAD": 1.0,
                "RETRY_AFTER_WAKE_JITTER": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    crawler = await crawl([Request(host.url("/"))], settings)
    assert crawler.stats.get_value("retry_after/retried") == 12
    assert crawler.stats.get_value("retry_after/budget_spent") is None
    assert crawler.spider.seen == [(host.url("/"), 200)]
