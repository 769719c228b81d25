"""Rate-limit header dialects, table-driven, with the wall clock passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy.http import Headers

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.quota import QuotaWindows
from scrapy_retryafter.ratelimit import RateLimitFacts, parse_ratelimit, parse_retry_after_ms
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


WEEK = 7 * 86400.0


@pytest.mark.parametrize(
    "headers, window, reset, remaining, quota",
    [
        # the decades-long stall: a window of a billion seconds is read as a week
        ({"RateLimit_Policy": '"d";q=1;w=1000000000'}, WEEK, None, None, 1),
        ({"RateLimit_Policy": '"d";q=1;w=' + "9" * 400}, WEEK, None, None, 1),  # inf as digits
        ({"RateLimit_Policy": '"d";q=' + "9" * 400 + ";w=1"}, 1.0, None, None, 1e9),
        ({"RateLimit_Policy": '"d";q=1;w=0.0000001'}, 0.001, None, None, 1),
        ({"RateLimit_Policy": '"d";q=5;w=0'}, None, None, None, None),  # no window: no pace
        ({"RateLimit": '"d";r=0;t=1000000000'}, None, WEEK, 0, None),
        ({"RateLimit": '"d";r=' + "9" * 400 + ";t=1"}, None, 1.0, 1e9, None),
        ({"RateLimit": '"d";r=0;t=0.0000000001'}, None, 0.001, 0, None),
        ({"RateLimit_Limit": "10, 10;w=99999999999", "RateLimit_Remaining": "1"}, WEEK, None, 1, 10),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset_After": "99999999999"}, None, WEEK, 0, None),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": str(int(NOW + 0.0001))}, None, 0.0, 0, None),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": "1" + "0" * 300}, None, "invalid", None, None),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": str(int(NOW + 8 * 86400))}, None, "invalid", None, None),
    ],
)
def test_every_number_is_bounded(headers, window, reset, remaining, quota):
    got = facts(**headers)
    assert got is not None
    if reset == "invalid":
        assert got.invalid
        return
    assert not got.invalid
    assert got.window == window
    assert got.reset == reset
    assert got.remaining == remaining
    assert got.quota == quota


@pytest.mark.parametrize(
    "headers",
    [
        {"RateLimit_Policy": '"d";q=1;w=1e300'},  # no exponents in a structured field
        {"RateLimit_Policy": '"d";q=1;w=-5'},
        {"RateLimit_Policy": '"d";q=1;w=inf'},
        {"RateLimit_Policy": '"d";q=nan;w=1'},
        {"RateLimit_Policy": '"d";q=0x10;w=1'},
        {"RateLimit_Policy": '"d";q=+5;w=1'},
        {"RateLimit_Policy": '"d";q=5.;w=1'},
        {"RateLimit_Policy": '"d";q=.5;w=1'},
        {"RateLimit_Policy": '"d";q=\u0663;w=1'},
        {"RateLimit": '"d";r=1e309;t=1'},
        {"X_RateLimit_Remaining": "1\x00"},
        {"X_RateLimit_Remaining": "5" * 10_000},  # 10 KB
        {"X_RateLimit_Limit": "60", "X_RateLimit_Remaining": "-1", "X_RateLimit_Reset": "5"},
    ],
)
def test_hostile_numbers_are_invalid_not_trusted(headers):
    got = parse_ratelimit(Headers({k.replace("_", "-"): v.encode("utf-8") for k, v in headers.items()}).get, NOW)
    assert got is not None and got.invalid


@pytest.mark.parametrize(
    "quota, window",
    [(1, 86400), (1, WEEK), (60, 3600), (5000, 3600), (1_000_000, 1), (10**9, 0.001), (1, 10**9)],
)
def test_quotas_from_one_a_day_to_a_million_a_second_have_a_finite_pace(quota, window):
    got = facts(RateLimit_Policy=f'"d";q={quota};w={window}')
    assert got is not None and got.rate is not None
    assert 0 < got.rate <= 1e6
    assert 1 / got.rate < float("inf")


def test_retry_after_ms_is_bounded():
    assert parse_retry_after_ms(Headers({"Retry-After-Ms": "9" * 400}).get) == WEEK
    assert parse_retry_after_ms(Headers({"Retry-After-Ms": "-5"}).get) is None
    assert parse_retry_after_ms(Headers({"Retry-After-Ms": "1e309"}).get) is None


def test_a_window_learned_from_far_apart_resets_is_at_most_a_week():
    windows = QuotaWindows()
    windows.window("a", NOW - 30 * 86400, NOW)
    assert windows.window("a", NOW + 86400, NOW) == WEEK


_NAMES = [
    "RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
    "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Reset-After",
    "Retry-After-Ms", "X-Ms-Retry-After-Ms",
]
_NUMBERS = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.floats().map(repr),
    st.floats(min_value=0, allow_infinity=False).map(lambda f: f"{f:.12f}"),
    st.integers(min_value=0, max_value=10**14).map(lambda n: str(n + int(NOW) * (n % 2))),
)
_VALUES = st.one_of(
    _NUMBERS,
    st.text(max_size=80),
    st.tuples(st.sampled_from(["q", "w", "r", "t"]), _NUMBERS, st.sampled_from(["q", "w", "r", "t"]), _NUMBERS).map(
        lambda t: f'"p";{t[0]}={t[1]};{t[2]}={t[3]}'
    ),
    st.tuples(_NUMBERS, _NUMBERS).map(lambda t: f"{t[0]}, {t[0]};w={t[1]}"),
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(_NAMES), _VALUES), st.floats(min_value=0, max_value=4e9))
def test_any_headers_give_bounded_facts(headers, now):
    raw = {name: value.encode("utf-8", "surrogatepass") for name, value in headers.items()}
    got = parse_ratelimit(Headers(raw).get, now)
    ms = parse_retry_after_ms(Headers(raw).get)
    assert ms is None or 0 <= ms <= WEEK
    if got is None or got.invalid:
        return
    assert got.reset is None or (got.reset == 0 or 0.001 <= got.reset <= WEEK)
    assert got.window is None or 0.001 <= got.window <= WEEK
    assert got.quota is None or 0 <= got.quota <= 1e9
    assert got.remaining is None or 0 <= got.remaining <= 1e9
    assert got.rate is None or 0 < got.rate <= 1e6
    assert got.reset_at is None or got.reset_at - now <= WEEK
    if got.remaining is not None and got.reset:
        assert got.remaining / got.reset < float("inf")  # the spread the caller may compute
    windows = QuotaWindows()
    if got.reset_at is not None:
        for shift in (-(10**7), 0, 10**7):
            window = windows.window("s", got.reset_at + shift, now)
            assert window is None or 0 < window <= WEEK
