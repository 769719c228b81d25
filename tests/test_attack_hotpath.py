"""Attacks on the hot path (holds_none, download_slot read from meta, the rate-limit name check).

Each test compares what the success path does with what it did before the
change: the same slot as ``slot_of`` gives, the same policy as
``config.policy_for`` gives, the same header names read.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request
from scrapy.utils.defer import maybe_deferred_to_future

from scrapy_retryafter.extension import RetryAfterExtension
from scrapy_retryafter.ratelimit import _PREFIXES, speaks_ratelimit
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, ListSpider, crawl

PAGES = 60


def _old_speaks_ratelimit(names: Any) -> bool:
    """The check before the change, verbatim."""
    return any(name.lower().startswith(_PREFIXES) for name in names)


_PIECES = st.sampled_from(
    [b"ratelimit", b"RateLimit", b"X-RateLimit", b"x-ratelimit", b"X-Rate-Limit", b"-", b"Policy", b"Remaining",
     b"Reset", b"Retry-After", b"-Ms", b"rate", b"limit", b"x-", b"X", b"\xc4\xb0", b"K", b"\x00", b""]
)
_NAMES = st.lists(st.lists(_PIECES, max_size=4).map(b"".join) | st.binary(max_size=12), max_size=6)


@given(_NAMES)
def test_the_joined_search_accepts_exactly_the_names_the_old_scan_did(names: list[bytes]) -> None:
    assert speaks_ratelimit(names) is _old_speaks_ratelimit(names)


@given(_NAMES)
def test_the_same_on_scrapy_headers(names: list[bytes]) -> None:
    from scrapy.http.headers import Headers

    headers = Headers({name: b"1" for name in names if name})
    assert speaks_ratelimit(headers) is _old_speaks_ratelimit(headers)


@pytest_twisted.ensureDeferred
async def test_a_scope_slot_reads_quota_headers_on_success_when_its_hosts_entry_asks(server: Any) -> None:
    """RETRY_AFTER_SLOTS[host] turns the headers on, the default is off, requests get a path scope.

    ``config.policy_for(scope slot)`` is the host's entry (scope_bases); the success path must use it,
    as ``throttle()`` does, or the announced quota is ignored and the limiter throttles (>2 x 429)."""
    host = server.add_host(HostConfig(rate=20.0, window=1.0, penalty=1.0, ratelimit="ietf"))
    server.start()
    settings = {
        **ADDON,
        "RETRY_AFTER_WAKE_JITTER": 0.1,
        "RETRY_AFTER_RATELIMIT_HEADERS": False,
        "RETRY_AFTER_SLOTS": {host.address: {"ratelimit_headers": True}},
        "RETRY_AFTER_SCOPES": [{"path": {host.address: ["/p"]}}],
    }
    crawler = await crawl([Request(host.url(f"/p/{i}")) for i in range(PAGES)], settings)
    assert len({url for url, status in crawler.spider.seen if status == 200}) == PAGES
    extension = RetryAfterExtension.of(crawler)
    (slot,) = set(extension.tally.responses)
    assert slot != host.address and extension.config.policy_for(slot).ratelimit_headers
    throttles = len(server.arrivals(host, status=429))
    assert throttles <= 2, f"{throttles} x 429: the scope slot's success path ignored its host's entry"


@pytest.mark.parametrize("given", [7, "7"], ids=["int", "str"])
@pytest_twisted.ensureDeferred
async def test_a_non_string_download_slot_is_one_slot_on_every_path(server: Any, caplog: Any, given: Any) -> None:
    """A user's ``download_slot`` meta of 7 (an int; Scrapy keys its downloader by it as it is):
    ``slot_of`` makes it "7", and every path must name it so, or the board's "7" never sees a
    success and its pace stays at the first cut (60 pages at 10 r/s took 59 s, the floor's 1 r/s)."""
    host = server.add_host(HostConfig(rate=10.0, burst=1.0, penalty=1.0))
    server.start()
    requests = [Request(host.url(f"/{i}"), meta={"download_slot": given}) for i in range(PAGES)]
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        crawler = await crawl(requests, {**ADDON, "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16})
    elapsed = time.monotonic() - started
    assert len({url for url, status in crawler.spider.seen if status == 200}) == PAGES
    extension = RetryAfterExtension.of(crawler)
    assert set(extension.tally.responses) == {"7"}, set(extension.tally.responses)
    assert all(isinstance(slot, str) for slot in extension.board.kept_slots()), extension.board.kept_slots()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert elapsed < 2 * PAGES / 10.0 + 5.0, f"{elapsed:.1f} s: the pace never regrew"


class _DirectSpider(ListSpider):
    """Fetches its requests through ``engine.download`` (as a spider awaiting a page does): no scheduler."""

    name = "direct"

    async def start(self):  # type: ignore[override]
        for request in self.to_send:
            download = getattr(self.crawler.engine, "download_async", None)
            if download is not None:
                response = await download(request)
            else:
                response = await maybe_deferred_to_future(self.crawler.engine.download(request))
            self.seen.append((response.url, response.status))
            self.slots.append(response.request.meta.get("download_slot"))
        return
        yield

    slots: list[Any]


@pytest.mark.parametrize("setup", [ADDON, {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}],
                         ids=["addon", "middleware-only"])
@pytest_twisted.ensureDeferred
async def test_a_request_that_bypasses_the_scheduler_is_keyed_by_its_scope_while_nothing_is_held(
    server: Any, setup: dict[str, Any]
) -> None:
    """Before holds_none, process_request called slot_of for every request, writing the scope into
    ``download_slot`` meta before the downloader keyed it; a request sent by ``engine.download`` is
    scoped nowhere else. Without it the downloader keys it by its host while nothing is held, and a
    429 then cools the host slot while the next such requests go out under the scope key."""
    host = server.add_host(HostConfig())
    server.start()
    _DirectSpider.slots = []
    requests = [Request(host.url(f"/{i}"), meta={"throttling_scopes": "tenant-a"}) for i in range(3)]
    crawler = await crawl(requests, setup, spider_cls=_DirectSpider)
    assert [status for _, status in crawler.spider.seen] == [200, 200, 200]
    assert host.address not in _DirectSpider.slots, _DirectSpider.slots


_SLOTS = ["a", "b", "c"]
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["cool", "throttle", "refuse", "blind", "remember", "restore", "sweep", "ready", "advance",
                         "succeeded", "success"]),
        st.sampled_from(_SLOTS),
        st.floats(0.0, 1000.0),
    ),
    max_size=30,
)


