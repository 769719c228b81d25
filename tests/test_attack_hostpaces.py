"""Attacks on the pace memory (retry_after.hosts.json): what a run saves, and what it costs a changed host.

"A remembered pace lives RETRY_AFTER_MEMORY_AGE" (docs/settings.rst): a pace a
run only started at, never throttled, is not learned again, so the file's
record keeps the time it was learned and ages out.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request

from scrapy_retryafter.rate import FLOOR, RateController
from scrapy_retryafter.ratememory import learned_pace, remember_pace
from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer

from .conftest import ADDON, crawl

SETTINGS = {**ADDON, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}
PAGES = 120


@given(st.floats(1.0, 1e4), st.integers(0, 500), st.floats(0.001, 0.5))
def test_a_remembered_pace_never_throttled_is_not_learned_again(rate: float, successes: int, gap: float) -> None:
    pace = RateController()
    now = 100.0  # a monotonic clock is never 0 in a crawl (0 is learned()'s "never cut")
    remember_pace(pace, rate, now)
    for _ in range(successes):
        now += gap
        pace.succeeded(pace.rate, now)
    assert learned_pace(pace) is None, (learned_pace(pace), rate)


def test_a_remembered_pace_throttled_again_is_learned() -> None:
    pace = RateController()
    remember_pace(pace, 20.0, 100.0)
    pace.throttled(19.0, 105.0)
    assert learned_pace(pace) is not None


async def crawl_once(park_file: Path, config: HostConfig) -> tuple[int, float, Any]:
    server = ThrottlingServer()
    host = server.add_host(config)
    server.start()
    try:
        started = time.monotonic()
        crawler = await crawl([Request(host.url(f"/{i}")) for i in range(PAGES)],
                              {**SETTINGS, "RETRY_AFTER_PARK_FILE": str(park_file)})
        elapsed = time.monotonic() - started
        assert len({url for url, status in crawler.spider.seen if status == 200}) == PAGES
        return len(server.arrivals(host, status=429)), elapsed, crawler
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_a_run_that_was_never_throttled_does_not_renew_the_remembered_pace() -> None:
    park_file = Path(tempfile.mkdtemp(prefix="hostpaces-")) / "parked.jsonl"
    state = park_file.with_name("retry_after.hosts.json")
    await crawl_once(park_file, HostConfig(rate=20.0, burst=1.0, penalty=1.0))
    (first,) = json.loads(state.read_text())["hosts"].values()
    time.sleep(1.1)  # the next save's stamp differs
    throttles, elapsed, second = await crawl_once(park_file, HostConfig())  # the limit is gone
    assert second.stats.get_value("retry_after/paces_loaded") == 1
    assert throttles == 0
    print(f"second run, limit gone: {elapsed:.2f} s for {PAGES} pages from a remembered {first['pace']['rate']:.1f} r/s")
    (again,) = json.loads(state.read_text())["hosts"].values()
    assert second.stats.get_value("retry_after/paces_saved") is None, (first, again)
    assert again["pace"]["at"] == first["pace"]["at"], (first, again)


@pytest.mark.parametrize(
    "pace, seeded",
    [
        ('{"rate": NaN, "at": 1}', None),
        ('{"rate": Infinity, "at": 1}', None),
        ('{"rate": -Infinity, "at": 1}', None),
        ('{"rate": 1e400, "at": 1}', None),
        ('{"rate": 1e308, "at": 1}', None),  # bounded to 1e6, then over MAX_REMEMBERED: not seeded
        ('{"rate": -5, "at": 1}', None),
        ('{"rate": 0, "at": 1}', None),
        ('{"rate": true, "at": 1}', None),
        ('{"rate": "5", "at": 1}', None),
        ('{"rate": [5], "at": 1}', None),
        ('{"rate": 5}', None),
        ('{"rate": 5, "at": NaN}', None),
        ('{"rate": 5, "at": 1e308}', None),  # learned in the future
        ('[5, 1]', None),
        ('{"rate": 1e-300, "at": 1}', FLOOR),  # bounded to 1e-6, seeded at the controller's floor
        ('{"rate": 5, "at": 1, "burst": 3, "shape": {"x": 1}}', 5.0),  # a newer release's extra fields
        ('{"rate": 9999, "at": 1}', 9999.0),
    ],
)
def test_a_hostile_pace_is_set_aside_or_bounded_and_seeds_a_finite_pace(tmp_path: Path, pace: str, seeded: Any) -> None:
    from scrapy_retryafter.board import CooldownBoard
    from scrapy_retryafter.hostpaces import seeded_paces
    from scrapy_retryafter.hoststate import HostMemory
    from scrapy_retryafter.testing.clock import FakeClock

    path = tmp_path / "retry_after.hosts.json"
    ok = '"ok": {"updated": 1, "pace": {"rate": 3, "at": 1}}'
    path.write_text('{"version": 1, "hosts": {"h": {"updated": 1, "pace": ' + pace + "}, " + ok + "}}")
    memory = HostMemory(path, clock=lambda: 3600.0, max_age=1e9)
    board = CooldownBoard(clock=FakeClock())
    seeded_paces(board, memory.load())
    assert "ok" in board and board.rate("ok") is not None  # one bad record never takes the others down
    rate = board.rate("h")
    if seeded is None:
        assert rate is None, rate
    else:
        assert rate is not None and rate == pytest.approx(max(FLOOR, seeded * 0.95), rel=0.01)


def test_a_pace_for_100_000_hosts_keeps_the_newest_10_000(tmp_path: Path) -> None:
    from scrapy_retryafter.hoststate import MAX_HOSTS, HostMemory

    path = tmp_path / "retry_after.hosts.json"
    hosts = {f"h{i}.example": {"updated": float(i), "pace": {"rate": 5, "at": float(i)}} for i in range(100_000)}
    path.write_text(json.dumps({"version": 1, "hosts": hosts}))
    loaded = HostMemory(path, clock=lambda: 200_000.0, max_age=1e9).load()
    assert len(loaded) == MAX_HOSTS and "h99999.example" in loaded and "h0.example" not in loaded
