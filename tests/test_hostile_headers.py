"""Hostile rate-limit headers through the real middleware and board (issue 16, item 8).

Responses carrying any mix of Retry-After, RateLimit*, X-RateLimit*,
retry-after-ms and Date values (random strings; huge, tiny and negative
numbers) go through a crawler built with the add-on, as the engine hands them
over: the ``response_downloaded`` signal, then ``process_response``. Nothing
may raise, no slot may cool or be paced past the cap, and nothing may be
parked for more than a week.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider, signals
from scrapy.http import Headers, Response
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from scrapy_retryafter.extension import RetryAfterExtension
from scrapy_retryafter.middleware import RetryAfterMiddleware

WEEK = 7 * 86400.0
_hosts = itertools.count()


class Crawl:
    """One crawler with the add-on, its middleware and board; each example uses a host of its own."""

    def __init__(self, park_file: str) -> None:
        self.crawler = get_crawler(
            Spider,
            {
                "ADDONS": {"scrapy_retryafter.Addon": 500},
                "RETRY_AFTER_PARK_FILE": park_file,
                "LOG_LEVEL": "ERROR",
                "RETRY_AFTER_LOGSTATS_INTERVAL": 0,  # no live view left looping into later tests
            },
        )
        self.crawler.spider = self.crawler._create_spider("hostile")
        self.crawler.engine = self.crawler._create_engine()
        # The instance the engine's downloader built: a second one would handle every signal twice.
        downloader = self.crawler.engine.downloader
        self.middleware = next(m for m in downloader.middleware.middlewares if isinstance(m, RetryAfterMiddleware))
        self.extension = RetryAfterExtension.of(self.crawler)
        self.board = self.extension.board
        self.policy = self.extension.config.default
        # The park file opens with the spider, as in a crawl.
        self.crawler.signals.send_catch_log(signals.spider_opened, spider=self.crawler.spider)

    def respond(
        self, status: int, headers: list[tuple[str, bytes]], method: str = "GET", host: str | None = None
    ) -> tuple[str, list[Any], Any]:
        """What the engine does with a response: signal, then the middleware chain's call."""
        request = Request(f"http://{host or self.new_host()}/", method=method)
        raw = Headers()
        for name, value in headers:
            raw.appendlist(name, value)
        response = Response(request.url, status=status, headers=raw, request=request)
        caught = self.crawler.signals.send_catch_log(
            signals.response_downloaded, response=response, request=request, spider=self.crawler.spider
        )
        failures = [result.value for _, result in caught if isinstance(result, Failure)]
        out = self.middleware.process_response(request, response)
        return self.extension.slot_of(request), failures, out

    @staticmethod
    def new_host() -> str:
        return f"h{next(_hosts)}.test"

    def exchange(self, responses: list[tuple[int, list[tuple[str, bytes]], str]]) -> tuple[str, list[Any]]:
        """Several responses from one host, in turn; every failure any of them caused."""
        host = self.new_host()
        failures: list[Any] = []
        slot = host
        for status, headers, method in responses:
            slot, caught, out = self.respond(status, headers, method, host)
            failures.extend(caught)
            assert isinstance(out, (Request, Response))
        return slot, failures

    def worst_park(self) -> float:
        """Seconds from now to the furthest not_before in the park file."""
        parking = self.extension.parking
        assert parking is not None
        assert parking.file is not None
        if not parking.file.path.exists():
            return 0.0
        records = [entry.record() for entry in parking.file.read().records.values()]
        return max((record.not_before for record in records), default=0.0) - time.time()


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crawl]:
    made = Crawl(str(tmp_path_factory.mktemp("hostile") / "parked.jsonl"))
    yield made
    made.crawler.signals.send_catch_log(signals.spider_closed, spider=made.crawler.spider, reason="finished")


# --------------------------------------------------------------------------
# the header values
# --------------------------------------------------------------------------

