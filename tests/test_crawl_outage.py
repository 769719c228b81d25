"""Real crawls through a host outage and a closing crawl (issue 16 items 1, 2 and 6).

A host that fails every request the same way is down: the crawl pauses it and
probes it, one request per interval, instead of spending every request's own
retries on the same event; and whatever is held when the crawl closes leaves
at once, parked or to its errback.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, ListSpider, crawl

MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}


def rate_over(arrivals, start, end):
    """Requests per second the host saw between ``start`` and ``end`` (server clock)."""
    inside = [a for a in arrivals if start <= a.t < end]
    return len(inside) / (end - start), len(inside)


def outage_rate(server, host, length):
    start = server.started
    return rate_over(server.arrivals(host), start, start + length)


@pytest_twisted.ensureDeferred
async def test_a_6s_gateway_outage_fetches_every_page_at_a_probe_pace(server):
    host = server.add_host(HostConfig(status=502, outage=(0.0, 6.0)))
    server.start()
    # Scrapy's defaults otherwise (RETRY_TIMES 2, 8 requests per host at once).
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(50)], ADDON)
    ok = {url for url, status in crawler.spider.seen if status == 200}
    rate, count = outage_rate(server, host, 6.0)
    print(f"6s 502 outage: {len(ok)}/50 fetched, {count} requests in the outage, {rate:.2f}/s")
    assert len(ok) == 50
    # What was in the downloader before the pause, then probes; stock Scrapy sends ~150. Here the
    # first 8 (7-9 in all); but the engine hands the downloader up to CONCURRENT_REQUESTS (16) before
    # any answer, all of them sent (16 were seen once in CI, the machine loaded), then two probes at most.
    assert count <= 16 + 2, (rate, count)
    assert crawler.stats.get_value("retry_after/host_paused", 0) >= 1


@pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["add-on", "middleware only"])
@pytest_twisted.ensureDeferred
async def test_a_blind_503_outage_finishes_in_the_same_run(server, tmp_path, mode):
    # The 15 s case is bench/outage.py; the same mechanism over 6 s keeps the suite short.
    length = 6.0
    host = server.add_host(HostConfig(status=503, outage=(0.0, length), retry_after="absent"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    pages = 60
    crawler = await crawl(
        [Request(host.url(f"/{i}")) for i in range(pages)], {**mode, "RETRY_AFTER_PARK_FILE": str(park_file)}
    )
    ok = {url for url, status in crawler.spider.seen if status == 200}
    rate, count = outage_rate(server, host, length)
    print(f"{length:g}s 503 outage: {len(ok)}/{pages} fetched, {count} requests in the outage, {rate:.2f}/s")
    assert not park_file.exists() or park_file.read_text() == ""
    assert len(ok) == pages
    assert rate <= 1.5, (rate, count)


@pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["add-on", "middleware only"])
@pytest_twisted.ensureDeferred
async def test_closespider_timeout_closes_a_crawl_held_by_a_40s_retry_after(server, tmp_path, mode):
    host = server.add_host(HostConfig(reject_first=1, penalty=40.0))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**mode, "CLOSESPIDER_TIMEOUT": 5, "RETRY_AFTER_PARK_FILE": str(park_file)}
    started = time.monotonic()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(20)], settings)
    took = time.monotonic() - started
    records = [json.loads(line) for line in park_file.read_text().splitlines()] if park_file.exists() else []
    parked = {r["url"] for r in records if r.get("url")}
    seen = {url for url, _ in crawler.spider.seen}
    failed = {f.request.url for f in crawler.spider.failures}
    print(f"closed after {took:.2f}s: {len(seen)} seen, {len(parked)} parked, {len(failed)} errbacked")
    assert took <= 7.0, took
    assert crawler.stats.get_value("finish_reason") == "closespider_timeout"
    # Nothing lost: every page the crawl sent reached the spider, the park file or the errback.
    sent = {host.url(a.path) for a in server.arrivals(host)}
    assert sent <= seen | parked | failed
    # The add-on's queue parks what it holds; so does the middleware's waiting room.
    assert seen | parked | failed == {host.url(f"/{i}") for i in range(20)}


@pytest.mark.parametrize(
    ("mode", "status"), [(ADDON, 502), (ADDON, 503), (MIDDLEWARE_ONLY, 503)], ids=["add-on 502", "add-on 503", "middleware only 503"]
)
@pytest_twisted.ensureDeferred
async def test_a_crawl_closed_during_an_outage_loses_nothing(server, tmp_path, mode, status):
    host = server.add_host(HostConfig(status=status, outage=(0.0, 60.0), retry_after="absent"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**mode, "CLOSESPIDER_TIMEOUT": 3, "RETRY_AFTER_PARK_FILE": str(park_file)}
    started = time.monotonic()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(30)], settings)
    took = time.monotonic() - started
    records = [json.loads(line) for line in park_file.read_text().splitlines()] if park_file.exists() else []
    parked = {r["url"] for r in records}
    failed = {f.request.url for f in crawler.spider.failures}
    sent = {host.url(a.path) for a in server.arrivals(host)}
    print(f"closed during a {status} outage after {took:.2f}s: {len(parked)} parked, {len(failed)} errbacked")
    assert took <= 5.0, took
    if mode is ADDON:
        assert sent <= parked | failed
        assert parked | failed == {host.url(f"/{i}") for i in range(30)}
        assert {r["reason"] for r in records} <= {"held_at_close"}
    else:
        # The requests held in the downloader are parked; retries sent back to Scrapy's own
        # scheduler queue are dropped with it at close, as stock Scrapy drops its queue (open).
        assert len(parked) >= 8


@pytest_twisted.ensureDeferred
async def test_a_request_held_by_a_paused_host_past_its_deadline_is_parked_not_sent(server, tmp_path):
    host = server.add_host(HostConfig(status=502, outage=(0.0, 6.0)))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    requests = [Request(host.url(f"/{i}"), meta={"retry_after_deadline": 2.0}) for i in range(20)]
    crawler = await crawl(requests, {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    records = [json.loads(line) for line in park_file.read_text().splitlines()] if park_file.exists() else []
    parked = {r["url"] for r in records}
    ok = {url for url, status in crawler.spider.seen if status == 200}
    first = {}
    for a in server.arrivals(host):
        first.setdefault(a.path, a.t)
        assert a.t - first[a.path] <= 2.0 + 0.5, (a.path, a.t - first[a.path])  # no retry past the deadline
    assert parked | ok | {f.request.url for f in crawler.spider.failures} == {r.url for r in requests}
    assert {r["reason"] for r in records} <= {"deadline"}
    # The probe released then parked past its deadline never left: it held the host until the 60 s probe timeout.
    took = crawler.stats.get_value("elapsed_time_seconds")
    print(f"held past the deadline: {len(ok)} ok, {len(parked)} parked in {took:.1f}s")
    assert took < 20.0, took


class DirectSpider(ListSpider):
    """Sends its requests with engine.download_async: they bypass the scheduler and the add-on's queue."""

    name = "direct"

    async def start(self):  # type: ignore[override]
        async def one(request: Request) -> None:
            try:
                response = await self.crawler.engine.download_async(request)
                self.seen.append((response.url, response.status))
            except Exception as error:
                self.failures.append(error)

        await asyncio.gather(*[one(request) for request in self.to_send])
        return
        yield


@pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["add-on", "middleware only"])
@pytest_twisted.ensureDeferred
async def test_requests_that_bypass_the_scheduler_see_a_down_host_at_about_one_per_probe_interval(server, mode):
    """engine.download_async sends to a paused host whenever its cooldown ends; each such failure once was
    taken for the burst that started the pause, and every free retry went straight out: 2311 requests in
    8 s. Backoff base 0.2 s: probe intervals 0.1-0.2 s, doubling to the 60 s cap."""
    length = 8.0
    host = server.add_host(HostConfig(status=502, outage=(0.0, length)))
    server.start()
    requests = [Request(host.url(f"/{i}")) for i in range(8)]
    crawler = await crawl(requests, {**mode, "RETRY_AFTER_BACKOFF_BASE": 0.2, "CLOSESPIDER_TIMEOUT": 15}, DirectSpider)
    rate, count = outage_rate(server, host, length)
    print(f"engine.download through an {length:g}s 502 outage: {count} requests in it ({rate:.2f}/s)")
    assert count <= 32, count  # the 8 sent at once, then about one per interval
    assert len(crawler.spider.seen) + len(crawler.spider.failures) == 8
