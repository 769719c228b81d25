"""failures.py: which failure is retried for which method, the deadline arithmetic, the host-down count."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.backoff import STRATEGIES, Backoff
from scrapy_retryafter.failures import (
    DEADLINE,
    STARTED,
    ConsecutiveFailures,
    Rule,
    classify_exception,
    classify_status,
    deadline_of,
    decide_failure,
    method_allowed,
    past_deadline,
    qualified_names,
    stamp_first_attempt,
)

GET_HEAD = frozenset({"GET", "HEAD"})


# --------------------------------------------------------------------------
# the reference table
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "rule"),
    [
        (408, Rule.IDEMPOTENT),
        (500, Rule.LISTED_METHODS),
        (502, Rule.IDEMPOTENT),
        (503, Rule.IDEMPOTENT),
        (504, Rule.IDEMPOTENT),
        (522, Rule.IDEMPOTENT),
        (524, Rule.IDEMPOTENT),
        (429, Rule.ANY_METHOD),
        (400, Rule.NEVER),
        (401, Rule.NEVER),
        (403, Rule.NEVER),
        (404, Rule.NEVER),
        (409, Rule.NEVER),
        (422, Rule.NEVER),
        (302, Rule.NEVER),
    ],
)
def test_status_rules(status, rule):
    assert classify_status(status) is rule


def _names(*qualified: str) -> list[str]:
    return [*qualified, "builtins.Exception", "builtins.BaseException", "builtins.object"]


@pytest.mark.parametrize(
    ("names", "rule"),
    [
        (_names("twisted.internet.error.DNSLookupError", "builtins.OSError"), Rule.ANY_METHOD),
        (_names("twisted.internet.error.ConnectionRefusedError", "twisted.internet.error.ConnectError"), Rule.ANY_METHOD),
        (_names("scrapy.exceptions.CannotResolveHostError"), Rule.ANY_METHOD),
        (_names("scrapy.exceptions.DownloadConnectionRefusedError"), Rule.ANY_METHOD),
        (_names("builtins.ConnectionRefusedError", "builtins.ConnectionError", "builtins.OSError"), Rule.ANY_METHOD),
        # A connect and a read timeout are one error in Scrapy: the server may have done the work.
        (_names("twisted.internet.error.TimeoutError", "twisted.internet.error.UserError"), Rule.IDEMPOTENT),
        (_names("twisted.internet.defer.TimeoutError"), Rule.IDEMPOTENT),
        (_names("twisted.internet.error.TCPTimedOutError", "twisted.internet.error.ConnectError"), Rule.IDEMPOTENT),
        (_names("scrapy.exceptions.DownloadTimeoutError"), Rule.IDEMPOTENT),
        (_names("twisted.internet.error.ConnectionLost", "twisted.internet.error.ConnectionClosed"), Rule.IDEMPOTENT),
        (_names("twisted.internet.error.ConnectionDone"), Rule.IDEMPOTENT),
        (_names("twisted.web._newclient.ResponseFailed"), Rule.IDEMPOTENT),
        (_names("scrapy.exceptions.ResponseDataLossError"), Rule.IDEMPOTENT),
        (_names("builtins.ConnectionResetError", "builtins.ConnectionError", "builtins.OSError"), Rule.IDEMPOTENT),
        (_names("builtins.OSError"), Rule.IDEMPOTENT),
        (_names("scrapy.core.downloader.handlers.http11.TunnelError"), Rule.IDEMPOTENT),
    ],
)
def test_exception_rules(names, rule):
    assert classify_exception(names) is rule


def test_qualified_names_follow_the_mro():
    assert qualified_names(ConnectionRefusedError())[:3] == [
        "builtins.ConnectionRefusedError",
        "builtins.ConnectionError",
        "builtins.OSError",
    ]
    assert classify_exception(qualified_names(ConnectionRefusedError())) is Rule.ANY_METHOD
    assert classify_exception(qualified_names(ConnectionResetError())) is Rule.IDEMPOTENT


def test_the_real_twisted_and_scrapy_exceptions_classify():
    from twisted.internet import defer, error

    assert classify_exception(qualified_names(error.DNSLookupError())) is Rule.ANY_METHOD
    assert classify_exception(qualified_names(error.ConnectionRefusedError())) is Rule.ANY_METHOD
    assert classify_exception(qualified_names(error.TimeoutError())) is Rule.IDEMPOTENT
    assert classify_exception(qualified_names(defer.TimeoutError())) is Rule.IDEMPOTENT
    assert classify_exception(qualified_names(error.ConnectionLost())) is Rule.IDEMPOTENT
    import scrapy.exceptions as scrapy_exceptions

    for name, rule in [
        ("CannotResolveHostError", Rule.ANY_METHOD),
        ("DownloadConnectionRefusedError", Rule.ANY_METHOD),
        ("DownloadTimeoutError", Rule.IDEMPOTENT),
        ("ResponseDataLossError", Rule.IDEMPOTENT),
    ]:
        cls = getattr(scrapy_exceptions, name, None)  # Scrapy >= 2.14
        if cls is not None:
            assert classify_exception(qualified_names(cls())) is rule


@pytest.mark.parametrize(
    ("rule", "method", "key", "allowed"),
    [
        (Rule.ANY_METHOD, "POST", False, True),
        (Rule.ANY_METHOD, "PATCH", False, True),
        (Rule.IDEMPOTENT, "GET", False, True),
        (Rule.IDEMPOTENT, "head", False, True),
        (Rule.IDEMPOTENT, "OPTIONS", False, True),
        (Rule.IDEMPOTENT, "PUT", False, True),
        (Rule.IDEMPOTENT, "DELETE", False, True),
        (Rule.IDEMPOTENT, "TRACE", False, True),
        (Rule.IDEMPOTENT, "POST", False, False),
        (Rule.IDEMPOTENT, "PATCH", False, False),
        (Rule.IDEMPOTENT, "POST", True, True),
        (Rule.IDEMPOTENT, "PATCH", True, True),
        (Rule.LISTED_METHODS, "GET", False, True),
        (Rule.LISTED_METHODS, "HEAD", False, True),
        (Rule.LISTED_METHODS, "PUT", False, False),
        (Rule.LISTED_METHODS, "POST", True, False),
        (Rule.NEVER, "GET", False, False),
        (Rule.NEVER, "GET", True, False),
    ],
)
def test_methods_each_rule_allows(rule, method, key, allowed):
    assert method_allowed(rule, method, key, GET_HEAD) is allowed


# --------------------------------------------------------------------------
# decide_failure
# --------------------------------------------------------------------------


def _decide(rule=Rule.IDEMPOTENT, *, method="GET", key=False, attempt=1, max_retries=5, strategy="full",
            previous=None, meta=None, deadline=math.inf, now=100.0, rng=None):
    return decide_failure(
        rule,
        method=method,
        has_idempotency_key=key,
        server_error_methods=GET_HEAD,
        attempt=attempt,
        max_retries=max_retries,
        backoff=Backoff(strategy, 1.0, 30.0),
        previous_wait=previous,
        meta=meta or {},
        deadline=deadline,
        now=now,
        rng=rng or random.Random(7),
    )


def test_a_retry_waits_the_strategy_draw():
    decision = _decide(attempt=3, strategy="none")
    assert decision.retry and decision.wait == 4.0 and not decision.gave_up


def test_a_non_idempotent_request_is_refused_not_given_up():
    decision = _decide(method="POST")
    assert not decision.retry and not decision.gave_up
    assert "POST" in decision.reason and "Idempotency-Key" in decision.reason


def test_exhausted_retries_give_up():
    decision = _decide(attempt=3, max_retries=2)
    assert not decision.retry and decision.gave_up and decision.reason == "2 retries exhausted"


def test_zero_retries_allowed_gives_up_at_once():
    assert _decide(attempt=1, max_retries=0).gave_up


def test_a_wait_ending_past_the_deadline_gives_up_now():
    # Started at 95, now 100, deadline 8: a 4 s wait ends at 9 s > 8 s.
    decision = _decide(attempt=3, strategy="none", meta={STARTED: 95.0}, deadline=8.0)
    assert not decision.retry and decision.gave_up
    assert "past the 8s deadline" in decision.reason


def test_a_wait_ending_exactly_at_the_deadline_is_made():
    assert _decide(attempt=3, strategy="none", meta={STARTED: 95.0}, deadline=9.0).retry


def test_the_meta_deadline_overrides_the_setting():
    meta = {STARTED: 95.0, DEADLINE: 60}
    assert _decide(attempt=3, strategy="none", meta=meta, deadline=1.0).retry
    assert not _decide(attempt=3, strategy="none", meta={STARTED: 95.0, DEADLINE: 1}, deadline=60.0).retry


def test_decorrelated_jitter_follows_the_previous_wait():
    rng = random.Random(3)
    decision = _decide(strategy="decorrelated", previous=10.0, rng=rng)
    assert 1.0 <= decision.wait <= 30.0


@given(
    rule=st.sampled_from(list(Rule)),
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
    key=st.booleans(),
    attempt=st.integers(1, 12),
    max_retries=st.integers(0, 10),
    strategy=st.sampled_from(sorted(STRATEGIES)),
    previous=st.one_of(st.none(), st.floats(0, 100)),
    started=st.one_of(st.none(), st.floats(0, 100)),
    deadline=st.one_of(st.just(math.inf), st.floats(0.01, 200)),
    seed=st.integers(0, 2**32),
)
def test_decisions_respect_every_bound(rule, method, key, attempt, max_retries, strategy, previous, started, deadline, seed):
    now = 100.0
    meta = {} if started is None else {STARTED: started}
    decision = _decide(rule, method=method, key=key, attempt=attempt, max_retries=max_retries, strategy=strategy,
                       previous=previous, meta=meta, deadline=deadline, now=now, rng=random.Random(seed))
    if not decision.retry:
        assert decision.wait == 0.0
        return
    assert method_allowed(rule, method, key, GET_HEAD)
    assert attempt <= max_retries
    low, high = Backoff(strategy, 1.0, 30.0).bounds(attempt, previous)
    assert low <= decision.wait <= high
    if started is not None and not math.isinf(deadline):
        assert now + decision.wait - started <= deadline


@given(
    strategy=st.sampled_from(sorted(STRATEGIES)),
    attempt=st.integers(1, 2000),
    base=st.floats(0.01, 10),
    extra=st.floats(0, 100),
    previous=st.one_of(st.none(), st.floats(0, 1000)),
    seed=st.integers(0, 2**32),
)
def test_every_strategy_draws_inside_its_bounds(strategy, attempt, base, extra, previous, seed):
    backoff = Backoff(strategy, base, base + extra)
    low, high = backoff.bounds(attempt, previous)
    assert 0.0 <= low <= high <= backoff.cap
    assert low <= backoff.wait(attempt, previous, random.Random(seed)) <= high


# --------------------------------------------------------------------------
# deadline arithmetic and meta
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "default", "expected"),
    [
        ({}, math.inf, math.inf),
        ({}, 5.0, 5.0),
        ({DEADLINE: 3}, math.inf, 3.0),
        ({DEADLINE: "2.5"}, math.inf, 2.5),
        ({DEADLINE: None}, 5.0, 5.0),
        # A bad meta value never crashes the crawl: the setting applies.
        ({DEADLINE: "soon"}, 5.0, 5.0),
        ({DEADLINE: -1}, 5.0, 5.0),
        ({DEADLINE: 0}, 5.0, 5.0),
        ({DEADLINE: float("nan")}, 5.0, 5.0),
        ({DEADLINE: True}, 5.0, 5.0),
        ({DEADLINE: [1]}, 5.0, 5.0),
    ],
)
def test_deadline_of(meta, default, expected):
    assert deadline_of(meta, default) == expected


@pytest.mark.parametrize(
    ("meta", "now", "wait", "late"),
    [
        ({STARTED: 0.0}, 5.0, 4.0, False),
        ({STARTED: 0.0}, 5.0, 5.0, False),
        ({STARTED: 0.0}, 5.0, 5.01, True),
        ({STARTED: 0.0}, 11.0, 0.0, True),
        ({}, 1e9, 1e9, False),  # never stamped: no deadline to measure from
        ({STARTED: "yesterday"}, 1e9, 1e9, False),
    ],
)
def test_past_deadline(meta, now, wait, late):
    assert (past_deadline(meta, 10.0, now, wait) is not None) is late


def test_past_deadline_says_why():
    assert past_deadline({STARTED: 0.0}, 10.0, 8.0, 3.0) == (
        "a retry in 3.00s would end 11.00s after the first attempt, past the 10s deadline"
    )


def test_the_first_attempt_is_stamped_once_and_only_where_a_deadline_applies():
    clock = iter([10.0, 20.0])
    meta: dict = {}
    stamp_first_attempt(meta, lambda: next(clock), deadlines=False)
    assert meta == {}
    stamp_first_attempt(meta, lambda: next(clock), deadlines=True)
    stamp_first_attempt(meta, lambda: next(clock), deadlines=True)
    assert meta == {STARTED: 10.0}
    meta = {DEADLINE: 3}
    stamp_first_attempt(meta, lambda: 7.0, deadlines=False)
    assert meta[STARTED] == 7.0


# --------------------------------------------------------------------------
# a burst of connection failures
# --------------------------------------------------------------------------


def test_consecutive_failures_count_per_slot_until_the_host_answers():
    down = ConsecutiveFailures()
    assert not down
    assert [down.failed("a", 1.0) for _ in range(3)] == [1, 2, 3]
    assert down.failed("b", 2.0) == 1
    down.reached("a")
    assert "a" not in down and "b" in down
    assert down.failed("a", 3.0) == 1
    down.reached("a")
    down.reached("b")
    down.reached("never seen")
    assert not down


def test_consecutive_failures_forget_streaks_whose_last_failure_is_old():
    down = ConsecutiveFailures()
    down.failed("old", 1.0)
    down.failed("new", 1.0)
    down.failed("new", 5.0)
    assert down.prune(before=2.0) == 1
    assert "old" not in down and "new" in down
    assert down.failed("new", 6.0) == 3


@pytest.mark.parametrize(
    "count, threshold, expected",
    [(1, 3, None), (2, 3, None), (3, 3, 1.0), (4, 3, 2.0), (5, 3, 4.0), (1, 1, 1.0), (10, 3, 8.0)],
)
def test_a_host_is_down_from_the_threshold_on_and_its_pause_grows_with_the_streak(count, threshold, expected):
    from scrapy_retryafter.backoff import Backoff
    from scrapy_retryafter.failures import host_down_wait

    class Top:
        def uniform(self, a: float, b: float) -> float:
            return b

    assert host_down_wait(count, threshold, Backoff("full", 1.0, 8.0), Top()) == expected


def test_a_throttle_without_retry_after_grows_decorrelated_jitter_from_its_last_wait():
    from scrapy_retryafter.policy import SlotPolicy, decide

    policy = SlotPolicy(backoff_strategy="decorrelated", backoff_base=1.0, backoff_max=60.0)

    class Top:
        def uniform(self, a, b):
            return b

    waits = []
    previous = None
    for throttles in (1, 2, 3):
        decision = decide(policy, status=429, method="GET", has_idempotency_key=False, throttles=throttles,
                          retry_after=None, rng=Top(), previous_wait=previous)
        previous = decision.cooldown
        waits.append(decision.cooldown)
    assert waits == [3.0, 9.0, 27.0]
