"""A second crawl of a host starts at the pace the first one learned (the per-host state file), real crawls.

Both runs crawl the project's strict limiter (no burst, Retry-After: 1, a
penalty) at 20 r/s without being told it. The first pays for learning the
limit (its first burst and slow start's overshoot, each a cooldown); the
second reads the pace from the file and starts paced, so it is refused less
and finishes sooner. Bounds are loose for a loaded machine; the bench
(``python -m bench.limiters --memory``) gives the figures.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer

from .conftest import ADDON, crawl

SETTINGS = {**ADDON, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}
PAGES = 120


async def crawl_once(park_file: Path, settings: dict[str, object] | None = None) -> tuple[int, float, object, str]:
    server = ThrottlingServer()
    host = server.add_host(HostConfig(rate=20.0, burst=1.0, penalty=1.0))
    server.start()
    try:
        started = time.monotonic()
        crawler = await crawl([Request(host.url(f"/{i}")) for i in range(PAGES)],
                              {**SETTINGS, "RETRY_AFTER_PARK_FILE": str(park_file), **(settings or {})})
        elapsed = time.monotonic() - started
        assert len({url for url, status in crawler.spider.seen if status == 200}) == PAGES
        return len(server.arrivals(host, status=429)), elapsed, crawler, host.address
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_the_second_crawl_starts_at_the_learned_pace_with_fewer_429s_and_sooner():
    park_file = Path(tempfile.mkdtemp(prefix="hostpaces-")) / "parked.jsonl"
    state = park_file.with_name("retry_after.hosts.json")
    first_429s, first_time, first, address = await crawl_once(park_file)
    assert first_429s >= 2, first_429s  # the first burst and slow start's overshoot
    saved = json.loads(state.read_text())["hosts"][address]["pace"]["rate"]
    assert 10.0 <= saved <= 21.0, saved
    assert first.stats.get_value("retry_after/paces_saved") == 1

    second_429s, second_time, second, again = await crawl_once(park_file)
    assert again == address  # the same host, so the same slot
    assert second.stats.get_value("retry_after/paces_loaded") == 1
    assert second_429s < first_429s, (first_429s, second_429s)
    assert second_time < first_time, (first_time, second_time)
    print(f"first run {first_429s} x 429 in {first_time:.2f} s; second {second_429s} x 429 in {second_time:.2f} s")
    assert second_time <= 2.0 * PAGES / 20.0 + 1.0, second_time  # loose: a loaded machine


@pytest_twisted.ensureDeferred
async def test_with_the_host_state_off_nothing_is_remembered():
    park_file = Path(tempfile.mkdtemp(prefix="hostpaces-")) / "parked.jsonl"
    _, _, first, _ = await crawl_once(park_file, {"RETRY_AFTER_HOST_STATE": False})
    assert not park_file.with_name("retry_after.hosts.json").exists()
    assert first.stats.get_value("retry_after/paces_saved") is None
