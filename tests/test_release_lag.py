"""A learned pace makes up only the lag every release pays (board._lag_credit).

A limiter without burst (nginx ``limit_req``) refuses one gap shorter than its
interval, so the credit must never let a run of releases outpace the pace;
but the wake timer's margin and the engine's loop made every gap 2-3 ms long
(4 % at 20 requests/s) when nothing was made up.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.board import LAG_DRIFT, LATE_CREDIT, CooldownBoard
from scrapy_retryafter.testing.clock import FakeClock


def _paced(rate: float) -> tuple[CooldownBoard, FakeClock]:
    clock = FakeClock(100.0)
    board = CooldownBoard(clock=clock)
    board.throttled("a", sent_at=clock.now)
    board._slots["a"].pace.starting = False
    board._slots["a"].pace.rate = rate
    board._slots["a"].cooldown_until = 0.0
    return board, clock


def _release_with_lags(board: CooldownBoard, clock: FakeClock, lags: list[float]) -> list[float]:
    """Release once at once, then each next request ``lag`` after the board's ready time."""
    board.released("a")
    times = [clock.now]
    for lag in lags:
        clock.now = max(clock.now, board.ready_at("a")) + lag
        board.released("a")
        times.append(clock.now)
    return times


@pytest.mark.parametrize(
    ("lags", "gaps"),
    [
        # the first late release sets the lag: its successor leaves one interval after it
        ([0.003, 0.003, 0.003], [0.103, 0.1, 0.1]),
        # a smaller lag lowers it at once: the gap after a 1 ms lag is 1 ms short of nothing
        ([0.003, 0.001, 0.003], [0.103, 0.098, 0.102]),
        # a larger one raises it by LAG_DRIFT only
        ([0.001, 0.005, 0.005], [0.101, 0.104, 0.1 + 0.005 - (0.001 + LAG_DRIFT)]),
        # a release a whole interval late (the slot sat idle) says nothing of the lag
        ([0.003, 0.5, 0.003], [0.103, 0.5 + 0.1 - 0.003, 0.103]),
        # made up by a tenth of the interval at most
        ([0.05, 0.05], [0.15, 0.1 + 0.05 - 0.1 * LATE_CREDIT]),
    ],
)
def test_gaps_after_lagging_releases(lags, gaps):
    board, clock = _paced(10.0)
    times = _release_with_lags(board, clock, lags)
    assert [b - a for a, b in zip(times, times[1:])] == pytest.approx(gaps)


def test_without_lag_the_gaps_are_the_interval():
    board, clock = _paced(20.0)
    times = _release_with_lags(board, clock, [0.0] * 5)
    assert [b - a for a, b in zip(times, times[1:])] == pytest.approx([0.05] * 5)


@given(
    rate=st.floats(0.5, 200.0),
    lags=st.lists(st.floats(0.0, 0.2), min_size=1, max_size=60),
)
def test_no_run_of_releases_outpaces_the_pace_by_more_than_a_tenth_of_one_interval(rate, lags):
    board, clock = _paced(rate)
    times = _release_with_lags(board, clock, lags)
    interval = 1.0 / rate
    for first in range(len(times)):
        for last in range(first + 1, len(times)):
            assert times[last] - times[first] >= (last - first) * interval - LATE_CREDIT * interval - 1e-9


@given(lag=st.floats(0.0005, 0.004), count=st.integers(60, 200))
def test_a_steady_lag_is_made_up_and_the_pace_holds(lag, count):
    board, clock = _paced(20.0)
    times = _release_with_lags(board, clock, [lag] * count)
    assert (times[-1] - times[1]) / (count - 1) == pytest.approx(0.05)


def test_nan_or_backwards_clock_makes_up_nothing():
    board, clock = _paced(10.0)
    board.released("a")
    clock.now -= 5.0  # a clock that went back
    board.released("a")
    assert board.ready_at("a") == pytest.approx(clock.now + 0.1)
    board._slots["a"].next_paced = float("nan")
    board.released("a")
    assert board.ready_at("a") == pytest.approx(clock.now + 0.1)
