"""Three scrapy-redis processes on one frontier: a throttled host waits in Redis, the free ones flow,
and a Redis killed under them loses no page."""

from __future__ import annotations

import collections
import logging

import pytest
import pytest_twisted
from twisted.internet import defer

from scrapy_retryafter.testing.fleet import Member, pause, run_fleet, scrapy_redis_settings
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON
from .redis_fixtures import own_redis, prefix, redis_server, require_redis  # noqa: F401

pytest.importorskip("scrapy_redis", reason="needs the scrapy-redis extra: pip install -e '.[test,redis,scrapy-redis]'")

FREE = HostConfig(latency=0.2)
THROTTLED = HostConfig(rate=5, penalty=1.0)
"""5 requests/s, Retry-After: 1 on a throttle."""
PAGES = 60
THROTTLED_PAGES = 30


def scrapy_redis_fleet(urls: list[str], redis_url: str, key: str) -> list[Member]:
    settings = {
        **ADDON,
        **scrapy_redis_settings(redis_url, key),
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }
    return [Member(name=name, urls=urls[i::3], settings=settings) for i, name in enumerate("ABC")]


def free_hosts_seconds(server, hosts) -> float:
    arrivals = [a.t for host in hosts for a in server.arrivals(host)]
    return max(arrivals) - min(arrivals)


@pytest_twisted.ensureDeferred
async def test_free_hosts_keep_their_pace_while_a_throttled_one_waits_in_the_frontier(server, redis_server, prefix):
    throttled = server.add_host(HostConfig(**vars(THROTTLED)))
    free = [server.add_host(HostConfig(**vars(FREE))) for _ in range(4)]
    server.start()
    alone_hosts, shared_hosts = free[:2], free[2:]
    alone_urls = [host.url(f"/page/{i}") for i in range(PAGES) for host in alone_hosts]
    alone = await run_fleet(scrapy_redis_fleet(alone_urls, redis_server.url, f"{prefix}-alone"))
    shared_urls = [host.url(f"/page/{i}") for i in range(PAGES) for host in shared_hosts]
    shared_urls += [throttled.url(f"/page/{i}") for i in range(THROTTLED_PAGES)]
    shared = await run_fleet(scrapy_redis_fleet(shared_urls, redis_server.url, f"{prefix}-shared"))

    for members, urls in ((alone, alone_urls), (shared, shared_urls)):
        for member in members:
            assert member.returncode == 0, member.log[-3000:]
            assert member.failed == [], member.log[-3000:]
        fetched = collections.Counter(url for member in members for url in member.fetched)
        assert sorted(fetched) == sorted(urls)
        assert set(fetched.values()) == {1}, [url for url, n in fetched.items() if n > 1]
    for host in (throttled, *free):
        assert collections.Counter(a.path for a in server.arrivals(host, status=200)).most_common(1)[0][1] == 1
    # Every process took part, and the throttled host was in fact throttled and waited out in Redis.
    assert all(member.fetched for member in shared)
    assert server.arrivals(throttled, status=429)
    assert not any("Traceback" in member.log for member in (*alone, *shared))
    alone_seconds = free_hosts_seconds(server, alone_hosts)
    shared_seconds = free_hosts_seconds(server, shared_hosts)
    # The acceptance is 15 % (bench/srq.py measures it side by side); a shared test machine gets slack,
    # in seconds too: the free hosts take 1.3 s where they took 2.3 s while the fleet held each wave.
    print(f"free hosts: {shared_seconds:.2f}s beside the throttled host, {alone_seconds:.2f}s alone")
    assert shared_seconds <= 1.5 * alone_seconds + 0.5, (shared_seconds, alone_seconds)
    throttled_arrivals = [a.t for a in server.arrivals(throttled)]
    assert max(throttled_arrivals) - min(throttled_arrivals) > 2 * shared_seconds  # it did hold the crawl up


