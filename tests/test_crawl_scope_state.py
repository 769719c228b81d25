"""A scope slot's state outlives the run, as a host's does: the park file, the per-host state file, JOBDIR and Redis.

A scope key is the request's download slot, so each store keys it by the
scope: a key refused for an hour is parked and remembered alone, and the next
run sends that key nothing while the other key on the same host is fetched;
a crawl stopped while one key cools down resumes with that key still cooling;
a key's cooldown on the Redis board holds that key, not the host, in the next
process. Real crawls, with the add-on and with the middleware alone.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.crawler import CrawlerRunner
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import reactor, task

from scrapy_retryafter.parkfile import read_log
from scrapy_retryafter.refusals import HOST_STATE_NAME
from scrapy_retryafter.testing.scoped_server import Limit, ScopedHostConfig, ScopedServer

from .conftest import ADDON, BASE_SETTINGS, ListSpider, crawl
from .redis_fixtures import prefix, redis_server  # noqa: F401

MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}
MODES = pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["addon", "middleware-only"])
SCOPES = {"RETRY_AFTER_SCOPES": ["header:X-Api-Key"]}
KEY = "x-api-key"


@pytest.fixture
def scoped():
    srv = ScopedServer()
    yield srv
    pytest_twisted.blockon(srv.stop())


def _keyed(host: Any, a_pages: int, b_pages: int) -> list[Request]:
    """Keys a and b taking turns, so neither key's pages are all on the wire before the other's first answer."""
    pages = {"a": a_pages, "b": b_pages}
    return [
        Request(host.url(f"/{key}/{i}"), headers={"X-Api-Key": key})
        for i in range(max(pages.values())) for key in "ab" if i < pages[key]
    ]


def _parked(path: Path) -> list[dict[str, Any]]:
    return [json.loads(entry.line) for entry in read_log(path).records.values()]


@MODES
@pytest_twisted.ensureDeferred
async def test_a_key_refused_for_an_hour_is_parked_and_remembered_alone(scoped: ScopedServer, tmp_path: Path, mode: dict) -> None:
    host = scoped.add_host(ScopedHostConfig(
        key_header="X-Api-Key", key_limit=Limit(rate=100, burst=100), key_limits={"b": Limit(rate=1, penalty=3600)},
    ))
    scoped.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**mode, **SCOPES, "RETRY_AFTER_PARK_FILE": str(park_file)}
    requests = _keyed(host, 40, 10)
    b_urls = {r.url for r in requests if "/b/" in r.url}

    first = await crawl(requests, settings)
    got = collections.Counter(url for url, status in first.spider.seen if status == 200)
    assert {u for u in got if "/a/" in u} == {r.url for r in requests if "/a/" in r.url}
    b_sent = scoped.arrivals(host, header=("X-Api-Key", "b"))
    assert len(b_sent) <= 16 and sum(a.status == 429 for a in b_sent) >= 1
    fetched_b = {u for u in got if "/b/" in u}
    records = _parked(park_file)
    assert {r["url"] for r in records} == b_urls - fetched_b, (len(records), len(fetched_b))
    assert {r["reason"] for r in records} == {"over_cap"}
    (slot,) = {r["slot"] for r in records}
    assert slot.startswith(f"header={host.address.split(':')[0]}@{KEY}~"), slot
    state = json.loads((tmp_path / HOST_STATE_NAME).read_text())["hosts"]
    refused = [name for name, entry in state.items() if entry.get("refusal")]
    assert refused == [slot], state  # key b's scope slot, not key a's, not the host

    # The next run, within the hour: key b gets nothing, key a is fetched, one record per b page.
    a_before = len(scoped.arrivals(host, header=("X-Api-Key", "a")))
    second = await crawl(_keyed(host, 40, 10), settings)
    assert len(scoped.arrivals(host, header=("X-Api-Key", "b"))) == len(b_sent)
    assert len(scoped.arrivals(host, header=("X-Api-Key", "a"))) >= a_before + 40
    assert len([u for u, s in second.spider.seen if s == 200]) == 40
    assert sorted(r["url"] for r in _parked(park_file)) == sorted(b_urls)
    assert second.stats.get_value("retry_after/refusals_loaded") == 1


@MODES
@pytest_twisted.ensureDeferred
async def test_a_scoped_crawl_stopped_while_one_key_cools_resumes_with_that_key_still_cooling(
    scoped: ScopedServer, tmp_path: Path, mode: dict
) -> None:
    host = scoped.add_host(ScopedHostConfig(
        key_header="X-Api-Key", key_limit=Limit(rate=100, burst=100), key_limits={"b": Limit(rate=2, burst=2, penalty=3)},
        latency=0.2,
    ))
    scoped.start()
    jobdir = str(tmp_path / "job")
    settings = {
        **BASE_SETTINGS, **mode, **SCOPES, "JOBDIR": jobdir, "RETRY_AFTER_PAD": 1.0, "RETRY_AFTER_WAKE_JITTER": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }
    requests = _keyed(host, 60, 4)
    crawler = CrawlerRunner(settings).create_crawler(ListSpider)
    done = crawler.crawl(requests=requests)
    await task.deferLater(reactor, 1.0, lambda: None)
    throttled = scoped.arrivals(host, status=429, header=("X-Api-Key", "b"))
    assert throttled, scoped.arrivals(host)
    throttled_at = throttled[0].t
    a_meanwhile = [a for a in scoped.arrivals(host, status=200, header=("X-Api-Key", "a")) if a.t > throttled_at + 0.3]
    assert a_meanwhile  # key a kept going while key b cooled
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    resumed_at = time.monotonic()
    assert resumed_at < throttled_at + 3.0  # still cooling when the job resumes

    resumed = await crawl([], {k: v for k, v in settings.items() if k != "CONCURRENT_REQUESTS_PER_DOMAIN"})
    later_b = [a for a in scoped.arrivals(host, header=("X-Api-Key", "b")) if a.t >= resumed_at]
    assert later_b and min(a.t for a in later_b) >= throttled_at + 3.0 - 0.05, (throttled_at, [a.t for a in later_b])
    fetched = collections.Counter(a.path for a in scoped.arrivals(host, status=200))
    assert set(fetched) == {f"/{k}/{i}" for k, n in (("a", 60), ("b", 4)) for i in range(n)}
    assert set(fetched.values()) == {1}, fetched
    assert resumed.stats.get_value("retry_after/parked") is None  # JOBDIR kept the held ones


@MODES
@pytest_twisted.ensureDeferred
async def test_a_keys_cooldown_on_the_redis_board_holds_that_key_in_the_next_process_and_not_the_other(
    scoped: ScopedServer, mode: dict, redis_server: Any, prefix: str  # noqa: F811
) -> None:
    host = scoped.add_host(ScopedHostConfig(
        key_header="X-Api-Key", key_limit=Limit(rate=100, burst=100), key_limits={"b": Limit(rate=2, burst=2, penalty=4)},
    ))
    scoped.start()
    fleet = {
        **mode, **SCOPES, "RETRY_AFTER_REDIS_URL": redis_server.url, "RETRY_AFTER_REDIS_PREFIX": prefix,
        "RETRY_AFTER_PAD": 1.0, "RETRY_AFTER_WAKE_JITTER": 0, "RETRY_AFTER_HOST_STATE": False,
    }
    await crawl(_keyed(host, 4, 8), {**fleet, "CLOSESPIDER_TIMEOUT": 1})
    throttled_at = scoped.arrivals(host, status=429, header=("X-Api-Key", "b"))[0].t
    started = time.monotonic()
    assert started < throttled_at + 4.0  # the first process is gone; the cooldown is only in Redis

    def fresh(key: str, pages: int) -> list[Request]:
        return [Request(host.url(f"/{key}/new{i}"), headers={"X-Api-Key": key}) for i in range(pages)]

    second = await crawl(fresh("a", 4) + fresh("b", 2), fleet)
    assert sorted(u for u, s in second.spider.seen if s == 200) == sorted(r.url for r in fresh("a", 4) + fresh("b", 2))
    later = [a for a in scoped.arrivals(host) if a.t >= started]
    b_later = [a.t for a in later if a.headers.get(KEY) == "b"]
    a_later = [a.t for a in later if a.headers.get(KEY) == "a"]
    assert min(b_later) >= throttled_at + 4.0 - 0.05, (throttled_at, b_later)
    assert min(a_later) < throttled_at + 3.0, (throttled_at, a_later)  # key a was not held with it
