"""CooldownBoard with an injected clock and random source (no real sleeps)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_retryafter.board import CooldownBoard, next_release
from scrapy_retryafter.testing.clock import FakeClock


class FakeRng:
    """random() and uniform() answering fixed fractions."""

    def __init__(self, fraction: float = 0.5) -> None:
        self.fraction = fraction
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return self.fraction

    def uniform(self, a: float, b: float) -> float:
        self.draws += 1
        return a + (b - a) * self.fraction


@pytest.fixture
def board(clock: FakeClock) -> CooldownBoard:
    return CooldownBoard(clock=clock, rng=FakeRng())


# --------------------------------------------------------------------------
# cool(): the largest wait wins
# --------------------------------------------------------------------------


def test_unknown_slot(board):
    assert len(board) == 0
    assert "a" not in board
    assert board.remaining("a") == 0.0
    assert board.refused("a") == 0.0
    assert board.ready_at("a") == 0.0
    board.released("a")  # no error, nothing remembered
    assert len(board) == 0


def test_cool_returns_added_seconds(board, clock):
    assert board.cool("a", 5.0) == 5.0
    assert "a" in board
    assert board.remaining("a") == 5.0


@pytest.mark.parametrize(
    ("first", "second", "added", "remaining"),
    [
        (5.0, 3.0, 0.0, 5.0),  # a shorter cool never shortens
        (5.0, 5.0, 0.0, 5.0),  # an equal one does not extend
        (5.0, 0.0, 0.0, 5.0),
        (5.0, -10.0, 0.0, 5.0),
        (5.0, 8.0, 3.0, 8.0),  # a longer one extends by the difference
        (5.0, 100.0, 95.0, 100.0),
    ],
)
def test_largest_wins(board, first, second, added, remaining):
    board.cool("a", first)
    assert board.cool("a", second) == added
    assert board.remaining("a") == remaining


def test_largest_wins_after_time_passes(board, clock):
    board.cool("a", 10.0)
    clock.advance(4.0)
    assert board.remaining("a") == 6.0
    assert board.cool("a", 5.0) == 0.0  # 5 from now ends before the 6 left
    assert board.remaining("a") == 6.0
    assert board.cool("a", 7.0) == 1.0
    assert board.remaining("a") == 7.0


def test_cool_after_expiry_adds_from_now(board, clock):
    board.cool("a", 2.0, wake_jitter=1.0)
    clock.advance(10.0)
    assert board.remaining("a") == 0.0
    assert board.cool("a", 3.0) == 3.0
    assert board.remaining("a") == 3.0


def test_shorter_cool_keeps_wake_window(board, clock):
    board.cool("a", 10.0, wake_jitter=5.0)
    board.cool("a", 2.0, wake_jitter=0.0)
    clock.advance(10.0)
    # still inside the original wake window [10, 15]: the slot is remembered
    clock.advance(4.9)
    board.ready_at("a")
    assert "a" in board


def test_slots_are_independent(board, clock):
    board.cool("a", 5.0)
    board.cool("b", 1.0)
    assert board.remaining("a") == 5.0
    assert board.remaining("b") == 1.0
    assert board.remaining("c") == 0.0
    assert sorted(board) == ["a", "b"]


def test_remaining_counts_down(board, clock):
    board.cool("a", 5.0, wake_jitter=2.0)
    for elapsed, left in [(1.0, 4.0), (2.5, 2.5), (5.0, 0.0), (6.0, 0.0), (100.0, 0.0)]:
        clock.now = 1000.0 + elapsed
        assert board.remaining("a") == left


# --------------------------------------------------------------------------
# ready_at(): cooldown, then releases spread over the wake window
# --------------------------------------------------------------------------


def test_ready_at_during_cooldown(board, clock):
    board.cool("a", 5.0, wake_jitter=1.0)
    until = clock.now + 5.0
    for t in (0.0, 1.0, 4.999):
        clock.now = 1000.0 + t
        assert board.ready_at("a", held=3) == until


def test_ready_at_zero_jitter_releases_at_end(board, clock):
    board.cool("a", 5.0)
    clock.advance(5.0)
    assert board.ready_at("a") == 0.0
    assert len(board) == 0


def test_ready_at_uses_rng_in_window(clock):
    rng = FakeRng(0.5)
    board = CooldownBoard(clock=clock, rng=rng)
    board.cool("a", 5.0, wake_jitter=2.0)
    until = clock.now + 5.0
    clock.now = until
    # one held request: released at start + (end - start) * u
    assert board.ready_at("a", held=1) == until + 1.0
    assert rng.draws == 1
    # asked again, it is the same time (no new draw)
    assert board.ready_at("a", held=1) == until + 1.0
    assert rng.draws == 1
    clock.now = until + 1.0
    assert board.ready_at("a", held=1) == 0.0


def _simulate(board: CooldownBoard, clock: FakeClock, slot: str, held: int) -> list[float]:
    """Release ``held`` requests of ``slot`` as the scheduler would; return the release times."""
    releases: list[float] = []
    for _ in range(10 * held + 10):
        if len(releases) == held:
            break
        at = board.ready_at(slot, held=held - len(releases))
        if at == 0.0:
            releases.append(clock.now)
            board.released(slot)
        else:
            assert at > clock.now, "ready_at must answer a time in the future or 0.0"
            clock.now = at
    assert len(releases) == held
    return releases


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("held", [1, 2, 5, 50, 500])
@pytest.mark.parametrize("jitter", [0.001, 1.0, 30.0])
def test_releases_spread_over_wake_window(seed, held, jitter):
    clock = FakeClock(12345.0)
    board = CooldownBoard(clock=clock, rng=random.Random(seed))
    board.cool("a", 5.0, wake_jitter=jitter)
    until = clock.now + 5.0
    end = until + jitter
    # the scheduler first polls during the cooldown
    assert board.ready_at("a", held=held) == until
    clock.now = until
    releases = _simulate(board, clock, "a", held)
    assert all(until <= t <= end for t in releases), (until, end, releases)
    assert releases == sorted(releases)
    # after the window the slot is free and forgotten
    clock.now = end
    assert board.ready_at("a") == 0.0
    assert len(board) == 0


def test_releases_are_actually_spread():
    clock = FakeClock(0.0)
    board = CooldownBoard(clock=clock, rng=random.Random(7))
    board.cool("a", 10.0, wake_jitter=10.0)
    clock.now = 10.0
    releases = _simulate(board, clock, "a", 1000)
    # not all at once: the releases cover most of the window, roughly uniformly
    assert releases[-1] - releases[0] > 9.0
    first_half = sum(1 for t in releases if t < 15.0)
    assert 400 < first_half < 600


def test_first_poll_late_in_window(board, clock):
    board.cool("a", 5.0, wake_jitter=10.0)
    until = clock.now + 5.0
    clock.now = until + 9.0
    releases = _simulate(board, clock, "a", 3)
    assert all(until <= t <= until + 10.0 for t in releases)
    assert releases == sorted(releases)


def test_window_forgets_slot(board, clock):
    board.cool("a", 5.0, wake_jitter=1.0)
    clock.advance(5.5)
    assert "a" in board
    clock.advance(0.5)
    assert board.ready_at("a") == 0.0
    assert "a" not in board
    assert len(board) == 0


def test_released_all_then_free_inside_window(board, clock):
    board.cool("a", 5.0, wake_jitter=10.0)
    clock.advance(5.0)
    releases = _simulate(board, clock, "a", 2)
    assert len(releases) == 2
    # the announced held requests have left: later ones go at once
    assert board.ready_at("a") == 0.0


# --------------------------------------------------------------------------
# refuse()/refused()
# --------------------------------------------------------------------------


def test_refuse(board, clock):
    board.refuse("a", 400.0)
    assert board.refused("a") == 400.0
    clock.advance(100.0)
    assert board.refused("a") == 300.0
    board.refuse("a", 10.0)  # a shorter refusal never shortens
    assert board.refused("a") == 300.0
    board.refuse("a", 1000.0)
    assert board.refused("a") == 1000.0
    # a refused slot is not cooling
    assert board.remaining("a") == 0.0
    assert board.ready_at("a") == 0.0
    assert "a" in board  # still remembered while refused
    clock.advance(1000.0)
    assert board.refused("a") == 0.0
    assert board.ready_at("a") == 0.0
    assert "a" not in board


def test_refuse_forever(board, clock):
    board.refuse("a", math.inf)
    clock.advance(1e9)
    assert board.refused("a") == math.inf
    assert board.sweep() == 0
    assert "a" in board


def test_refuse_and_cool_are_independent(board, clock):
    board.cool("a", 5.0)
    board.refuse("a", 50.0)
    assert board.remaining("a") == 5.0
    assert board.refused("a") == 50.0
    clock.advance(10.0)
    assert board.sweep() == 0
    assert board.ready_at("a") == 0.0
    assert "a" in board
    clock.advance(40.0)
    assert board.sweep() == 1
    assert len(board) == 0


# --------------------------------------------------------------------------
# sweep()
# --------------------------------------------------------------------------


def test_sweep_drops_success_meters_idle_for_ten_seconds(board, clock):
    board.succeeded("quiet")
    for _ in range(40):
        board.succeeded("busy")
        clock.advance(0.3)
    assert board.kept_slots() == {"busy", "quiet"} and board.kept()["meters"] == 2
    board.sweep()
    assert board.kept_slots() == {"busy"}
    clock.advance(9.0)
    board.sweep()
    assert board.kept_slots() == {"busy"}
    clock.advance(2.0)
    board.sweep()
    assert board.kept_slots() == set()


def test_sweep_forgets_failure_streaks_and_quota_windows_once_idle_past_the_memory(board, clock):
    assert [board.connection_failed("down") for _ in range(3)] == [1, 2, 3]
    assert board.quota_window("quota", 2000.0) is None
    clock.advance(board.pace_memory + 1)
    assert board.quota_window("quota", 2001.0) == 1.0  # seen again: kept
    board.sweep()
    assert board.kept() == {"slots": 0, "meters": 0, "streaks": 0, "quota_windows": 1, "pauses": 0}
    assert board.connection_failed("down") == 1  # a streak older than the memory is not an outage any more
    clock.advance(board.pace_memory + 1)
    board.sweep()
    assert board.kept_slots() == set()


def test_a_slot_throttled_once_and_never_again_is_forgotten_after_the_memory(board, clock):
    board.throttle("once", clock(), 1.0, learn=False, wake_jitter=0.0, circuit_threshold=5, circuit_open_seconds=60.0)
    clock.advance(board.pace_memory)
    board.sweep()
    assert "once" in board  # its breaker counts one throttle: remembered for a while
    clock.advance(2.0)
    board.sweep()
    assert "once" not in board


# --------------------------------------------------------------------------
# throttle(): one throttle event, in the board's order
# --------------------------------------------------------------------------


def test_a_throttle_cuts_the_pace_and_counts_for_the_breaker_before_it_cools(board, clock):
    board.announce("a", 10.0)
    event = board.throttle("a", clock(), 2.0, learn=True, wake_jitter=0.0, circuit_threshold=1, circuit_open_seconds=30.0)
    # Cooling first would make the throttle look like one answered during its own cooldown: no cut, no count.
    assert event.rate_before == 10.0 and event.rate_after is not None and event.rate_after < 10.0
    assert event.opened and event.added == 2.0
    assert board.breaker_state("a") == "open"


def test_throttles_of_requests_sent_before_the_cooldown_belong_to_its_event(board, clock):
    sent = clock()
    board.announce("a", 10.0)
    first = board.throttle("a", sent, 2.0, learn=True, wake_jitter=0.0, circuit_threshold=2, circuit_open_seconds=30.0)
    clock.advance(0.1)
    second = board.throttle("a", sent, 2.0, learn=True, wake_jitter=0.0, circuit_threshold=2, circuit_open_seconds=30.0)
    assert first.rate_after is not None and second.rate_after is None  # one cut per event
    assert not second.opened  # the breaker counted one throttle, not two
    assert second.added == pytest.approx(0.1)  # the largest wait wins


def test_a_throttle_over_the_cap_refuses_the_slot(board, clock):
    board.throttle("a", clock(), 5.0, learn=False, wake_jitter=0.0, circuit_threshold=9, circuit_open_seconds=1.0, refuse=600.0)
    assert board.refused("a") == 600.0
    assert board.rate("a") is None


def test_sweep_drops_expired_keeps_live(board, clock):
    board.cool("short", 1.0)
    board.cool("jitter", 1.0, wake_jitter=5.0)
    board.cool("long", 100.0)
    board.refuse("refused", 50.0)
    assert board.sweep() == 0
    clock.advance(2.0)
    assert board.sweep() == 1
    assert sorted(board) == ["jitter", "long", "refused"]
    clock.advance(5.0)
    assert board.sweep() == 1
    assert sorted(board) == ["long", "refused"]
    clock.advance(50.0)
    assert board.sweep() == 1
    assert list(board) == ["long"]
    assert board.remaining("long") == 43.0
    clock.advance(43.0)
    assert board.sweep() == 1
    assert len(board) == 0


def test_many_slots_are_forgotten(board, clock):
    for i in range(10_000):
        board.cool(f"host{i}.example", 1.0)
    assert len(board) == 10_000
    clock.advance(0.5)
    assert board.sweep() == 0
    assert len(board) == 10_000
    clock.advance(0.5)
    assert board.sweep() == 10_000
    assert len(board) == 0


def test_iteration_is_a_snapshot(board, clock):
    board.cool("a", 1.0)
    board.cool("b", 1.0)
    clock.advance(1.0)
    for slot in board:  # the board may change while iterated
        board.ready_at(slot)
    assert len(board) == 0


# --------------------------------------------------------------------------
# next_release()
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "left", "u", "expected"),
    [
        (10.0, 20.0, 1, 0.0, 10.0),
        (10.0, 20.0, 1, 0.5, 15.0),
        (10.0, 20.0, 0, 0.25, 12.5),
        (10.0, 20.0, 2, 0.0, 10.0),
        (10.0, 20.0, 2, 0.75, 15.0),  # 1 - (1 - 0.75) ** 0.5 = 0.5
        (5.0, 5.0, 3, 0.9, 5.0),
    ],
)
def test_next_release_values(start, end, left, u, expected):
    assert next_release(start, end, left, u) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=500, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=1e9),
    st.floats(min_value=0.0, max_value=3600.0),
    st.integers(min_value=-1, max_value=10**6),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_next_release_within_window(start, width, left, u):
    end = start + width
    t = next_release(start, end, left, u)
    assert start <= t <= end


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=1e6),
    st.floats(min_value=0.0, max_value=100.0),
    st.integers(min_value=1, max_value=1000),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_next_release_monotone_in_u(start, width, left, u1, u2):
    end = start + width
    lo, hi = sorted((u1, u2))
    assert next_release(start, end, left, lo) <= next_release(start, end, left, hi)


def test_holds_none_is_true_exactly_while_no_slot_is_in_the_board(board, clock):
    """The middleware skips computing a request's slot on it: it must agree with ``in``."""
    assert board.holds_none() and "a.example" not in board
    board.cool("a.example", 2.0)
    assert not board.holds_none() and "a.example" in board
    clock.now += 3
    board.sweep()
    assert board.holds_none() and "a.example" not in board