@pytest_twisted.ensureDeferred
async def test_a_frontier_left_by_scrapy_redis_own_queue_is_moved_and_crawled(server, redis_server, prefix, caplog):
    import redis
    from scrapy import Request
    from scrapy_redis import picklecompat

    from .conftest import ListSpider, crawl

    host = server.add_host(HostConfig(reject_first=1, penalty=0.5))
    server.start()
    client = redis.Redis(port=redis_server.port)
    key = f"{prefix}:list:requests"
    spider = ListSpider()
    urls = [host.url(f"/old/{i}") for i in range(3)]
    # scrapy-redis's PriorityQueue: one sorted set of encoded requests, scored by -priority.
    client.zadd(key, {picklecompat.dumps(Request(url, priority=i).to_dict(spider=spider)): -i for i, url in enumerate(urls)})
    settings = {
        **ADDON,
        **scrapy_redis_settings(redis_server.url, prefix),
    }
    with caplog.at_level(logging.INFO, logger="scrapy_retryafter"):
        crawler = await crawl([], settings)
    assert sorted(url for url, status in crawler.spider.seen if status == 200) == sorted(urls)
    assert client.exists(key) == 0
    assert client.get(f"{key}:count") in (b"0", None)
    assert any("Moved 3 request(s) from scrapy-redis's zset" in r.getMessage() for r in caplog.records)
    throttle = server.arrivals(host, status=429)[0]
    assert all(a.t >= throttle.t + 0.5 for a in server.arrivals(host, status=200))  # the cooldown held them in Redis


OUTAGE_FREE = HostConfig(latency=1.0)
"""Slow enough that responses keep arriving (and links keep being found) while Redis is down."""
OUTAGE_THROTTLED = HostConfig(rate=5, penalty=1.0, latency=0.2)
OUTAGE_PARENTS = 12
"""Pages per free host listed at the start; each links to one more, found when it is fetched."""
OUTAGE_THROTTLED_PARENTS = 6


def frontier_left(client, key: str) -> dict[str, int]:
    """Requests still in the shared frontier: its count, and what the per-slot sets hold."""
    queue_key = f"{key}:fleet:requests"
    held = {name: client.zcard(name) for name in client.keys(f"{queue_key}:slot:*")}
    return {
        "count": int(client.get(f"{queue_key}:count") or 0),
        "in_slots": sum(held.values()),
        "later": client.zcard(f"{queue_key}:later"),
    }


@pytest_twisted.ensureDeferred
async def test_redis_with_aof_killed_mid_crawl_every_process_finishes_and_every_page_is_fetched(
    server, own_redis, prefix
):
    throttled = server.add_host(HostConfig(**vars(OUTAGE_THROTTLED)))
    free = [server.add_host(HostConfig(**vars(OUTAGE_FREE))) for _ in range(2)]
    server.start()
    seeds = [host.url(f"/page/{i}") for i in range(OUTAGE_PARENTS) for host in free]
    seeds += [throttled.url(f"/page/{i}") for i in range(OUTAGE_THROTTLED_PARENTS)]
    urls = seeds + [f"{url}/child/0" for url in seeds]
    members = scrapy_redis_fleet(seeds, own_redis.url, prefix)
    for member in members:
        member.settings = {**member.settings, "RETRY_AFTER_MAX_RETRIES": 30, "FLEET_CHILDREN": 1}
    running = defer.ensureDeferred(run_fleet(members, timeout=60))
    while len(server.arrivals(status=200)) < len(urls) // 3 and not running.called:
        await pause(0.05)
    crawled_before = len(server.log)
    own_redis.kill()
    await pause(2.0)
    own_redis.start()
    await running

    for member in members:
        assert member.returncode == 0, member.log[-3000:]
        assert member.failed == [], member.log[-3000:]
        assert "Traceback" not in member.log, member.log[-3000:]
        # One WARNING when the frontier was lost, one INFO when it was back: not a line per request.
        lost, back = member.log.count("WARNING: Redis frontier at"), member.log.count("INFO: Redis frontier at")
        assert lost <= 1 and back == lost, member.log[-3000:]
    ok = collections.Counter(host.url(a.path) for host in (throttled, *free) for a in server.arrivals(host, status=200))
    assert sorted(ok) == sorted(urls), sorted(set(urls) - set(ok))
    duplicates = {url: n for url, n in ok.items() if n > 1}
    assert frontier_left(own_redis.client(), prefix) == {"count": 0, "in_slots": 0, "later": 0}
    stats = collections.Counter()
    for member in members:
        stats.update({k: v for k, v in member.stats.items() if k.startswith("retry_after/redis/")})
    print(
        f"pages: {len(urls)}, fetched twice: {len(duplicates)}, arrivals before the kill: {crawled_before}, "
        f"in all: {len(server.log)}, {dict(stats)}"
    )
    # Every process that noticed the outage said so once and said when it was over.
    assert stats["retry_after/redis/frontier_lost"] >= 1
    assert stats["retry_after/redis/frontier_lost"] == stats["retry_after/redis/frontier_reconnected"]
    # Links were found and retries scheduled while Redis was down: they waited in their process.
    assert stats["retry_after/redis/frontier_kept"] >= 1
