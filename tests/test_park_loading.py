"""Loading and flushing on the crawl's loop: bounded work per turn, however large the park file."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import signal
import time

import pytest
import pytest_twisted
from scrapy import Spider, signals
from scrapy.utils.test import get_crawler
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred

from scrapy_retryafter import parkcompact
from scrapy_retryafter.parkfile import ParkFile, ParkFileError, ParkRecord, encode_value
from scrapy_retryafter.parking import Parking
from scrapy_retryafter.parkload import CLAIM_RECORDS
from scrapy_retryafter.settings import load_config


def _records(count: int, due_in: float) -> list[ParkRecord]:
    now = time.time()
    out = []
    for i in range(count):
        request = {"url": f"http://127.0.0.1:1/item/{i}", "callback": "parse", "method": "GET",
                   "headers": {"Cookie": [b"session=0123456789abcdef"]}, "meta": {"tag": f"item-{i}"}}
        out.append(ParkRecord(url=request["url"], slot="127.0.0.1", reason="over_cap", attempts=1,
                              not_before=now + due_in, request=encode_value(request), spider="loading"))
    return out


def _timers() -> int:
    """Timers on the loop: Twisted's, and asyncio's where Scrapy schedules on asyncio (no public count)."""
    loop = asyncio.get_event_loop()
    return len(reactor.getDelayedCalls()) + len(getattr(loop, "_scheduled", ()))


async def _until(condition, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await task.deferLater(reactor, 0.005, lambda: None)


class _Gaps:
    """How long the loop was kept busy: the longest gap between runs of a 1 ms looping call that
    the process spent working (a gap the machine spent on other processes is not the loop's)."""

    def __init__(self) -> None:
        self.last = self.last_cpu = 0.0
        self.worst = self.worst_wall = 0.0
        self.ticks = 0
        self.loop = task.LoopingCall(self._tick)

    def _tick(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.worst = max(self.worst, min(wall - self.last, cpu - self.last_cpu))
        self.worst_wall = max(self.worst_wall, wall - self.last)
        self.last, self.last_cpu = wall, cpu
        self.ticks += 1

    def __enter__(self) -> _Gaps:
        self.last, self.last_cpu = time.perf_counter(), time.process_time()
        self.loop.start(0.001, now=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.stop()


def _write(path, count: int, due_in: float) -> None:
    with ParkFile(path) as lot:
        lot.add_many(_records(count, due_in))


def _made(path):
    crawler = get_crawler(Spider, {"RETRY_AFTER_PARK_FILE": str(path), "RETRY_AFTER_MAX_DELAY": 86400})
    spider = Spider(name="loading")
    crawler.spider = spider
    return crawler, spider, Parking(crawler, load_config(crawler.settings), lambda: [])


async def _open(path):
    crawler, spider, parking = _made(path)
    await _send(crawler, signal=signals.spider_opened, spider=spider)
    return crawler, spider, parking


async def _send(crawler, **kwargs) -> None:
    send = getattr(crawler.signals, "send_catch_log_async", None)  # Scrapy >= 2.14
    if send is not None:  # run as an asyncio task, as the engine would
        await Deferred.fromFuture(asyncio.ensure_future(send(**kwargs)))
    else:
        await crawler.signals.send_catch_log_deferred(**kwargs)


async def _close(crawler, spider) -> None:
    await _send(crawler, signal=signals.spider_closed, spider=spider, reason="finished")


@pytest_twisted.ensureDeferred
async def test_thousands_of_loaded_requests_wait_under_one_timer_and_closing_cancels_one(tmp_path):
    before = _timers()
    _write(tmp_path / "parked.jsonl", 3000, due_in=3600)
    crawler, spider, parking = await _open(tmp_path / "parked.jsonl")
    assert parking.loader is not None
    await _until(lambda: not parking.loader.loading)
    assert parking.loader.pending == 3000
    assert _timers() - before < 10  # one timer per request before: 3,000
    started = time.perf_counter()
    await _close(crawler, spider)
    assert parking.loader.pending == 0
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("due_in", [3600, 0], ids=["queued", "rebuilt"])
@pytest_twisted.ensureDeferred
async def test_claiming_queueing_and_rebuilding_many_parked_requests_keeps_the_loop_turning(tmp_path, due_in):
    _write(tmp_path / "parked.jsonl", 20000, due_in=due_in)
    crawler, spider, parking = _made(tmp_path / "parked.jsonl")
    with _Gaps() as gaps:
        await _send(crawler, signal=signals.spider_opened, spider=spider)
        assert parking.loader is not None
        if due_in:
            await _until(lambda: not parking.loader.loading)
        else:
            await _until(lambda: crawler.stats.get_value("retry_after/unparked", 0) == 20000)
    pending, unparked = parking.loader.pending, crawler.stats.get_value("retry_after/unparked", 0)
    await _close(crawler, spider)
    # claimed, read and queued (and, when due, rebuilt, batch after batch) while the loop was watched
    assert (pending, unparked) == ((CLAIM_RECORDS, 0) if due_in else (0, 20000))
    assert gaps.ticks > 20, f"the loop turned {gaps.ticks} times while the file was claimed"
    assert gaps.worst < 0.1, (
        f"the loop was kept busy for {gaps.worst * 1000:.0f} ms (longest gap {gaps.worst_wall * 1000:.0f} ms)"
    )


def _compact_here_refused(*args, **kwargs):
    raise AssertionError("compacted in the crawl's process")


def test_compaction_during_a_crawl_runs_in_another_process_and_keeps_our_claims(tmp_path, monkeypatch):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot, ParkFile(path) as other:
        records = _records(40, due_in=0)
        lot.add_many(records)
        lot.claim(lambda entry: entry.url.endswith(("/0", "/1")))
        lot.done([record.id for record in records[2:30]])
        size = path.stat().st_size
        monkeypatch.setattr(parkcompact.CompactingLog, "_compact_fold", _compact_here_refused)
        assert lot.compact_apart() == 12
        assert lot.tombstones == 0
        assert path.stat().st_size < size / 2
        assert sorted(r.url for r in other.claim(lambda entry: True).records) == sorted(r.url for r in records[30:])


def test_a_compaction_that_fails_in_the_child_raises_with_its_reason(tmp_path):
    path = tmp_path / "parked.jsonl"
    large = [ParkRecord(url=f"http://127.0.0.1:1/{i}", slot="127.0.0.1", reason="over_cap", attempts=1,
                        not_before=time.time(), request=encode_value({"url": f"http://127.0.0.1:1/{i}", "body": b"x" * 700_000}))
             for i in range(2)]
    with ParkFile(path) as lot:
        lot.add_many(large)
        before = path.read_bytes()
        # The child inherits a file-size limit its copy is over (and SIGXFSZ ignored): it fails as on a full disk.
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, limits[1]))
        try:
            with pytest.raises(ParkFileError, match="File too large") as failed:
                lot.compact_apart()
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
            signal.signal(signal.SIGXFSZ, handler)
        assert failed.value.errno == errno.ENOSPC
    assert path.read_bytes() == before  # left as it was, no temporary file beside it
    assert sorted(os.listdir(tmp_path)) == ["parked.jsonl"]
