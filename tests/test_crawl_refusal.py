"""Real crawls of a slot refused over the cap (issue 16 item 3).

A Retry-After over RETRY_AFTER_MAX_DELAY refuses the slot until then: its
queued requests are parked in one sweep (not released at its pace to be
parked one by one), the refusal is kept in the per-host state file, and the
next run sends nothing to the host and adds no second record per request.
A host paused longer than max_delay is refused the same way (host_down).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.refusals import HOST_STATE_NAME
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}
QUEUED = 500


def _records(path: Path) -> list[dict]:
    from scrapy_retryafter.parkfile import read_log

    fold = read_log(path)
    return [json.loads(entry.line) for entry in fold.records.values()]


def _slot_lines(caplog, address: str) -> list[str]:
    """INFO and above about the slot, but the live view's periodic lines and the closing table."""
    return [
        message for r in caplog.records
        if r.levelno >= logging.INFO and address in (message := r.getMessage())
        and not message.startswith(("Held back", "Rate-limited slots"))
    ]


@pytest_twisted.ensureDeferred
async def test_a_refused_slot_is_parked_in_one_sweep_and_the_next_run_sends_it_nothing(server, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="scrapy_retryafter.refusals")  # the quiet later sweeps: their times
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    free = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "RETRY_AFTER_LOGSTATS_INTERVAL": 0.05,
    }
    requests = [Request(capped.url(f"/{i}")) for i in range(QUEUED)] + [Request(free.url(f"/{i}")) for i in range(5)]
    crawler = await crawl(requests, settings)
    (throttle,) = server.arrivals(capped)
    throttled_at = time.time() - (time.monotonic() - throttle.t)
    parked_at = max(r.created for r in caplog.records if r.getMessage().startswith(f"Refused {capped.address}"))
    records = _records(park_file)
    print(f"{QUEUED} queued: parked {len(records)} in {parked_at - throttled_at:.2f}s after the throttle")
    assert len(records) == QUEUED
    assert {r["reason"] for r in records} == {"over_cap"}
    assert parked_at - throttled_at < 5
    lines = _slot_lines(caplog, capped.address)
    assert len(lines) <= 3, lines
    assert sum("in one batch" in line for line in lines) == 1, lines
    messages = [r.getMessage() for r in caplog.records]
    live = [m for m in messages if m.startswith(f"Held back {capped.address}")]
    assert live and all("refused until" in m for m in live), live
    table = next(m for m in messages if m.startswith("Rate-limited slots"))
    assert "refused until" in table
    assert not any("Pacing" in m or "paced" in m or "pace allows" in m for m in messages if capped.address in m)
    state = json.loads((tmp_path / HOST_STATE_NAME).read_text())
    assert capped.address.split(":")[0] in json.dumps(state)

    # The next run, before the refusal ends: nothing to that host, one record per request still.
    caplog.clear()
    crawler = await crawl(requests, settings)
    assert len(server.arrivals(capped)) == 1
    assert len(crawler.spider.seen) == 5
    assert len(_records(park_file)) == QUEUED
    assert crawler.stats.get_value("retry_after/refusals_loaded") == 1
    assert len(_slot_lines(caplog, capped.address)) <= 3


@pytest_twisted.ensureDeferred
async def test_middleware_alone_parks_the_refused_slots_requests_as_they_arrive(server, tmp_path):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**MIDDLEWARE_ONLY, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    started = time.monotonic()
    await crawl([Request(capped.url(f"/{i}")) for i in range(40)], settings)
    assert time.monotonic() - started < 10
    assert len(server.arrivals(capped)) == 1
    assert len(_records(park_file)) == 40
    await crawl([Request(capped.url(f"/{i}")) for i in range(40)], settings)
    assert len(server.arrivals(capped)) == 1
    assert len(_records(park_file)) == 40


@pytest_twisted.ensureDeferred
async def test_the_state_file_can_be_turned_off(server, tmp_path):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_HOST_STATE": False}
    await crawl([Request(capped.url("/a"))], settings)
    assert not (tmp_path / HOST_STATE_NAME).exists()
    await crawl([Request(capped.url("/b"))], settings)
    assert len(server.arrivals(capped)) == 2


@pytest.mark.parametrize(
    ("mode", "status"), [(ADDON, 502), (MIDDLEWARE_ONLY, 503)], ids=["add-on 502", "middleware only 503"]
)
@pytest_twisted.ensureDeferred
async def test_a_host_down_longer_than_max_delay_is_refused_and_the_crawl_finishes(server, tmp_path, mode, status):
    # The middleware alone owns no 502 (Scrapy's RetryMiddleware does): its outage is a blind 503.
    host = server.add_host(HostConfig(status=status, outage=(0.0, 3600.0), retry_after="absent"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **mode, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_MAX_DELAY": 3.0,
        "RETRY_AFTER_BACKOFF_BASE": 0.2, "RETRY_AFTER_BACKOFF_MAX": 1.0,
    }
    started = time.monotonic()
    crawler = await crawl([Request(host.url(f"/{i}")) for i in range(30)], settings)
    took = time.monotonic() - started
    records = _records(park_file)
    print(f"host down: finished in {took:.1f}s, {len(server.arrivals(host))} requests, {len(records)} parked")
    assert took < 15
    assert crawler.stats.get_value("retry_after/host_down_refused") == 1
    assert {r["reason"] for r in records} >= {"host_down"}
    assert len(records) + len([s for _, s in crawler.spider.seen]) + len(crawler.spider.failures) >= 30
