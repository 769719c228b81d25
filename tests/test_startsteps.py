"""Which pace of slow start a refused request was sent at (startsteps), and the board cutting from it."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.startsteps import STEPS, sent_pace, stepped
from scrapy_retryafter.testing.clock import FakeClock


def steps_of(*pairs: tuple[float, float]) -> array[float]:
    steps = None
    for now, rate in pairs:
        steps = stepped(steps, now, rate)
    assert steps is not None
    return steps


@pytest.mark.parametrize(
    "sent_at, expected",
    [
        (0.5, (4.0, 0.0)),  # before the first kept step: at most its pace, nothing known before it
        (1.0, (4.0, 0.0)),
        (1.9, (4.0, 0.0)),
        (2.0, (8.0, 4.0)),
        (2.7, (8.0, 4.0)),
        (3.0, (12.0, 8.0)),
        (99.0, (12.0, 8.0)),  # after the last step: the pace in force now
    ],
)
def test_sent_pace_is_the_step_in_force_and_the_one_before(sent_at, expected):
    assert sent_pace(steps_of((1.0, 4.0), (2.0, 8.0), (3.0, 12.0)), sent_at) == expected


def test_no_steps_say_nothing():
    assert sent_pace(array("d"), 1.0) is None


def test_steps_are_bounded_and_the_oldest_go_first():
    steps = steps_of(*((float(k), float(k + 1)) for k in range(3 * STEPS)))
    assert len(steps) == 2 * STEPS
    assert sent_pace(steps, 0.0) == (float(2 * STEPS + 1), 0.0)  # older than any kept: the oldest kept pace


@given(st.lists(st.tuples(st.floats(0.0, 1e6), st.floats(0.01, 1e4)), min_size=1, max_size=40), st.floats(-1.0, 2e6))
def test_sent_pace_is_always_a_kept_step(pairs, sent_at):
    pairs.sort()
    steps = steps_of(*pairs)
    kept = pairs[-STEPS:]
    refused, passed = sent_pace(steps, sent_at) or (None, None)
    assert refused in [rate for _, rate in kept]
    assert passed == 0.0 or passed in [rate for _, rate in kept]
    later = [rate for when, rate in kept if when <= sent_at]
    assert refused == (later[-1] if later else kept[0][1])


def slow_start(board: CooldownBoard, clock: FakeClock) -> list[tuple[float, float]]:
    """A first throttle, its cooldown, then slow start's steps: (time, pace) after each success."""
    board.throttle("a", clock(), 1.0, learn=True, wake_jitter=0.0, circuit_threshold=99, circuit_open_seconds=1.0)
    clock.advance(1.0)
    paces = []
    for _ in range(12):
        clock.advance(0.05)
        board.succeeded("a")
        paces.append((clock(), board.rate("a") or 0.0))
    return paces


def throttle(board: CooldownBoard, sent_at: float) -> float | None:
    event = board.throttle("a", sent_at, 1.0, learn=True, wake_jitter=0.0, circuit_threshold=99, circuit_open_seconds=1.0)
    return event.rate_after


def test_a_throttle_a_round_trip_late_cuts_from_the_pace_its_request_went_at():
    clock = FakeClock()
    lagged = CooldownBoard(clock=clock)
    paces = slow_start(lagged, clock)
    (sent_at, at_send), (_, before) = paces[5], paces[4]
    assert before < at_send and paces[-1][1] > 1.5 * at_send  # slow start stepped on during the round trip
    cut = throttle(lagged, sent_at)

    clock = FakeClock()
    prompt = CooldownBoard(clock=clock)
    assert slow_start(prompt, clock)[5] == (sent_at, at_send)
    # The same steps, refused at once at the send: the cut a round trip late is the same one.
    clock = FakeClock()
    prompt = CooldownBoard(clock=clock)
    prompt.throttle("a", clock(), 1.0, learn=True, wake_jitter=0.0, circuit_threshold=99, circuit_open_seconds=1.0)
    clock.advance(1.0)
    for _ in range(6):
        clock.advance(0.05)
        prompt.succeeded("a")
    assert prompt.rate("a") == pytest.approx(at_send)
    assert cut is not None and cut == pytest.approx(throttle(prompt, clock()))
    assert cut < paces[-1][1] * 0.7  # under the cut from the pace in force when the 429 came back


def test_a_throttle_at_once_cuts_from_the_pace_in_force():
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    paces = slow_start(board, clock)
    (_, passed), (now, pace) = paces[-2], paces[-1]
    small_step = pace <= 1.2 * passed
    assert throttle(board, now) == pytest.approx(passed * 0.95 if small_step else max(pace * 0.7, passed * 0.95))


def test_steps_are_dropped_once_out_of_slow_start():
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    paces = slow_start(board, clock)
    throttle(board, paces[-1][0])
    clock.advance(2.0)
    for _ in range(3):
        clock.advance(0.1)
        board.succeeded("a")
    assert not board._slots["a"].pace.starting and board._slots["a"].steps is None


def test_a_slot_paced_by_a_stated_quota_keeps_no_steps():
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    board.announce("a", 10.0)
    for _ in range(5):
        clock.advance(0.1)
        board.succeeded("a")
    assert board._slots["a"].pace.starting and board._slots["a"].steps is None


def test_slow_start_restarted_after_an_adopted_cut_takes_none_of_the_earlier_steps():
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    slow_start(board, clock)
    state = board._slots["a"]
    state.pace.adopted(16.0, clock())  # another process's cut (the fleet): out of slow start, no success since
    clock.advance(12.0)
    board.succeeded("a")  # regrown far past the cut: slow start again
    assert state.pace.starting
    restarted = board.rate("a")
    assert state.steps is not None and list(state.steps)[1::2] == [restarted]
    clock.advance(0.3)
    # Sent before the restart's first step: cut from the restart's pace (pinned just under it, the
    # pace the restart let through), not from a step of the slow start before the adopted cut (19.5).
    assert throttle(board, clock() - 0.35) == pytest.approx(restarted * 0.95)
