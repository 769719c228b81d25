"""Host pauses against URLs that always fail: real crawls against the project's server."""

from __future__ import annotations

import json
import time

import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}


def break_paths(host, broken, status="502"):
    """Paths in ``broken`` fail every attempt with ``status``; the others as the config says."""
    plain = host.failure_for

    def failure_for(path):
        return status if path in broken else plain(path)

    host.failure_for = failure_for


def records(park_file):
    return [json.loads(line) for line in park_file.read_text().splitlines()] if park_file.exists() else []


def summary(server, host, crawler, park_file, took, label):
    ok = {url for url, status in crawler.spider.seen if status == 200}
    failed = {f.request.url for f in crawler.spider.failures}
    parked = {r["url"] for r in records(park_file)}
    print(f"\n{label}: {len(ok)} ok, {len(failed)} errbacked, {len(parked)} parked in {took:.1f}s, "
          f"{len(server.arrivals(host))} requests, finish {crawler.stats.get_value('finish_reason')}")
    print(" ".join(f"{a.t - server.started:.2f}{a.path}:{a.status}" for a in server.arrivals(host)))
    return ok, failed, parked


@pytest_twisted.ensureDeferred
async def test_permanently_broken_urls_at_a_crawls_tail_are_lost_nowhere_and_end_within_max_delay(server, tmp_path):
    """Five URLs that always answer 502, with nothing else left for their host, look like an outage:
    the host is paused and they are held (open: stock Scrapy errbacks each after 3 attempts, in
    seconds). A probe failing on its last attempt is held once, then given up; a pause outlasting
    max_delay parks the rest as host_down. Nothing is lost either way, and the crawl ends."""
    host = server.add_host(HostConfig())
    broken = {f"/b{i}" for i in range(5)}
    break_paths(host, broken)
    server.start()
    park_file = tmp_path / "parked.jsonl"
    urls = [host.url(f"/{i}") for i in range(25)] + [host.url(p) for p in sorted(broken)]
    started = time.monotonic()
    settings = {**ADDON, "CLOSESPIDER_TIMEOUT": 60, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_MAX_DELAY": 15}
    crawler = await crawl([Request(u) for u in urls], settings)
    took = time.monotonic() - started
    ok, failed, parked = summary(server, host, crawler, park_file, took, "broken tail")
    assert len(ok) == 25
    assert failed | parked == {host.url(p) for p in broken}, (failed, parked)
    assert {r["reason"] for r in records(park_file)} <= {"host_down"}
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert took < 15 + 10, took
