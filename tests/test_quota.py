"""quota.py: the pace and cooldown rate-limit headers call for, as a table; the learnt windows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.quota import QuotaDecision, QuotaWindows, decide_quota, wants_window
from scrapy_retryafter.ratelimit import RateLimitFacts
from scrapy_retryafter.testing.clock import FakeClock

NOW = 1_700_000_000.0
F = RateLimitFacts


@pytest.mark.parametrize(
    "facts, window, on_the_wire, max_delay, expected",
    [
        # pace from a stated quota and window: (q-1)/w
        (F(quota=20, window=1), None, 0, 300, QuotaDecision(19.0, 0.0)),
        (F(quota=100, window=60, remaining=50, reset=30), None, 0, 300, QuotaDecision(99 / 60, 0.0)),
        # a quota without a window: the learnt one, when known
        (F(quota=20, reset=0.5, reset_at=NOW + 1), 1.0, 0, 300, QuotaDecision(19.0, 0.0)),
        (F(quota=20, reset=0.5, reset_at=NOW + 1), None, 0, 300, QuotaDecision(None, 0.0)),
        # nothing stated but what is left: spread it until the reset
        (F(remaining=10, reset=5), None, 0, 300, QuotaDecision(2.0, 0.0)),
        (F(remaining=10, reset=0), None, 0, 300, QuotaDecision(None, 0.0)),
        (F(remaining=0, reset=5), None, 0, 300, QuotaDecision(None, 5.0)),
        # spent by the requests on the wire: cool until the reset
        (F(remaining=3, reset=5), None, 3, 300, QuotaDecision(0.6, 5.0)),
        (F(remaining=3, reset=5), None, 2, 300, QuotaDecision(0.6, 0.0)),
        (F(remaining=1, reset=2, quota=10, window=2), None, 1, 300, QuotaDecision(4.5, 2.0)),
        # no reset: nothing to cool for
        (F(remaining=0), None, 0, 300, QuotaDecision(None, 0.0)),
        (F(remaining=0, reset=0), None, 0, 300, QuotaDecision(None, 0.0)),
        # past the cap: skipped, never cooled for
        (F(remaining=0, reset=400), None, 0, 300, QuotaDecision(None, 0.0, past_cap=True)),
        (F(remaining=0, reset=300), None, 0, 300, QuotaDecision(None, 300.0)),
        # remaining unknown: only a pace
        (F(quota=60, window=60, reset=10), None, 5, 300, QuotaDecision(59 / 60, 0.0)),
    ],
)
def test_what_the_rate_limit_headers_call_for(facts, window, on_the_wire, max_delay, expected):
    decision = decide_quota(facts, window, on_the_wire, max_delay)
    assert decision.cooldown == expected.cooldown
    assert decision.past_cap is expected.past_cap
    assert decision.rate == (pytest.approx(expected.rate) if expected.rate is not None else None)


@pytest.mark.parametrize(
    "facts, wanted",
    [
        (F(quota=20, reset_at=NOW), True),
        (F(quota=20, window=1, reset_at=NOW), False),  # the window is stated
        (F(quota=20), False),  # a delta reset: no epoch to learn from
        (F(remaining=5, reset_at=NOW), False),  # no quota to pace from
    ],
)
def test_a_window_is_learnt_only_for_a_quota_stated_without_one(facts, wanted):
    assert wants_window(facts) is wanted


@given(
    remaining=st.one_of(st.none(), st.floats(0, 1e6)),
    reset=st.one_of(st.none(), st.floats(0, 1e6)),
    on_the_wire=st.integers(0, 100),
    max_delay=st.floats(0.1, 1e4),
)
def test_a_cooldown_never_passes_the_cap_and_comes_only_with_the_quota_spent(remaining, reset, on_the_wire, max_delay):
    decision = decide_quota(F(remaining=remaining, reset=reset), None, on_the_wire, max_delay)
    assert 0.0 <= decision.cooldown <= max_delay
    if decision.cooldown:
        # Cooling waits for the reset: the quota is spent, or what is left would pace slower than the cap.
        assert remaining is not None and decision.cooldown == reset
        assert remaining <= on_the_wire or (remaining - on_the_wire) / reset <= 1 / max_delay
    assert not (decision.cooldown and decision.past_cap)


def test_the_window_is_how_far_the_reset_epoch_moves_on():
    windows = QuotaWindows()
    assert windows.window("a", NOW + 1, 0.0) is None  # one window seen: its length is unknown
    assert windows.window("a", NOW + 1, 0.1) is None  # same window, any number of responses
    assert windows.window("a", NOW + 2, 1.0) == 1.0
    assert windows.window("a", NOW + 2, 1.1) == 1.0
    assert windows.window("a", NOW + 1, 1.2) == 1.0  # a late response of an older window changes nothing
    assert windows.window("a", NOW + 5, 4.0) == 3.0  # idle over two windows: slower for one window, never faster
    assert windows.window("a", NOW + 6, 5.0) == 1.0
    assert windows.window("b", NOW + 60, 5.0) is None  # per slot


def test_quota_windows_stay_bounded_between_sweeps_and_forget_idle_slots_at_one():
    windows = QuotaWindows(most=100)
    for i in range(1000):
        windows.window(f"host{i}", NOW, float(i))
    assert len(windows) <= 100
    assert windows.prune(before=950.0) == 50
    assert len(windows) == 50 and "host999" in windows and "host949" not in windows


@pytest.mark.parametrize(
    "facts, max_delay, expected",
    [
        # one left, reset an hour away: one request per 3600 s is a refusal until the reset, not a pace
        (RateLimitFacts(remaining=1, reset=3600.0), 300.0, QuotaDecision(None, 0.0, past_cap=True, refuse=3600.0)),
        # one left, reset in 301 s (the search's example)
        (RateLimitFacts(remaining=1, reset=301.0), 300.0, QuotaDecision(None, 0.0, past_cap=True, refuse=301.0)),
        # a stated quota of 1 per 600 s whose window resets within the cap: cooled until the reset
        (RateLimitFacts(remaining=1, reset=20.0, quota=2, window=600.0), 300.0, QuotaDecision(None, 20.0)),
        # a slow stated quota with no reset: paced at the cap, never slower
        (RateLimitFacts(quota=2, window=6000.0), 300.0, QuotaDecision(1 / 300.0, 0.0)),
        # exactly one request per cap is still a pace
        (RateLimitFacts(remaining=1, reset=300.0), 300.0, QuotaDecision(1 / 300.0, 0.0)),
    ],
)
def test_a_quota_slower_than_one_request_per_cap_is_a_refusal_until_its_reset(facts, max_delay, expected):
    assert decide_quota(facts, None, 0, max_delay) == expected


@given(
    remaining=st.integers(0, 10**6),
    reset=st.floats(0.001, 7 * 86400.0),
    quota=st.one_of(st.none(), st.integers(1, 10**6)),
    window=st.one_of(st.none(), st.floats(0.001, 7 * 86400.0)),
    max_delay=st.floats(1.0, 3600.0),
)
def test_a_pace_interval_is_never_longer_than_the_cap(remaining, reset, quota, window, max_delay):
    decision = decide_quota(RateLimitFacts(remaining=remaining, reset=reset, quota=quota, window=window), None, 0, max_delay)
    assert decision.rate is None or 1 / decision.rate <= max_delay * (1 + 1e-9)
    assert decision.cooldown <= max_delay


def test_a_window_whose_reset_moves_on_with_little_left_reads_as_moving():
    # Flask-Limiter's moving window at its limit: the reset is when the oldest hit
    # leaves, so it moves on every second while one or none is left.
    moving = QuotaWindows()
    for second, left in enumerate([19, 1, 0, 1, 0]):
        moving.window("m", NOW + 2 + second, float(second), remaining=left, quota=20)
    assert moving.moving("m")
    # A fixed window refills when its reset moves on.
    fixed = QuotaWindows()
    for second, left in enumerate([19, 18, 19, 17, 19]):
        fixed.window("f", NOW + 1 + second, float(second), remaining=left, quota=20)
    assert not fixed.moving("f")
    # Evidence is bounded: two refills make a moving window fixed again.
    for second in range(5, 7):
        moving.window("m", NOW + 2 + second, float(second), remaining=19, quota=20)
    assert not moving.moving("m")
    assert not moving.moving("unknown")


def test_none_left_on_a_moving_window_keeps_the_pace_instead_of_cooling_to_a_rounded_reset():
    facts = F(quota=20, remaining=1, reset=1.7, reset_at=NOW + 2)
    assert decide_quota(facts, 1.0, 1, 300) == QuotaDecision(19.0, 1.7)
    assert decide_quota(facts, 1.0, 1, 300, moving=True) == QuotaDecision(19.0, 0.0)
    # Without a learnt window there is no pace to keep: cool as before.
    assert decide_quota(F(remaining=0, reset=1.7), None, 0, 300, moving=True) == QuotaDecision(None, 1.7)


def flask_fixed_windows() -> QuotaWindows:
    """Flask-Limiter's fixed 20/second window, paced: it opens at its first hit and states
    its reset as int(end + 1), so the reset steps by 1 or 2 s while each window refills."""
    windows = QuotaWindows()
    opened = [0.3, 1.31, 2.32, 3.99, 5.0]  # each window's first hit, on the server's epoch clock less NOW
    for first in opened:
        stated = NOW + int(first + 1 + 1)
        windows.window("f", stated, first + 0.01, remaining=19, quota=20)  # its first answer
        windows.window("f", stated, first + 0.5, remaining=9, quota=20)
    return windows


def test_a_fixed_window_stated_in_rounded_seconds_is_its_shortest_step():
    windows = flask_fixed_windows()  # steps 1, 1, 1, 2: the 2 is the rounding
    assert not windows.moving("f")
    assert windows.window("f", NOW + 7, 5.5, remaining=5, quota=20) == 1.0
    assert windows.ends_in("f", 5.9) == pytest.approx(5.0 + 0.01 + 1.0 - 5.9)  # from its first answer


def test_how_long_a_window_lasts_is_unknown_before_it_reads_as_fixed():
    moving = QuotaWindows()
    for second, left in enumerate([19, 1, 0, 1, 0]):
        moving.window("m", NOW + 2 + second, float(second), remaining=left, quota=20)
    assert moving.ends_in("m", 5.0) is None
    first = QuotaWindows()
    first.window("a", NOW + 2, 0.0, remaining=19, quota=20)
    assert first.ends_in("a", 0.5) is None  # one window seen: its length is unknown
    assert first.ends_in("unknown", 0.5) is None
    fine = QuotaWindows()  # resets closer than whole seconds say no window length to trust
    for tenth in range(5):
        fine.window("t", NOW + 1 + tenth / 10, tenth / 10, remaining=19, quota=20)
    assert fine.ends_in("t", 0.5) is None


SPENT = F(quota=20, remaining=0, reset=1.7, reset_at=NOW + 2)


@pytest.mark.parametrize(
    "ends_in, expected",
    [
        (0.04, QuotaDecision(19.0, 0.04)),  # the window's last request: its end is near, not the stated reset
        (-0.1, QuotaDecision(19.0, 0.0)),  # already over: keep the pace
        (5.0, QuotaDecision(19.0, 1.7)),  # never past the stated reset
        (None, QuotaDecision(19.0, 1.7)),
        (float("nan"), QuotaDecision(19.0, 1.7)),
    ],
)
def test_a_spent_fixed_window_cools_until_it_ends_at_the_latest(ends_in, expected):
    assert decide_quota(SPENT, 1.0, 0, 300.0, ends_in=ends_in) == expected


def test_without_a_learnt_window_the_end_of_a_window_is_not_used():
    assert decide_quota(SPENT, None, 0, 300.0, ends_in=0.04) == QuotaDecision(None, 1.7)


def test_an_answer_sent_after_the_shortest_step_with_no_new_reset_disproves_it():
    # A 1.5 s window stated in whole seconds steps by 1 or 2: the shortest step, 1, is too short.
    windows = QuotaWindows()
    for first in (0.0, 1.5, 3.0, 4.5):
        windows.window("w", NOW + int(first + 1.5 + 1), first + 0.01, remaining=19, quota=20, sent_at=first)
    assert windows.ends_in("w", 4.6) == pytest.approx(4.51 + 1.0 - 4.6)  # steps 2, 1, 2: trusted so far
    # Sent 1.2 s into the window opened at 4.5, answered in it: the window lasts longer than 1 s.
    assert windows.window("w", NOW + 7, 5.71, remaining=0, quota=20, sent_at=5.7) == 2.0
    assert windows.ends_in("w", 5.71) is None
    windows.window("w", NOW + 8, 6.01, remaining=19, quota=20, sent_at=6.0)
    assert windows.ends_in("w", 6.1) is None  # for good


def test_a_window_that_grows_from_a_second_to_a_minute_is_caught_at_its_first_late_answer():
    windows = QuotaWindows()
    for first in range(4):
        windows.window("g", NOW + first + 2, first + 0.01, remaining=19, quota=20, sent_at=float(first))
    windows.window("g", NOW + 4 + 61, 4.01, remaining=199, quota=200, sent_at=4.0)  # now 200 per 60 s
    assert windows.ends_in("g", 4.5) == pytest.approx(0.51)
    windows.window("g", NOW + 4 + 61, 5.5, remaining=150, quota=200, sent_at=5.4)
    assert windows.ends_in("g", 5.5) is None
    assert windows.window("g", NOW + 4 + 61, 6.0, remaining=100, quota=200, sent_at=5.9) == 60.0  # the last step


def test_a_throttle_of_a_request_sent_after_the_shortest_step_disproves_it():
    windows = flask_fixed_windows()
    windows.throttled("f", sent_at=5.5)  # inside the window opened at 5.0: says nothing
    assert windows.ends_in("f", 5.9) is not None
    windows.throttled("f", sent_at=6.2)  # past its end by the shortest step, and still refused
    assert windows.ends_in("f", 6.3) is None
    windows.throttled("unknown", sent_at=1.0)
    assert "unknown" not in windows


def test_the_board_tells_the_quota_windows_of_every_throttle():
    board = CooldownBoard(clock=FakeClock())
    board.quota_windows = flask_fixed_windows()
    board.throttle("f", 6.2, 1.0, learn=False, wake_jitter=0.0, circuit_threshold=25, circuit_open_seconds=600.0)
    assert board.quota_windows.ends_in("f", 6.3) is None
