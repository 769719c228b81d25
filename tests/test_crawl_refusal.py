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


@pytest.mark.parametrize("per_domain", [1, 8])
@pytest_twisted.ensureDeferred
async def test_a_refused_slot_is_parked_in_one_sweep_and_the_next_run_sends_it_nothing(server, tmp_path, caplog, per_domain):
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="scrapy_retryafter.refusals")  # the quiet later sweeps: their times
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    free = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": per_domain,
        "RETRY_AFTER_LOGSTATS_INTERVAL": 0.05,
    }
    requests = [Request(capped.url(f"/{i}")) for i in range(QUEUED)] + [Request(free.url(f"/{i}")) for i in range(5)]
    crawler = await crawl(requests, settings)
    sent = server.arrivals(capped)
    assert len(sent) <= per_domain  # only those in flight when the first answer came
    throttle = sent[0]
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
    assert len(server.arrivals(capped)) == len(sent)
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


# -- the state file attacked ---------------------------------------------------------------------


def _state(path: Path, hosts: dict) -> None:
    path.write_text(json.dumps({"version": 1, "hosts": hosts}))


@pytest_twisted.ensureDeferred
async def test_a_refusal_a_year_long_in_the_file_is_a_week_at_most(server, tmp_path):
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    now = time.time()
    _state(tmp_path / HOST_STATE_NAME, {host.address.split(":")[0]: {
        "refusal": {"until": now + 365 * 86400, "reason": "\x1b[31mevil\nline", "at": now - 10}}})
    crawler = await crawl([Request(host.url("/a"))], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    assert server.arrivals(host) == []
    (record,) = _records(park_file)
    assert record["reason"] == "over_cap"  # a reason from the file is never logged or parked as written
    from scrapy_retryafter.parkrecord import parse_iso

    assert parse_iso(record["not_before"]) <= now + 7 * 86400 + 60
    assert crawler.stats.get_value("retry_after/refusals_loaded") == 1


@pytest.mark.parametrize("kind", ["symlink", "world-writable", "garbage", "huge"])
@pytest_twisted.ensureDeferred
async def test_an_unusable_state_file_costs_one_line_and_the_crawl_runs(server, tmp_path, caplog, kind):
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    state = tmp_path / HOST_STATE_NAME
    victim = tmp_path / "victim"
    refused = {host.address.split(":")[0]: {"refusal": {"until": time.time() + 3600, "reason": "over_cap", "at": time.time()}}}
    if kind == "symlink":
        _state(victim, refused)
        state.symlink_to(victim)
    elif kind == "world-writable":
        _state(state, refused)
        state.chmod(0o666)
    elif kind == "garbage":
        state.write_bytes(b"\x00{not json" * 1000)
    else:
        state.write_bytes(b"[" * (30 << 20))
    before = victim.read_bytes() if victim.exists() else None
    started = time.monotonic()
    crawler = await crawl([Request(host.url("/a"))], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    assert time.monotonic() - started < 10
    assert [url for url, _ in crawler.spider.seen] == [host.url("/a")]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "state file" in r.getMessage()]
    assert len(lines) <= 1, lines
    if kind in ("symlink", "world-writable"):
        assert len(lines) == 1
    if before is not None:
        assert victim.read_bytes() == before


@pytest_twisted.ensureDeferred
async def test_two_crawls_refused_at_once_both_refusals_are_kept(server, tmp_path):
    from twisted.internet.defer import DeferredList, ensureDeferred

    one = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    two = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="7200"))
    server.start()
    settings = {**ADDON, "RETRY_AFTER_HOST_STATE_FILE": str(tmp_path / "hosts.json")}
    await DeferredList([
        ensureDeferred(crawl([Request(one.url(f"/{i}")) for i in range(20)], settings)),
        ensureDeferred(crawl([Request(two.url(f"/{i}")) for i in range(20)], settings)),
    ])
    hosts = json.loads((tmp_path / "hosts.json").read_text())["hosts"]
    assert {one.address.split(":")[0], two.address.split(":")[0]} <= set(hosts)
