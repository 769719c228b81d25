"""scrapy-redis's parts on a Redis that goes away: no request is dropped, none is left behind at close."""

from __future__ import annotations

import json
import logging

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.fleet import pause, scrapy_redis_settings
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl
from .redis_fixtures import own_redis, prefix, require_redis  # noqa: F401

pytest.importorskip("scrapy_redis", reason="needs the scrapy-redis extra: pip install -e '.[test,redis,scrapy-redis]'")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_while_redis_is_down_unseen_requests_pass_and_their_fingerprints_are_added_when_it_is_back(
    own_redis, prefix, caplog
):
    import redis

    from scrapy_retryafter.redis.dupefilter import OutageTolerantDupeFilter
    from scrapy_retryafter.redis.link import FrontierLink

    server = redis.Redis(port=own_redis.port)
    clock = Clock()
    link = FrontierLink(server, timeout=0.2, clock=clock)
    dupefilter = OutageTolerantDupeFilter(server, f"{prefix}:dupefilter")
    dupefilter.attach(link)
    first, second, third = (Request(f"http://127.0.0.1/{name}") for name in ("first", "second", "third"))
    assert dupefilter.request_seen(first) is False
    assert dupefilter.request_seen(first) is True

    own_redis.kill()
    with caplog.at_level(logging.INFO, logger="scrapy_retryafter"):
        assert dupefilter.request_seen(second) is False
        assert dupefilter.request_seen(second) is True  # this process met it during the outage
        # Redis's set cannot be asked: a page seen before may be fetched again (a duplicate, never a loss).
        assert dupefilter.request_seen(first) is False
        clock.now += 0.01
        assert dupefilter.request_seen(third) is False  # not tried again yet: no connection attempt per request
        own_redis.start()
        clock.now = link.outage.retry_at
        assert dupefilter.request_seen(third) is True  # met during the outage, now added with the others
    fingerprints = {dupefilter.request_fingerprint(r).encode() for r in (first, second, third)}
    assert server.smembers(f"{prefix}:dupefilter") == fingerprints
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == ["WARNING", "INFO"], messages
    assert "unreachable" in messages[0][1]
    assert "is back after" in messages[1][1] and "3 fingerprint(s)" in messages[1][1]


@pytest.mark.parametrize("parking", [True, False])
@pytest_twisted.ensureDeferred
async def test_a_crawl_closed_while_redis_is_down_parks_what_redis_never_took_and_the_next_run_fetches_all(
    server, own_redis, prefix, tmp_path, caplog, parking
):
    from twisted.internet import defer

    # Two requests in flight when Redis dies, both answered 429 a second later.
    host = server.add_host(HostConfig(reject_first=2, penalty=0.2, latency=1.0))
    server.start()
    urls = [host.url(f"/page/{i}") for i in range(8)]
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **ADDON,
        **scrapy_redis_settings(own_redis.url, prefix),
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "RETRY_AFTER_PARK_FILE": str(park_file),
        "RETRY_AFTER_PARKING": parking,
    }
    with caplog.at_level(logging.INFO, logger="scrapy_retryafter"):
        running = defer.ensureDeferred(crawl([Request(url) for url in urls], {**settings, "CLOSESPIDER_TIMEOUT": 3}))
        while len(server.arrivals(host)) < 2:
            await pause(0.02)
        own_redis.kill()
        first = await running
    stats = first.stats.get_stats()
    assert stats["finish_reason"] == "closespider_timeout"  # never "finished": the frontier could not be seen
    # The retries of the two 429s could not be pushed; seeds not yet enqueued (Scrapy 2.13 reads
    # start() as the scheduler drains) may have been kept with them.
    retried = {host.url(a.path) for a in server.arrivals(host, status=429)}
    kept = stats["retry_after/redis/frontier_kept"]
    assert len(retried) >= 2
    if parking:
        records = [json.loads(line) for line in park_file.read_text().splitlines() if line.strip()]
        unsent = [r["url"] for r in records if r.get("detail") == "Redis was unreachable"]
    else:
        # Said once, naming each request, as an ERROR: never dropped silently.
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and f"{kept} request(s) scheduled while it was down are lost" in errors[0]
        unsent = [url for url in urls if f"'{url}'" in errors[0]]
        assert stats["retry_after/redis/frontier_lost_at_close"] == kept
    assert len(unsent) == len(set(unsent)) == kept
    assert retried <= set(unsent)

    own_redis.start()  # with AOF: the requests never popped are still in the frontier
    second = await crawl([], settings)
    expected = urls if parking else sorted(set(urls) - set(unsent))
    assert sorted(url for url, status in second.spider.seen if status == 200) == sorted(expected)
    assert sorted({host.url(a.path) for a in server.arrivals(host, status=200)}) == sorted(expected)