NOW = time.time()
_NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=int(NOW) - 10**6, max_value=int(NOW) + 10**7),  # epochs, near and far
    st.integers(min_value=int(NOW * 1000) - 10**9, max_value=int(NOW * 1000) + 10**10),  # epochs in ms
).map(str) | st.floats().map(repr) | st.floats(min_value=0, max_value=1e-3).map(lambda f: f"{f:.12f}") | st.sampled_from(
    ["1e309", "0x10", "+5", " 5 ", "5.", ".5", "\u0663", "nan", "-inf", "1e300", "1000000000", "0", "-0"]
)
_DATES = st.one_of(
    st.floats(min_value=-2e9, max_value=4e9).map(
        lambda offset: format_datetime(datetime.fromtimestamp(max(0.0, NOW + offset), timezone.utc), usegmt=True)
    ),
    st.floats(min_value=-86400 * 3, max_value=86400 * 3).map(
        lambda offset: format_datetime(datetime.fromtimestamp(NOW + offset, timezone.utc), usegmt=True)
    ),
    st.sampled_from(["Thu, 01 Jan 1970 00:00:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", "thu, 1 jan 2026 00:00:00 +0000"]),
)
_STRUCTURED = st.tuples(
    st.sampled_from(["q", "w", "r", "t", "pk"]), _NUMBERS, st.sampled_from(["q", "w", "r", "t"]), _NUMBERS
).map(lambda t: f'"p";{t[0]}={t[1]};{t[2]}={t[3]}')
_VALUES = st.one_of(
    _NUMBERS, _DATES, _STRUCTURED, st.text(max_size=40), st.binary(max_size=40),
    st.just("9" * 10_000), st.just("\x00\x01\x7f"),
)
_NAMES = st.sampled_from([
    "Retry-After", "Retry-After", "RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining",
    "RateLimit-Reset", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
    "X-RateLimit-Reset-After", "Retry-After-Ms", "X-Ms-Retry-After-Ms", "Date",
])
_HEADERS = st.lists(
    st.tuples(_NAMES, _VALUES.map(lambda v: v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass"))),
    max_size=8,
)
_DELTAS = st.one_of(st.integers(min_value=0, max_value=2 * int(WEEK)), st.integers(min_value=0, max_value=120))


def _reset(delta: int, form: str) -> str:
    if form == "epoch":
        return str(int(NOW) + delta)
    if form == "ms":
        return str((int(NOW) + delta) * 1000)
    return str(delta)


_COHERENT = st.one_of(
    st.builds(  # GitHub-style: a quota, what is left, a reset
        lambda limit, left, delta, form: [
            ("X-RateLimit-Limit", str(limit)), ("X-RateLimit-Remaining", str(min(left, limit))),
            ("X-RateLimit-Reset", _reset(delta, form)),
        ],
        st.integers(min_value=1, max_value=10**7), st.integers(min_value=0, max_value=10**7), _DELTAS,
        st.sampled_from(["epoch", "ms", "delta"]),
    ),
    st.builds(  # IETF: policy and state
        lambda q, w, r, t: [("RateLimit-Policy", f'"p";q={q};w={w}'), ("RateLimit", f'"p";r={r};t={t}')],
        st.integers(min_value=1, max_value=10**7), st.integers(min_value=1, max_value=10**10),
        st.integers(min_value=0, max_value=10), _DELTAS,
    ),
    st.builds(
        lambda left, delta: [("RateLimit-Limit", "100"), ("RateLimit-Remaining", str(left)), ("RateLimit-Reset", str(delta))],
        st.integers(min_value=0, max_value=100), _DELTAS,
    ),
    st.builds(lambda delta: [("Retry-After", str(delta))], _DELTAS),
    st.builds(lambda ms: [("Retry-After-Ms", str(ms))], st.integers(min_value=0, max_value=10**12)),
    st.builds(lambda d: [("Retry-After", d)], _DATES),
).map(lambda pairs: [(name, value.encode()) for name, value in pairs])
_HEADERS = st.one_of(_HEADERS, st.tuples(_COHERENT, _HEADERS).map(lambda both: both[0] + both[1][:2]))
_STATUS = st.sampled_from([200, 429, 503])
_METHOD = st.sampled_from(["GET", "POST"])
_RESPONSES = st.one_of(
    st.lists(st.tuples(_STATUS, _HEADERS, _METHOD), min_size=1, max_size=4),
    # A server says the same on every response.
    st.tuples(st.lists(_STATUS, min_size=2, max_size=4), _HEADERS, _METHOD).map(
        lambda t: [(status, t[1], t[2]) for status in t[0]]
    ),
)
_EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# --------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------


@_EXAMPLES
@given(responses=_RESPONSES)
@example(  # found by the search: an announced pace of 1/256 per second, then any success
    responses=[
        (200, [("RateLimit-Limit", b"100"), ("RateLimit-Remaining", b"1"), ("RateLimit-Reset", b"256")], "GET"),
        (200, [], "GET"),
    ]
)
def test_never_raises(crawl, responses):
    slot, failures = crawl.exchange(responses)
    assert not failures, f"{slot}: {failures!r}"


@_EXAMPLES
@given(responses=_RESPONSES)
def test_never_cools_past_the_cap(crawl, responses):
    slot, _ = crawl.exchange(responses)
    cap = crawl.policy.max_delay * crawl.policy.pad
    assert crawl.board.remaining(slot) <= cap
    if not crawl.board.refused(slot):  # a refused slot is held for its sweep to the park file, not cooled
        assert crawl.board.ready_at(slot) - crawl.board.clock() <= cap + crawl.policy.wake_jitter + 1e-6
    assert crawl.board.refused(slot) <= WEEK


@_EXAMPLES
@given(responses=_RESPONSES)
@example(  # found by the search: one left, reset in 301 s, paced at one request per 301 s
    responses=[(200, [("RateLimit-Limit", b"100"), ("RateLimit-Remaining", b"1"), ("RateLimit-Reset", b"301")], "GET")]
)
def test_never_paces_slower_than_the_cap(crawl, responses):
    slot, _ = crawl.exchange(responses)
    rate = crawl.board.rate(slot)
    assert rate is None or 1 / rate <= crawl.policy.max_delay


@_EXAMPLES
@given(responses=_RESPONSES)
def test_never_parks_more_than_a_week_away(crawl, responses):
    crawl.exchange(responses)
    assert crawl.worst_park() <= WEEK + 1.0


# --------------------------------------------------------------------------
# the cases, one by one
# --------------------------------------------------------------------------


def _http_date(offset: float) -> bytes:
    return format_datetime(datetime.fromtimestamp(time.time() + offset, timezone.utc), usegmt=True).encode()


def test_a_retry_after_over_the_cap_refuses_for_at_most_a_week(crawl):
    slot, failures, out = crawl.respond(429, [("Retry-After", b"9" * 400)])
    assert not failures and isinstance(out, Request)
    assert WEEK - 5 <= crawl.board.refused(slot) <= WEEK


@pytest.mark.parametrize(
    "value",
    [b"Thu, 1 Jan 2099 00:00:00 GMT", b"thu, 01 jan 2099 00:00:00 gmt", b"Thu, 01 Jan 2099 00:00:00 +0000"],
)
def test_date_forms_urllib3_accepts_are_not_blind_backoff(crawl, value):
    slot, failures, _ = crawl.respond(429, [("Retry-After", value)])
    assert not failures
    assert crawl.board.refused(slot) > 0  # 2099 is over the cap: refused, not a blind retry


def test_a_window_of_a_billion_seconds_does_not_stall_for_decades(crawl):
    slot, _, _ = crawl.respond(200, [("RateLimit-Policy", b'"d";q=1;w=1000000000')])
    rate = crawl.board.rate(slot)
    assert rate is not None and 1 / rate <= 2 * WEEK  # a week's window at one request: not 31 years


def test_a_github_style_hourly_quota_raises_nothing(crawl):
    reset = str(int(time.time() + 3000)).encode()
    headers = [("X-RateLimit-Limit", b"60"), ("X-RateLimit-Remaining", b"10"), ("X-RateLimit-Reset", reset)]
    slot, failures = crawl.exchange([(200, headers, "GET"), (200, headers, "GET")])
    assert not failures, failures


def test_several_retry_after_headers_the_largest_wins(crawl):
    slot, _, _ = crawl.respond(429, [("Retry-After", b"400"), ("Retry-After", b"1")])
    assert crawl.board.refused(slot) > 0  # 400 s is over the 300 s cap


def test_a_date_header_of_1970_is_not_trusted(crawl):
    slot, _, _ = crawl.respond(429, [("Retry-After", _http_date(5)), ("Date", b"Thu, 01 Jan 1970 00:00:00 GMT")])
    assert crawl.board.refused(slot) == 0.0
    assert 0 < crawl.board.remaining(slot) <= 5 * crawl.policy.pad + 1


# --------------------------------------------------------------------------
# the quota as a budget, with the demand counted (budget.py): a covered
# quota drops its pace, so hostile values must never free what was not stated
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crawl]:
    made = Crawl(str(tmp_path_factory.mktemp("hostile-counted") / "parked.jsonl"))
    # The engine never read a start request: every slot wants 0, counted.
    made.extension.queue_holds_slots = made.extension.queue_counts_slots = True
    yield made
    made.crawler.signals.send_catch_log(signals.spider_closed, spider=made.crawler.spider, reason="finished")


_JUMPING = st.lists(  # one host whose reset jumps back and forth, past and future, epoch and delta
    st.tuples(
        st.integers(min_value=-(10**12), max_value=10**12),
        st.integers(min_value=-(10**12), max_value=10**12),
        st.integers(min_value=-2 * int(WEEK), max_value=2 * int(WEEK)),
        st.sampled_from(["epoch", "ms", "delta"]),
        _STATUS,
    ).map(lambda t: (t[4], [
        ("X-RateLimit-Limit", str(t[0]).encode()), ("X-RateLimit-Remaining", str(t[1]).encode()),
        ("X-RateLimit-Reset", (str(int(NOW) + t[2]) if t[3] == "epoch" else
                               str((int(NOW) + t[2]) * 1000) if t[3] == "ms" else str(t[2])).encode()),
    ], "GET")),
    min_size=1, max_size=6,
)


@_EXAMPLES
@given(responses=st.one_of(_RESPONSES, _JUMPING))
@example(responses=[(200, [("X-RateLimit-Limit", b"10"), ("X-RateLimit-Remaining", b"1000000000"),
                           ("X-RateLimit-Reset", b"60")], "GET")])
@example(responses=[(200, [("X-RateLimit-Limit", b"60"), ("X-RateLimit-Remaining", b"59"),
                           ("X-RateLimit-Reset", str(int(NOW) - 30).encode())], "GET")])
def test_a_counted_demand_never_raises_nor_passes_the_cap(counted, responses):
    slot, failures = counted.exchange(responses)
    assert not failures, f"{slot}: {failures!r}"
    cap = counted.policy.max_delay * counted.policy.pad
    assert counted.board.remaining(slot) <= cap
    if not counted.board.refused(slot):  # a refused slot is held for its sweep to the park file, not cooled
        assert counted.board.ready_at(slot) - counted.board.clock() <= cap + counted.policy.wake_jitter + 1e-6
    assert counted.board.refused(slot) <= WEEK
    rate = counted.board.rate(slot)
    assert rate is None or 1 / rate <= counted.policy.max_delay
    assert counted.worst_park() <= WEEK + 1.0


def test_a_counted_demand_frees_a_covered_quota_and_keeps_a_short_one(counted):
    reset = str(int(time.time() + 3000)).encode()
    roomy = [("X-RateLimit-Limit", b"60"), ("X-RateLimit-Remaining", b"59"), ("X-RateLimit-Reset", reset)]
    slot, _, _ = counted.respond(200, roomy)
    assert counted.board.rate(slot) is None  # 59 left, nothing wanted: no pace
    counted.extension.queue_counts_slots = False  # the demand unknown: the same headers pace
    try:
        slot, _, _ = counted.respond(200, roomy)
        assert counted.board.rate(slot) is not None
    finally:
        counted.extension.queue_counts_slots = True
    counted.respond(200, roomy, host=slot)  # counted again: the pace goes
    assert counted.board.rate(slot) is None
    assert counted.board.ready_at(slot) <= counted.board.clock()
    liar = [("X-RateLimit-Limit", b"10"), ("X-RateLimit-Remaining", b"0"), ("X-RateLimit-Reset", b"30")]
    slot, _, _ = counted.respond(200, liar)
    assert counted.board.remaining(slot) > 0  # spent: cooled until the reset, whatever the demand