@given(_OPS)
def test_holds_none_is_not_slot_in_board_for_every_slot_whatever_the_board_did(ops: list[Any]) -> None:
    """The early return equals the old per-slot check after any sequence of what fills or empties the board
    (cooldowns, refusals, spent budgets, remembered paces, a JOBDIR snapshot restored, sweeps)."""
    from scrapy_retryafter.board import CooldownBoard
    from scrapy_retryafter.testing.clock import FakeClock

    clock = FakeClock()
    board = CooldownBoard(clock=clock, pace_memory=60.0)
    for op, slot, x in ops:
        if op == "cool":
            board.cool(slot, x)
        elif op == "throttle":
            board.throttle(slot, clock(), x, learn=True, wake_jitter=0.0, circuit_threshold=3,
                           circuit_open_seconds=x)
        elif op == "refuse":
            board.refuse(slot, x)
        elif op == "blind":
            board.spend_blind_retry(slot, 10.0)
        elif op == "remember":
            board.remember_paces({slot: max(x, 1.0)})
        elif op == "restore":
            board.restore(board.snapshot(), elapsed=x)
        elif op == "sweep":
            board.sweep()
        elif op == "ready":
            board.ready_at(slot)
        elif op == "advance":
            clock.advance(x)
        elif op == "succeeded":
            board.succeeded(slot)
        else:
            board.success(slot, 0.1, 10.0)
        assert board.holds_none() is all(s not in board for s in _SLOTS), (op, slot, list(board))
