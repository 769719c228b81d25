"""The parking lot in real crawls: nothing given up is lost, nothing parked runs early."""

from __future__ import annotations

import json
import os
import stat
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.parkfile import ParkFile, iso
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, ListSpider, crawl


def _records(path: Path) -> list[dict]:
    """The file's record lines (a file with nothing left in it is removed)."""
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if "url" in r]


def _when(record: dict) -> float:
    return datetime.fromisoformat(record["not_before"].replace("Z", "+00:00")).timestamp()


class OtherCallbackSpider(ListSpider):
    def parse_page(self, response):
        self.seen.append((response.url, response.status, response.meta.get("tag")))


@pytest_twisted.ensureDeferred
async def test_retry_after_over_the_cap_parks_every_request_until_the_hosts_time(server, tmp_path):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    free = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    requests = [Request(capped.url(f"/{i}"), headers={"Cookie": "session=s3cret"}) for i in range(6)]
    requests += [Request(free.url(f"/{i}")) for i in range(6)]
    started = time.monotonic()
    crawler = await crawl(requests, settings)
    assert time.monotonic() - started < 5
    assert len(crawler.spider.seen) == 6 and all(url.startswith(free.base_url) for url, _ in crawler.spider.seen)
    assert crawler.spider.failures == []  # postponed, not failed: no errback
    assert len(server.arrivals(capped)) == 1
    records = _records(park_file)
    assert sorted(r["url"] for r in records) == sorted(capped.url(f"/{i}") for i in range(6))
    assert {r["reason"] for r in records} == {"over_cap"}
    assert all(abs(_when(r) - (time.time() + 3600)) < 30 for r in records)
    assert stat.S_IMODE(os.stat(park_file).st_mode) == 0o600
    assert crawler.stats.get_value("retry_after/parked") == 6

    # A second run before not_before: nothing of that host is fetched, every record stays.
    crawler = await crawl([], settings)
    assert len(server.arrivals(capped)) == 1
    assert crawler.spider.seen == []
    assert len(_records(park_file)) == 6

    # A run after it (simulated by moving not_before to the past) fetches them all and empties the file.
    capped.config.reject_first = 0
    past = iso(time.time() - 1)
    park_file.write_text("".join(json.dumps({**r, "not_before": past}) + "\n" for r in records))
    crawler = await crawl([], settings)
    assert sorted(url for url, _ in crawler.spider.seen) == sorted(capped.url(f"/{i}") for i in range(6))
    assert {a.headers.get("cookie") for a in server.arrivals(capped, status=200)} == {"session=s3cret"}
    assert _records(park_file) == []
    assert crawler.stats.get_value("retry_after/unparked") == 6


@pytest_twisted.ensureDeferred
async def test_a_record_due_soon_is_held_until_its_not_before(server, tmp_path):
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    spider = OtherCallbackSpider()
    request = Request(host.url("/soon"), callback=spider.parse_page, meta={"tag": "kept"}, method="PUT", body=b"\x00\xff")
    with ParkFile(park_file) as lot:
        from scrapy_retryafter.parkfile import ParkRecord, encode_value

        lot.add(ParkRecord(
            url=request.url, slot=host.address, reason="retries_exhausted", attempts=5,
            not_before=time.time() + 1.5, request=encode_value(request.to_dict(spider=spider)), spider="list",
        ))
    started = time.monotonic()
    crawler = await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)}, spider_cls=OtherCallbackSpider)
    assert crawler.spider.seen == [(host.url("/soon"), 200, "kept")]
    (arrival,) = server.arrivals(host)
    assert arrival.method == "PUT"
    assert 1.4 <= arrival.t - started < 4
    assert _records(park_file) == []


@pytest_twisted.ensureDeferred
async def test_exhausted_retries_and_a_spent_budget_are_parked_but_a_bare_post_fails(server, tmp_path):
    host = server.add_host(HostConfig(status=503, reject_first=10**6, penalty=0.0, retry_after="absent"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_MAX_RETRIES": 1,
        "RETRY_AFTER_BACKOFF_BASE": 0.05, "RETRY_AFTER_BACKOFF_MAX": 0.1, "RETRY_AFTER_WAKE_JITTER": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    }
    requests = [Request(host.url("/get")), Request(host.url("/post"), method="POST", body=b"x")]
    crawler = await crawl(requests, settings)
    records = _records(park_file)
    assert [r["url"] for r in records] == [host.url("/get")]
    assert records[0]["reason"] in {"retries_exhausted", "budget_spent"}
    assert records[0]["attempts"] == 2
    # The POST may have run: it fails to the spider as Scrapy would, unparked.
    assert len(crawler.spider.failures) == 1
    assert crawler.spider.failures[0].request.url == host.url("/post")


@pytest_twisted.ensureDeferred
async def test_a_request_that_cannot_be_serialized_is_parked_by_its_url(server, tmp_path, caplog):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = tmp_path / "parked.jsonl"

    class LambdaSpider(ListSpider):
        async def start(self):
            yield Request(host.url("/lambda"), callback=lambda response: None)

    await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)}, spider_cls=LambdaSpider)
    (record,) = _records(park_file)
    assert record["url"] == host.url("/lambda") and record["request"] is None
    assert any("as its URL only" in r.getMessage() and host.url("/lambda") in r.getMessage() for r in caplog.records)


@pytest_twisted.ensureDeferred
async def test_parking_off_gives_scrapys_usual_give_up(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    crawler = await crawl([Request(host.url("/"))], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_PARKING": False})
    assert len(crawler.spider.failures) == 1
    assert not park_file.exists()


@pytest_twisted.ensureDeferred
async def test_jobdir_keeps_the_park_file_inside_the_job(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    jobdir = tmp_path / "job"
    await crawl([Request(host.url("/"))], {**ADDON, "JOBDIR": str(jobdir)})
    (record,) = _records(jobdir / "retry_after.parked.jsonl")
    assert record["url"] == host.url("/")


@pytest.mark.parametrize(
    "mode",
    [ADDON, {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}],
    ids=["add-on", "middleware only"],
)
@pytest_twisted.ensureDeferred
async def test_stopping_during_a_cooldown_parks_what_was_held_in_either_mode(server, tmp_path, mode):
    host = server.add_host(HostConfig(reject_first=1, penalty=60.0))
    server.start()
    from scrapy.crawler import CrawlerRunner
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor, task

    from .conftest import BASE_SETTINGS

    park_file = tmp_path / "parked.jsonl"
    settings = {**BASE_SETTINGS, **mode, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    crawler = CrawlerRunner(settings).create_crawler(ListSpider)
    done = crawler.crawl(requests=[Request(host.url(f"/{i}")) for i in range(4)])
    await task.deferLater(reactor, 1.0, lambda: None)
    stopping = time.monotonic()
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    assert time.monotonic() - stopping < 3
    records = _records(park_file)
    # Held in the scheduler (add-on) or in the middleware (alone): parked either way, never failed.
    held = {r["url"] for r in records}
    assert host.url("/0") in held and {r["reason"] for r in records} == {"held_at_close"}
    assert crawler.spider.failures == []
    assert all(_when(r) > time.time() + 30 for r in records)
