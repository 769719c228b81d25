"""Real crawls against the throttling server: the log lines and stats people read."""

from __future__ import annotations

import logging
import math
import os
import tempfile
from pathlib import Path

import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

LOGGER = "scrapy_retryafter"


def info_lines(caplog, start: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(LOGGER) and r.levelno >= logging.INFO and r.getMessage().startswith(start)
    ]


@pytest_twisted.ensureDeferred
async def test_a_burst_of_429s_answering_the_requests_on_the_wire_is_one_line_with_its_count(server, caplog):
    # Everything sent in the first second is refused: the 8 requests on the wire come back 429 together.
    host = server.add_host(HostConfig(windows=[(0.0, 1.0)], latency=0.1))
    server.start()
    settings = {**ADDON, "CONCURRENT_REQUESTS": 8, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        crawler = await crawl([Request(host.url(f"/p/{i}")) for i in range(8)], settings)
    refused = len(server.arrivals(host, status=429))
    assert refused >= 2
    assert len({url for url, status in crawler.spider.seen if status == 200}) == 8
    throttled = info_lines(caplog, "Throttled ")
    assert len(throttled) == 1, throttled
    assert throttled[0].endswith(f"; {refused} response(s) in this burst"), throttled[0]
    messages = [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER) and r.levelno >= logging.INFO]
    pacing = [i for i, m in enumerate(messages) if m.startswith("Pacing ")]
    assert pacing, "the throttle cut the pace: that is logged"
    assert pacing[0] > messages.index(throttled[0]), "the Pacing line comes after the throttle line that caused it"
    # The pace climbs back after the cut, within the minute: no rise line yet.
    assert crawler.stats.get_value("retry_after/paced_slots") == 1
    assert [m for m in messages if "rising" in m] == []


@pytest_twisted.ensureDeferred
async def test_a_spent_quota_said_by_every_response_on_the_wire_is_one_line(server, caplog):
    # A fixed window of 8 requests per 2 s, announced in draft headers: the 8 on the wire all say "0 left".
    host = server.add_host(HostConfig(rate=4, window=2.0, ratelimit="draft", latency=0.1))
    server.start()
    settings = {**ADDON, "CONCURRENT_REQUESTS": 8, "CONCURRENT_REQUESTS_PER_DOMAIN": 8, "RETRY_AFTER_ADAPTIVE": False}
    with caplog.at_level(logging.INFO, logger=LOGGER):
        crawler = await crawl([Request(host.url(f"/q/{i}")) for i in range(12)], settings)
    assert len({url for url, status in crawler.spider.seen if status == 200}) == 12
    quota = info_lines(caplog, "Quota of ")
    cooldowns = crawler.stats.get_value("retry_after/ratelimit_cooldowns") or 0
    assert quota, "the spent quota is logged"
    assert cooldowns > len(quota), (cooldowns, quota)
    assert sum(int(line.rsplit("; ", 1)[1].split()[0]) for line in quota) == cooldowns


def no_float_noise(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value) and value == round(value, 3) and len(repr(value).split(".")[1]) <= 3
    return True


@pytest_twisted.ensureDeferred
async def test_no_retry_after_stat_carries_float_noise(server):
    limited = server.add_host(HostConfig(rate=10, burst=2, penalty=0.25))
    failing = server.add_host(HostConfig(fail_first=2, failure="502"))
    server.start()
    settings = {
        **ADDON,
        "CONCURRENT_REQUESTS": 16,
        "RETRY_AFTER_ALL_RETRIES": True,
        "RETRY_AFTER_BACKOFF_BASE": 0.05,
        "RETRY_AFTER_BACKOFF_MAX": 0.2,
    }
    requests = [Request(limited.url(f"/l/{i}")) for i in range(40)]
    requests += [Request(failing.url(f"/f/{i}")) for i in range(10)]
    crawler = await crawl(requests, settings)
    stats = crawler.stats.get_stats()
    ours = {key: value for key, value in stats.items() if key.startswith("retry_after/")}
    assert stats.get("retry_after/cooldown_seconds", 0) > 0
    assert stats.get("retry_after/backoff_seconds", 0) > 0
    assert stats.get("retry_after/throttled", 0) >= 4
    noisy = {key: value for key, value in ours.items() if not no_float_noise(value)}
    assert noisy == {}


@pytest_twisted.ensureDeferred
async def test_nothing_is_left_on_disk_when_nothing_was_parked(server):
    hosts = {memory: server.add_host(HostConfig(reject_first=2, penalty=0.2)) for memory in (False, True)}
    server.start()
    for memory, host in hosts.items():
        folder = Path(tempfile.mkdtemp(prefix="park-none-"))
        settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(folder / "sub" / "parked.jsonl"), "RETRY_AFTER_HOST_STATE": memory}
        crawler = await crawl([Request(host.url(f"/n/{memory}/{i}")) for i in range(4)], settings)
        assert crawler.stats.get_value("retry_after/throttled") >= 2
        assert crawler.stats.get_value("retry_after/parked") is None
        left = {os.path.relpath(os.path.join(root, name), folder) for root, dirs, files in os.walk(folder) for name in dirs + files}
        # No park file, no park lock; the per-host memory keeps the pace this crawl learned.
        assert left <= ({"sub", "sub/retry_after.hosts.json", "sub/retry_after.hosts.json.lock"} if memory else set()), left


@pytest_twisted.ensureDeferred
async def test_a_slot_name_with_a_newline_cannot_forge_a_log_line(server, caplog):
    host = server.add_host(HostConfig(reject_first=2, penalty=0.2))
    server.start()
    slot = "evil\n2026-01-01 00:00:00 [scrapy.core.engine] INFO: Spider closed (finished)\x1b[2J"
    requests = [Request(host.url(f"/e/{i}"), meta={"download_slot": slot}) for i in range(3)]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        crawler = await crawl(requests, {**ADDON, "RETRY_AFTER_LOGSTATS_INTERVAL": 0.2})
    assert crawler.stats.get_value("retry_after/throttled") >= 2
    ours = [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER)]
    assert any(m.startswith("Throttled evil\\n2026") for m in ours), ours
    table = [m for m in ours if m.startswith("Rate-limited slots")]
    assert table and all(len(m.splitlines()) == 1 + 1 + 1 for m in table)  # title, header, one row
    assert all("\n" not in m and "\x1b" not in m for m in ours if m not in table)
