"""The circuit breaker as a state machine, the time passed in."""

from __future__ import annotations

from scrapy_retryafter.breaker import CLOSED, HALF_OPEN, OPEN, Breaker


def test_opens_after_threshold_consecutive_counted_throttles():
    breaker = Breaker()
    assert [breaker.throttled(float(t), True, 3, 10.0) for t in range(3)] == [False, False, True]
    assert breaker.state == OPEN
    assert breaker.ready_at(2.5) == 12.0


def test_throttles_that_do_not_count_never_open_it():
    breaker = Breaker()
    for t in range(100):
        assert breaker.throttled(float(t), False, 3, 10.0) is False
    assert breaker.state == CLOSED


def test_a_success_resets_the_count():
    breaker = Breaker()
    breaker.throttled(0.0, True, 3, 10.0)
    breaker.throttled(1.0, True, 3, 10.0)
    assert breaker.succeeded() is False
    assert breaker.throttled(2.0, True, 3, 10.0) is False


def test_half_open_lets_exactly_one_probe_then_closes_on_success():
    breaker = Breaker()
    for t in range(3):
        breaker.throttled(float(t), True, 3, 10.0)
    assert breaker.ready_at(12.0) == 0.0
    assert breaker.state == HALF_OPEN
    breaker.released(12.0)
    assert breaker.ready_at(12.1) > 12.1  # one probe out: nothing else leaves
    assert breaker.succeeded() is True
    assert breaker.state == CLOSED
    assert breaker.ready_at(12.2) == 0.0


def test_a_throttled_probe_opens_it_again():
    breaker = Breaker()
    for t in range(3):
        breaker.throttled(float(t), True, 3, 10.0)
    breaker.ready_at(12.0)
    breaker.released(12.0)
    assert breaker.throttled(12.5, False, 3, 10.0) is True  # a probe's answer counts whatever its timing
    assert breaker.state == OPEN
    assert breaker.ready_at(13.0) == 22.5


def test_a_probe_that_never_answers_is_replaced():
    breaker = Breaker()
    for t in range(3):
        breaker.throttled(float(t), True, 3, 10.0)
    breaker.ready_at(12.0)
    breaker.released(12.0, probe_timeout=5.0)
    assert breaker.ready_at(16.0) == 17.0
    assert breaker.ready_at(17.0) == 0.0


def test_the_retry_budget_refills_with_successes_gRPC_style():
    from scrapy_retryafter.board import CooldownBoard

    board = CooldownBoard(clock=lambda: 0.0)
    allowed = [board.spend_blind_retry("a", 10.0) for _ in range(6)]
    assert allowed == [True, True, True, True, False, False]  # 9, 8, 7, 6 > 5; then 5, 4
    for _ in range(20):  # ten successes pay for one failure: 4 + 2 tokens
        board.success("a", 0.1, 10.0)
    assert board.spend_blind_retry("a", 10.0) is False  # 6 - 1 = 5, not more than half
    for _ in range(20):
        board.success("a", 0.1, 10.0)
    assert board.spend_blind_retry("a", 10.0) is True  # 5 + 2 - 1 = 6


def test_force_open_holds_until_the_given_time_and_says_whether_it_was_closed() -> None:
    breaker = Breaker()
    assert breaker.force_open(50.0) is True
    assert breaker.ready_at(10.0) == 50.0
    assert breaker.force_open(60.0) is False
    assert breaker.ready_at(55.0) == 60.0
    assert breaker.ready_at(60.0) == 0.0  # half-open: one probe may go


def test_restore_keeps_the_streak_and_reopens_a_saved_open_circuit() -> None:
    breaker = Breaker()
    breaker.restore(3, None)
    assert breaker.state == CLOSED and breaker.consecutive == 3
    breaker.restore(0, 20.0)
    assert breaker.state == OPEN and breaker.ready_at(5.0) == 20.0
