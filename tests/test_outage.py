"""When a lost Redis is tried again: pure, on an injected clock and randomness."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.redis.outage import BACKOFF_MAX, BACKOFF_MIN, Outage
from scrapy_retryafter.testing.clock import FakeClock


class Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.value


def test_up_is_tried_every_time_and_reports_nothing():
    outage = Outage(FakeClock(100.0), Fixed(0.5))
    assert outage.may_try()
    assert outage.succeeded() is None
    assert not outage.lost


@pytest.mark.parametrize(
    ("rng", "waits"),
    [
        # Full waits (random() -> 1): doubling from 0.25 s, capped at 5 s.
        (1.0, [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]),
        # The least jitter halves each wait.
        (0.0, [0.125, 0.25, 0.5, 1.0, 2.0, 2.5, 2.5]),
    ],
)
def test_each_failure_doubles_the_wait_before_the_next_attempt(rng, waits):
    clock = FakeClock(100.0)
    outage = Outage(clock, Fixed(rng))
    seen = []
    for attempt, wait in enumerate(waits):
        assert outage.failed() is (attempt == 0)  # reported once, on the first failure
        seen.append(outage.retry_at - clock.now)
        clock.now += wait - 0.001
        assert not outage.may_try()
        clock.now += 0.001
        assert outage.may_try()
    assert seen == pytest.approx(waits)


def test_back_reports_how_long_it_was_lost_once_and_starts_the_backoff_over():
    clock = FakeClock(100.0)
    outage = Outage(clock, Fixed(1.0))
    outage.failed()
    clock.now += 0.3
    outage.failed()
    clock.now += 0.6
    assert outage.succeeded() == pytest.approx(0.9)
    assert outage.succeeded() is None
    assert outage.failed() is True
    assert outage.retry_at - clock.now == pytest.approx(BACKOFF_MIN)


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=30))
def test_the_wait_stays_within_its_bounds_whatever_the_jitter(draws):
    clock = FakeClock(100.0)

    class Draws:
        def __init__(self) -> None:
            self.left = list(draws)

        def random(self) -> float:
            return self.left.pop(0) if self.left else 0.5

        def uniform(self, a: float, b: float) -> float:
            return a

    outage = Outage(clock, Draws())
    for _ in draws:
        outage.failed()
        wait = outage.retry_at - clock.now
        assert BACKOFF_MIN / 2 - 1e-9 <= wait <= BACKOFF_MAX + 1e-9  # retry_at - now rounds at the last bit
        clock.now = outage.retry_at
