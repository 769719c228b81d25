"""Rate-limit header dialects, table-driven, with the wall clock passed in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scrapy.http import Headers

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.ratelimit import QuotaWindows, RateLimitFacts, parse_ratelimit, parse_retry_after_ms
from scrapy_retryafter.testing.clock import FakeClock

NOW = 1_800_000_000.0  # an epoch in 2027


def facts(**headers: str) -> RateLimitFacts | None:
    h = Headers({k.replace("_", "-"): v for k, v in headers.items()})
    return parse_ratelimit(h.get, NOW)


@pytest.mark.parametrize(
    "headers, remaining, reset, rate",
    [
        ({"RateLimit_Policy": '"default";q=100;w=60', "RateLimit": '"default";r=0;t=30'}, 0, 30, 99 / 60),
        ({"RateLimit": '"burst";r=5;t=1, "day";r=0;t=3600'}, 0, 3600, None),
        ({"RateLimit_Policy": '"burst";q=10;w=1, "day";q=1000;w=86400'}, None, None, 999 / 86400),
        ({"RateLimit_Limit": "100", "RateLimit_Remaining": "0", "RateLimit_Reset": "30"}, 0, 30, None),
        ({"RateLimit_Limit": "100, 100;w=60", "RateLimit_Remaining": "7", "RateLimit_Reset": "12"}, 7, 12, 99 / 60),
        ({"X_RateLimit_Limit": "60", "X_RateLimit_Remaining": "0", "X_RateLimit_Reset": "20"}, 0, 20, None),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": str(int(NOW + 45))}, 0, 45, None),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": str(int((NOW + 45) * 1000))}, 0, 45, None),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": str(int(NOW - 10))}, 0, 0, None),
        ({"X_RateLimit_Remaining": "3", "X_RateLimit_Reset_After": "1.5"}, 3, 1.5, None),
    ],
)
def test_dialects(headers, remaining, reset, rate):
    got = facts(**headers)
    assert got is not None and not got.invalid
    assert got.remaining == remaining
    assert got.reset == (pytest.approx(reset) if reset is not None else None)
    assert got.rate == (pytest.approx(rate) if rate is not None else None)


def test_no_rate_limit_headers_is_none():
    assert facts(Content_Type="text/html") is None


@pytest.mark.parametrize(
    "headers",
    [
        {"X_RateLimit_Remaining": "-1"},
        {"X_RateLimit_Remaining": "lots"},
        {"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": "99999999"},  # 3 years as a delta: nonsense
        {"RateLimit": '"default";r=x;t=30'},
        {"RateLimit_Remaining": "0", "RateLimit_Reset": "\u0663"},
    ],
)
def test_malformed_values_are_reported_not_trusted(headers):
    got = facts(**headers)
    assert got is not None and got.invalid


@given(st.dictionaries(
    st.sampled_from(["RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining",
                     "RateLimit-Reset", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                     "X-RateLimit-Reset-After"]),
    st.binary(max_size=40),
))
def test_never_raises_and_never_waits_beyond_a_week(headers):
    got = parse_ratelimit(Headers(headers).get, NOW)
    if got is not None and got.reset is not None:
        assert 0 <= got.reset <= 7 * 86400


@pytest.mark.parametrize(
    "headers, seconds",
    [({"Retry-After-Ms": "1500"}, 1.5), ({"X-Ms-Retry-After-Ms": "250"}, 0.25), ({"Retry-After-Ms": "soon"}, None), ({}, None)],
)
def test_retry_after_ms(headers, seconds):
    assert parse_retry_after_ms(Headers(headers).get) == seconds


@pytest.mark.parametrize(
    "names, speaks",
    [
        ([b"Content-Type", b"Date"], False),
        ([b"Ratelimit-Policy"], True),
        ([b"X-Ratelimit-Remaining", b"Date"], True),
        ([b"ratelimit"], True),
        ([b"Retry-After"], False),
    ],
)
def test_speaks_ratelimit_is_the_cheap_first_filter(names, speaks):
    from scrapy_retryafter.ratelimit import speaks_ratelimit

    assert speaks_ratelimit(names) is speaks


@pytest.mark.parametrize("quota, window, pace", [(20, 1, 19.0), (100, 60, 99 / 60), (2, 1, 1.0), (1, 1, 0.5)])
def test_the_pace_of_a_stated_quota(quota, window, pace):
    assert RateLimitFacts(quota=quota, window=window).rate == pytest.approx(pace)


@given(
    quota=st.integers(1, 120),
    window=st.sampled_from([1.0, 2.0, 10.0, 60.0]),
    phase=st.floats(0.0, 1.0),
    lateness=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=50),
)
def test_paced_releases_never_put_more_than_the_quota_into_a_window(quota, window, phase, lateness):
    """Fixed windows at any phase, releases as the board paces them, each late by any share of an interval."""
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    board.announce("a", RateLimitFacts(quota=quota, window=window).rate)
    interval = 1 / board.rate("a")
    start = clock.now + phase * window
    counts: dict[int, int] = {}
    clock.now = start
    for i in range(3 * quota + 5):
        clock.now = max(clock.now, board.ready_at("a")) + lateness[i % len(lateness)] * interval
        board.released("a")
        window_index = int((clock.now - start + 1e-9) // window)
        counts[window_index] = counts.get(window_index, 0) + 1
    assert max(counts.values()) <= quota


def test_an_epoch_reset_is_kept_as_the_epoch_a_delta_is_not():
    assert facts(X_RateLimit_Limit="20", X_RateLimit_Reset=str(int(NOW + 1))).reset_at == int(NOW + 1)
    assert facts(X_RateLimit_Limit="20", X_RateLimit_Reset=str(int((NOW + 1) * 1000))).reset_at == int(NOW + 1)
    assert facts(X_RateLimit_Limit="20", X_RateLimit_Reset="1").reset_at is None
    assert facts(X_RateLimit_Limit="20", X_RateLimit_Reset_After="0.75").reset_at is None


def test_the_window_is_how_far_the_reset_epoch_moves_on():
    windows = QuotaWindows()
    assert windows.window("a", NOW + 1) is None  # one window seen: its length is unknown
    assert windows.window("a", NOW + 1) is None  # same window, any number of responses
    assert windows.window("a", NOW + 2) == 1.0
    assert windows.window("a", NOW + 2) == 1.0
    assert windows.window("a", NOW + 1) == 1.0  # a late response of an older window changes nothing
    assert windows.window("a", NOW + 5) == 3.0  # idle over two windows: slower for one window, never faster
    assert windows.window("a", NOW + 6) == 1.0
    assert windows.window("b", NOW + 60) is None  # per slot


def test_quota_windows_stay_bounded_over_a_broad_crawl():
    windows = QuotaWindows(most=100)
    for i in range(1000):
        windows.window(f"host{i}", NOW)
    assert len(windows._seen) <= 100
