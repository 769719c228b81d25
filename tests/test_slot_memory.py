"""Nothing kept per slot outlives the board's memory of it: a broad crawl does not grow without bound.

100,000 slots pass through every component that keeps something per slot
(the board's state, meters, failure streaks and quota windows, the tally, the
throttle middleware and the retry middleware), as a broad crawl's responses
and connection failures would; after a sweep, every per-slot map holds only
the slots that are still live, and a second pass of 100,000 new slots raises
the peak of traced memory by less than 5 %.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest
from scrapy import Request, Spider, signals
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.extension import RetryAfterExtension
from scrapy_retryafter.middleware import RetryAfterMiddleware
from scrapy_retryafter.retry import RetryMiddleware
from scrapy_retryafter.testing.clock import FakeClock

SLOTS = 100_000
SHELL_EVERY = 10
THROTTLED_EVERY = 100
"""One slot in a hundred answers a 429: the tally keeps those for the closing table."""
LIVE = 5
"""Slots of each pass still cooling when the sweep runs."""


def _pass(crawler: Any, clock: FakeClock, middleware: RetryAfterMiddleware, retry: RetryMiddleware, start: int) -> None:
    """Every slot feeds the board and the tally as the middlewares do; one in ten goes through the
    middlewares themselves (their hooks, a Scrapy request each), which would take a minute for all."""
    spider = crawler.spider
    board, tally = middleware.board, middleware.extension.tally
    quota = {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "50", "X-RateLimit-Reset": "1900000000"}
    ok = Response("http://any.test/", status=200, headers=quota)
    refused = ConnectionRefusedError()
    for i in range(start, start + SLOTS):
        clock.advance(0.0001)
        slot = f"host{i}.test"
        if i % SHELL_EVERY == 0:
            request = Request(f"http://{slot}/", meta={"download_slot": slot})
            retry.process_exception(request, refused)
            crawler.signals.send_catch_log(signals.response_downloaded, response=ok, request=request, spider=spider)
            if i % THROTTLED_EVERY == 0:
                throttle = Response(request.url, status=429, headers={"Retry-After": "1"}, request=request)
                crawler.signals.send_catch_log(signals.response_downloaded, response=throttle, request=request, spider=spider)
                middleware.process_response(request, throttle)
            continue
        board.connection_failed(slot)
        tally.responded(slot)
        board.success(slot, 0.1, 10.0)
        board.succeeded(slot)
        board.quota_window(slot, 1900000000.0)
        board.spend_blind_retry(slot, 10.0)
        board.announce(slot, 5.0)
    for i in range(start, start + LIVE):
        board.cool(f"host{i}.test", 10_000.0)
    clock.advance(board.pace_memory + 60.0)


def _live(extension: RetryAfterExtension, start: int) -> set[str]:
    return {f"host{i}.test" for i in range(start, start + LIVE)}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_sweep_leaves_only_live_slots_and_a_second_broad_pass_costs_no_more_memory(tmp_path):
    crawler = get_crawler(
        Spider,
        {
            "RETRY_AFTER_ALL_RETRIES": True,
            "RETRY_AFTER_RATELIMIT_HEADERS": True,
            "RETRY_AFTER_PARK_FILE": str(tmp_path / "parked.jsonl"),
            "LOG_LEVEL": "WARNING",
        },
    )
    crawler.spider = Spider.from_crawler(crawler, "memory")
    crawler.engine = crawler._create_engine()
    clock = FakeClock()
    extension = RetryAfterExtension.of(crawler)
    extension.board = CooldownBoard(clock=clock)
    middleware = RetryAfterMiddleware.from_crawler(crawler)
    retry = RetryMiddleware.from_crawler(crawler)

    gc.collect()
    tracemalloc.start()
    try:
        _pass(crawler, clock, middleware, retry, 0)
        extension.sweep()
        gc.collect()
        first_peak = tracemalloc.get_traced_memory()[1]

        live = _live(extension, 0)
        throttled = {f"host{i}.test" for i in range(0, SLOTS, THROTTLED_EVERY)}
        assert extension.board.kept_slots() == live
        assert set(extension.tally.responses) <= live | throttled
        assert not middleware.room._holding

        _pass(crawler, clock, middleware, retry, SLOTS)
        extension.sweep()
        gc.collect()
        second_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    live = _live(extension, 0) | _live(extension, SLOTS)
    assert extension.board.kept_slots() <= live
    assert len(extension.board.kept_slots()) >= LIVE
    assert second_peak < first_peak * 1.05, (first_peak, second_peak)


def test_the_tally_forgets_only_quiet_slots_that_nothing_keeps():
    from scrapy_retryafter.tally import SlotTally

    tally = SlotTally()
    for slot in ("quiet", "live", "throttled", "cooled", "opened"):
        tally.responded(slot)
    tally.throttled("throttled", 429, 0.0)
    tally.cooled("cooled", 2.0)
    tally.circuit_opened("opened")
    assert tally.prune(live={"live"}.__contains__) == 1
    assert set(tally.responses) == {"live", "throttled", "cooled", "opened"}  # the closing table's rows keep their counts
    assert tally.responses["throttled"] == 2
