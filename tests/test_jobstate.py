"""Pause and resume: the board's memory outlives a stopped crawl (JOBDIR)."""

from __future__ import annotations

import collections
import time

import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request
from scrapy.utils.defer import deferred_from_coro

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.breaker import HALF_OPEN, OPEN
from scrapy_retryafter.jobstate import STATE_FILE, load_board, save_board
from scrapy_retryafter.testing.clock import FakeClock
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, BASE_SETTINGS, ListSpider, crawl


def _paused_board() -> CooldownBoard:
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    board.cool("cooling", 100.0)
    board.refuse("refusing", 3600.0)
    for _ in range(3):
        board.breaker_throttled("open", sent_at=clock.now, threshold=3, open_seconds=600.0)
    board.announce("paced", 7.5)
    board.spend_blind_retry("budget", 10.0)
    return board


def test_a_snapshot_restores_cooldown_refusal_breaker_pace_and_budget_minus_the_pause(tmp_path):
    save_board(_paused_board(), tmp_path, wall=5000.0)
    clock = FakeClock(50.0)  # a new process: its own monotonic clock
    resumed = CooldownBoard(clock=clock)
    assert load_board(resumed, tmp_path, wall=5040.0) == 5  # paused for 40 s
    assert resumed.remaining("cooling") == 60.0
    assert resumed.refused("refusing") == 3560.0
    assert resumed.breaker_state("open") == OPEN
    assert resumed.ready_at("open") == 50.0 + 560.0
    assert resumed.rate("paced") == 7.5
    assert resumed.spend_blind_retry("budget", 10.0) is True  # 9 tokens left, 8 after this one
    clock.now += 560.0
    assert resumed.ready_at("open") == 0.0  # then one probe, as before the pause
    assert resumed.breaker_state("open") == HALF_OPEN


def test_what_ended_during_the_pause_is_not_restored(tmp_path):
    save_board(_paused_board(), tmp_path, wall=0.0)
    resumed = CooldownBoard(clock=FakeClock())
    load_board(resumed, tmp_path, wall=4000.0)
    assert resumed.remaining("cooling") == 0.0
    assert resumed.refused("refusing") == 0.0
    assert resumed.ready_at("open") == 0.0
    assert resumed.breaker_state("open") == HALF_OPEN


@given(st.text(max_size=40) | st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
def test_an_unreadable_state_file_restores_nothing_and_never_raises(tmp_path_factory, text):
    jobdir = tmp_path_factory.mktemp("job")
    (jobdir / STATE_FILE).write_text(text)
    board = CooldownBoard(clock=FakeClock())
    assert load_board(board, jobdir) in (-1, 0, *range(1, 100))


def test_no_state_file_restores_nothing(tmp_path):
    assert load_board(CooldownBoard(clock=FakeClock()), tmp_path) == 0


@pytest_twisted.ensureDeferred
async def test_a_crawl_stopped_during_a_cooldown_resumes_without_touching_the_cooling_host(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=1, penalty=3.0))
    free = server.add_host(HostConfig(latency=0.2))
    server.start()
    from scrapy.crawler import CrawlerRunner

    jobdir = str(tmp_path / "job")
    settings = {
        **BASE_SETTINGS, **ADDON, "JOBDIR": jobdir, "RETRY_AFTER_PAD": 1.0, "RETRY_AFTER_WAKE_JITTER": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }
    requests = [Request(host.url(f"/{i}")) for i in range(6)] + [Request(free.url(f"/{i}")) for i in range(20)]
    crawler = CrawlerRunner(settings).create_crawler(ListSpider)
    done = crawler.crawl(requests=requests)
    from twisted.internet import reactor, task

    await task.deferLater(reactor, 1.0, lambda: None)
    throttled_at = server.arrivals(host, status=429)[0].t
    stopping = time.monotonic()
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    assert time.monotonic() - stopping < 3
    resumed_at = time.monotonic()
    assert resumed_at < throttled_at + 3.0  # still cooling when the job resumes

    resumed = await crawl([], {**ADDON, "JOBDIR": jobdir, "RETRY_AFTER_PAD": 1.0, "RETRY_AFTER_WAKE_JITTER": 0})
    later = [a for a in server.arrivals(host) if a.t >= resumed_at]
    assert later and min(a.t for a in later) >= throttled_at + 3.0 - 0.05
    # Every page exactly once over both runs.
    fetched = collections.Counter((a.host, a.path) for a in server.log if a.status == 200)
    expected = {(host.address, f"/{i}") for i in range(6)} | {(free.address, f"/{i}") for i in range(20)}
    assert set(fetched) == expected and set(fetched.values()) == {1}
    assert resumed.stats.get_value("retry_after/parked") is None  # JOBDIR kept the held ones


def test_a_symlink_at_the_old_temporary_name_is_never_followed_and_a_failed_save_leaves_nothing(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / f".{STATE_FILE}.tmp").symlink_to(victim)
    save_board(_paused_board(), tmp_path, wall=0.0)
    assert victim.read_text() == "precious"
    assert load_board(CooldownBoard(clock=FakeClock(100.0)), tmp_path, wall=0.0) == 5
    before = sorted(p.name for p in tmp_path.iterdir())

    import os as os_module

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os_module, "fsync", no_space)
    import pytest

    with pytest.raises(OSError):
        save_board(_paused_board(), tmp_path, wall=0.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary file left behind


def test_a_symlinked_or_oversized_state_file_restores_nothing(tmp_path, monkeypatch):
    from scrapy_retryafter import jobstate

    save_board(_paused_board(), tmp_path / "real", wall=0.0)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / STATE_FILE).symlink_to(tmp_path / "real" / STATE_FILE)
    assert load_board(CooldownBoard(clock=FakeClock(100.0)), tmp_path / "job") == -1
    monkeypatch.setattr(jobstate, "MAX_STATE_BYTES", 10)
    assert load_board(CooldownBoard(clock=FakeClock(100.0)), tmp_path / "real") == -1
