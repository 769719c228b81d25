"""The quota as a budget: a pure rule, table tests and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.budget import RESERVE, Spend, reserve_of, spend


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        # The case: 60 left for 50 minutes, 8 wanted: send them now, not one per 50 s.
        ((60, 3000.0, 0), {"quota": 60, "wanted": 8}, Spend(None)),
        # GitHub, 5000 an hour, a crawl of 100 unpaced: 4,999 left is well above 100.
        ((4999, 3599.0, 7), {"quota": 5000, "wanted": 93}, Spend(None)),
        # A learned pace of 20/s over 10 s needs 200; 500 left: own pace.
        ((500, 10.0, 3), {"quota": 500, "own_pace": 20.0}, Spend(None)),
        # Unknown demand and unpaced: the window needs everything; spread what is left after wire and reserve.
        ((500, 60.0, 0), {"quota": 500}, Spend((500 - 10) / 60.0)),
        # Would run out: 120 left (110 after the reserve of 1 and 9 on the wire), 300 wanted, 30 s.
        ((120, 30.0, 9), {"wanted": 300}, Spend(110 / 30.0)),
        # A slow own pace needs little: 2/s for 30 s is 60 of the 119 left.
        ((120, 30.0, 0), {"wanted": 10_000, "own_pace": 2.0}, Spend(None)),
        # The quota's pace never runs faster than the slot's own pace.
        ((2, 1.6, 1), {"quota": 20, "sustained": 19.0, "own_pace": 10.0}, Spend(10.0)),
        # Nothing left after the requests on the wire: hold until the reset.
        ((3, 12.5, 3), {"quota": 500}, Spend(None, wait=12.5)),
        ((0, 40.0, 0), {}, Spend(None, wait=40.0)),
        # Only the reserve left (10 of 500): hold, unless a sustained pace is known.
        ((10, 5.0, 0), {"quota": 500}, Spend(None, wait=5.0)),
        # A moving window read at a steady pace: "2 left, the oldest leaves in 1.6 s". Keep the quota's pace.
        ((2, 1.6, 1), {"quota": 20, "sustained": 19.0}, Spend(19.0)),
        # The window resets now: nothing to spread.
        ((5, 0.0, 0), {}, Spend(None)),
    ],
)
def test_the_quota_is_spent_as_a_budget(args, kwargs, expected):
    got = spend(*args, **kwargs)
    assert got.wait == pytest.approx(expected.wait)
    assert got.pace == (None if expected.pace is None else pytest.approx(expected.pace))


@pytest.mark.parametrize(("quota", "reserve"), [(None, RESERVE), (20, 1), (60, 1), (500, 10), (5000, 100), (math.inf, RESERVE)])
def test_the_reserve_is_small(quota, reserve):
    assert reserve_of(quota) == reserve


@pytest.mark.parametrize("bad", [math.nan, math.inf, -5.0])
def test_hostile_numbers_never_crash_nor_speed_up(bad):
    for got in (spend(bad, 10.0, 0), spend(10.0, bad, 0), spend(10, 10.0, 0, own_pace=bad, sustained=bad)):
        assert got.pace is None or (math.isfinite(got.pace) and got.pace >= 0)
        assert math.isfinite(got.wait) and got.wait >= 0


@given(
    remaining=st.integers(0, 10_000),
    reset=st.floats(0.01, 7 * 86400),
    wire=st.integers(0, 64),
    quota=st.one_of(st.none(), st.integers(1, 10_000)),
    wanted=st.one_of(st.none(), st.integers(0, 10**6)),
    own=st.one_of(st.none(), st.floats(0.001, 1e5)),
)
def test_what_is_sent_before_the_reset_never_exceeds_what_is_left(remaining, reset, wire, quota, wanted, own):
    got = spend(remaining, reset, wire, quota=quota, wanted=wanted, own_pace=own)
    if got.wait:
        assert got.wait == pytest.approx(reset)
        return
    left = remaining - wire
    assert left > 0
    if got.pace is None:
        # Own pace: what the slot sends before the reset fits in what is left.
        sends = min(wanted if wanted is not None else math.inf, own * reset if own else math.inf)
        assert sends <= left - reserve_of(quota)
    else:
        assert got.pace * reset <= max(0, left - reserve_of(quota)) + 1e-6
