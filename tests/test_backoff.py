"""Every backoff strategy stays within its bounds and never overflows."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_retryafter.backoff import STRATEGIES, Backoff, backoff


class EdgeRng:
    """uniform(a, b) answers a (low=True) or b (low=False)."""

    def __init__(self, low: bool) -> None:
        self.low = low

    def uniform(self, a: float, b: float) -> float:
        return a if self.low else b


def ceiling(attempt: int, base: float, cap: float) -> float:
    """min(cap, base * 2 ** (attempt - 1)), computed without overflow."""
    return min(cap, base * 2.0 ** min(attempt - 1, 1000))


def bounds(name: str, attempt: int, prev: float, base: float, cap: float) -> tuple[float, float]:
    """The documented [low, high] of one wait (from the strategies' definitions)."""
    c = ceiling(attempt, base, cap)
    if name == "none":
        return c, c
    if name == "full":
        return 0.0, c
    if name == "equal":
        return c / 2, c
    if name == "decorrelated":
        return min(base, cap), min(cap, 3 * max(base, prev))
    if name == "additive":
        return c, min(cap, c + base)
    raise AssertionError(f"no bounds known for strategy {name!r}")


def test_strategy_names():
    assert set(STRATEGIES) == {"none", "full", "equal", "decorrelated", "additive"}


PARAMS = [(1.0, 60.0), (0.5, 10.0), (2.0, 2.0), (0.1, 1000.0), (3.0, 7.5)]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize(("base", "cap"), PARAMS)
@pytest.mark.parametrize("seed", range(5))
def test_bounds_seeded(name, base, cap, seed):
    strategy = STRATEGIES[name]
    rng = random.Random(seed)
    prev = base
    for attempt in range(1, 21):
        for _ in range(20):
            low, high = bounds(name, attempt, prev, base, cap)
            wait = strategy(attempt, prev, base, cap, rng)
            assert isinstance(wait, float)
            assert low <= wait <= high, (name, attempt, prev, wait, low, high)
            assert 0.0 <= wait <= cap
        prev = wait


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize(("base", "cap"), PARAMS)
@pytest.mark.parametrize("low", [True, False])
def test_bounds_are_reached(name, base, cap, low):
    """With uniform() pinned to an end, the wait is exactly that bound."""
    strategy = STRATEGIES[name]
    for attempt in range(1, 21):
        prev = base * attempt
        lo, hi = bounds(name, attempt, prev, base, cap)
        assert strategy(attempt, prev, base, cap, EdgeRng(low)) == (lo if low else hi)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize(("base", "cap"), PARAMS)
def test_caps_at_cap(name, base, cap):
    strategy = STRATEGIES[name]
    top = EdgeRng(low=False)
    first = 1 + math.ceil(math.log2(cap / base))  # base * 2 ** (first - 1) >= cap
    assert base * 2 ** (first - 1) >= cap
    for attempt in range(first, first + 20):
        # prev = cap: decorrelated jitter grows from the previous wait, not the attempt
        assert strategy(attempt, cap, base, cap, top) == cap
    rng = random.Random(1)
    for attempt in range(1, 21):
        assert strategy(attempt, cap * 10, base, cap, rng) <= cap


def test_none_is_exponential():
    waits = [STRATEGIES["none"](a, 1.0, 1.0, 60.0, random.Random(0)) for a in range(1, 9)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("attempt", [10_000, 10**9])
@pytest.mark.parametrize(("base", "cap"), [(1.0, 60.0), (1e10, 1e12), (1e300, 1e305), (0.001, 0.002)])
def test_huge_attempt_does_not_overflow(name, attempt, base, cap):
    strategy = STRATEGIES[name]
    for seed in range(5):
        wait = strategy(attempt, base, base, cap, random.Random(seed))
        assert math.isfinite(wait)
        assert 0.0 <= wait <= cap
    assert strategy(attempt, cap, base, cap, EdgeRng(low=False)) == cap


@pytest.mark.parametrize("attempt", [10_000, 10**9])
def test_backoff_function_huge_attempt(attempt):
    assert backoff(attempt, 1.0, 60.0, EdgeRng(low=False)) == 60.0
    assert 0.0 <= backoff(attempt, 1.0, 60.0, random.Random(0)) <= 60.0
    assert 0.0 <= Backoff("equal").wait(attempt, rng=random.Random(0)) <= 60.0


def test_backoff_function_is_full_jitter():
    for attempt in range(1, 21):
        c = ceiling(attempt, 0.5, 30.0)
        assert backoff(attempt, 0.5, 30.0, EdgeRng(low=False)) == c
        assert backoff(attempt, 0.5, 30.0, EdgeRng(low=True)) == 0.0
        a = backoff(attempt, 0.5, 30.0, random.Random(attempt))
        b = STRATEGIES["full"](attempt, 0.5, 0.5, 30.0, random.Random(attempt))
        assert a == b


def test_backoff_class():
    b = Backoff("additive", base=2.0, cap=10.0)
    assert (b.name, b.base, b.cap) == ("additive", 2.0, 10.0)
    assert b.wait(1, rng=EdgeRng(low=True)) == 2.0
    assert b.wait(2, rng=EdgeRng(low=False)) == 6.0
    assert b.wait(5, rng=EdgeRng(low=False)) == 10.0
    # decorrelated: prev defaults to base
    d = Backoff("decorrelated", base=1.0, cap=100.0)
    assert d.wait(1, rng=EdgeRng(low=False)) == 3.0
    assert d.wait(1, prev=10.0, rng=EdgeRng(low=False)) == 30.0
    assert d.wait(1, prev=50.0, rng=EdgeRng(low=False)) == 100.0
    default = Backoff()
    assert (default.name, default.base, default.cap) == ("full", 1.0, 60.0)


@pytest.mark.parametrize("name", ["", "Full", "exponential", "jitter"])
def test_backoff_class_unknown_name(name):
    with pytest.raises(ValueError, match="unknown backoff strategy"):
        Backoff(name)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(STRATEGIES)),
    st.integers(min_value=1, max_value=10**6),
    st.floats(min_value=0.001, max_value=1000.0),
    st.floats(min_value=1.0, max_value=1e6),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=0, max_value=2**32),
)
def test_bounds_property(name, attempt, base, cap_factor, prev_fraction, seed):
    cap = base * cap_factor
    prev = cap * prev_fraction
    low, high = bounds(name, attempt, prev, base, cap)
    wait = STRATEGIES[name](attempt, prev, base, cap, random.Random(seed))
    assert low <= wait <= high
    assert 0.0 <= wait <= cap
