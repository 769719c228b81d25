"""The quota as a budget in the crawl's terms: quota.budget_covers / budget_quota, the board's
free_quota, and the recheck of a slot whose demand was unknown (injected clock and timer)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.budget import reserve_of
from scrapy_retryafter.quota import QuotaDecision, budget_covers, budget_quota, decide_quota
from scrapy_retryafter.quotarecheck import AGAIN, QuotaRecheck
from scrapy_retryafter.ratelimit import MAX_RESET, RateLimitFacts, parse_ratelimit
from scrapy_retryafter.testing.clock import FakeClock

F = RateLimitFacts
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("facts", "wire", "wanted", "covers"),
    [
        # The host: 60 left for 50 minutes, 8 wanted.
        (F(remaining=60, reset=3000, quota=60), 0, 8, True),
        # GitHub: 4,999 of 5,000 left, 15 on the wire, 85 wanted; the reserve is 100.
        (F(remaining=4999, reset=3599, quota=5000), 15, 85, True),
        (F(remaining=200, reset=3599, quota=5000), 15, 85, True),
        (F(remaining=199, reset=3599, quota=5000), 15, 85, False),
        # The demand unknown (start requests still read): assume many.
        (F(remaining=4999, reset=3599, quota=5000), 0, None, False),
        # 500 per 60 s, 600 wanted: would run dry before the reset.
        (F(remaining=499, reset=60, quota=500), 15, 585, False),
        # Spent by the wire, or only the reserve left.
        (F(remaining=3, reset=10, quota=500), 3, 0, False),
        (F(remaining=1, reset=10), 0, 1, False),
        (F(remaining=2, reset=10), 0, 1, True),
        # Hostile: more left than the limit is the limit; no reset, no remainder, invalid.
        (F(remaining=1e9, reset=60, quota=10), 0, 100, False),
        (F(remaining=1e9, reset=60, quota=10), 0, 9, True),
        (F(remaining=100, reset=0), 0, 1, False),
        (F(remaining=100), 0, 1, False),
        (F(quota=100, window=60), 0, 1, False),
        (F(remaining=100, reset=10, invalid=True), 0, 1, False),
    ],
)
def test_the_budget_covers_what_is_wanted_or_the_quota_paces(facts, wire, wanted, covers):
    assert budget_covers(facts, wire, wanted) is covers
    decision = budget_quota(facts, None, wire, 300.0, wanted=wanted)
    if covers:
        assert decision == QuotaDecision(None, 0.0, free=True)
    else:
        assert decision == decide_quota(facts, None, wire, 300.0)


def test_a_covered_quota_too_slow_to_pace_is_no_refusal():
    # 5 an hour, 3 wanted: a pace would be slower than one per cap (a refusal); the budget sends them.
    facts = F(remaining=5, reset=3600, quota=5)
    assert decide_quota(facts, None, 0, 300.0).refuse == 3600
    assert budget_quota(facts, None, 0, 300.0, wanted=3).free


# Quotas from one a day to a million a second, windows up to a week, read from real headers.
@given(
    quota=st.sampled_from([1, 2, 60, 500, 5000, 10**6, 10**9]),
    window=st.sampled_from([1.0, 60.0, 3600.0, 86400.0, MAX_RESET]),
    used=st.integers(0, 10**9),
    phase=st.floats(0.0, 1.0),
    wire=st.integers(0, 64),
    wanted=st.one_of(st.none(), st.integers(0, 10**7)),
)
def test_a_covered_budget_never_sends_more_than_the_window_has_left(quota, window, used, phase, wire, wanted):
    used = min(used, quota)
    headers = {
        b"X-RateLimit-Limit": str(quota).encode(),
        b"X-RateLimit-Remaining": str(quota - used).encode(),
        b"X-RateLimit-Reset": str(math.ceil(NOW + window * (1 - phase))).encode(),
    }
    facts = parse_ratelimit(headers.get, NOW)
    assert facts is not None
    if not budget_covers(facts, wire, wanted):
        return
    # Everything wanted goes at once: with the wire it fits in what is left, the reserve kept.
    assert wanted is not None
    assert wire + wanted + reserve_of(quota) <= quota - used


@given(
    remaining=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none()),
    reset=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none()),
    quota=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none()),
    wire=st.integers(-5, 10**6),
    wanted=st.one_of(st.none(), st.integers(-5, 10**9)),
)
def test_hostile_facts_never_raise_and_never_free_more_than_stated(remaining, reset, quota, wire, wanted):
    facts = F(remaining=remaining, reset=reset, quota=quota)
    if budget_covers(facts, wire, wanted):
        assert remaining is not None and math.isfinite(remaining)
        assert wanted is not None and max(0, wanted) + max(0, wire) < remaining


def test_freeing_the_quota_drops_a_pace_only_the_quota_set():
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    assert not board.free_quota("a")  # nothing paced
    board.announce("a", 60 / 3000)
    board.released("a")  # the next release is 50 s away
    assert board.ready_at("a") > clock() + 40
    assert board.free_quota("a")
    assert board.rate("a") is None
    assert board.ready_at("a") <= clock()
    assert not board.free_quota("a")  # already free


def test_freeing_the_quota_keeps_a_learned_pace_without_the_quota_ceiling():
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    board.succeeded("b")
    clock.advance(1.0)
    assert board.throttled("b", sent_at=clock() - 0.1) is not None
    learned = board.rate("b")
    assert learned is not None
    clock.advance(5.0)
    board.announce("b", 0.5)  # a throttled slot takes the lower of the two
    assert board.rate("b") == 0.5
    assert board.free_quota("b")
    after = board.rate("b")
    assert after is not None and after >= min(learned, 0.5) and after > 0.5
    assert not board.free_quota("b")


class _Timers:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.due: list[tuple[float, object]] = []

    def later(self, delay: float, func):
        self.due.append((self.clock() + delay, func))
        return self

    def cancel(self) -> None:
        self.due.clear()

    def run(self, seconds: float) -> None:
        end = self.clock() + seconds
        while self.due and self.due[0][0] <= end:
            when, func = self.due.pop(0)
            self.clock.now = max(self.clock.now, when)
            func()
        self.clock.now = end


def test_a_slot_spread_while_its_demand_was_unknown_is_decided_again_until_known():
    clock = FakeClock()
    timers = _Timers(clock)
    decided: list[tuple[str, float | None]] = []
    known = {"a": False}

    def decide(slot, facts):
        decided.append((slot, facts.reset))
        return known[slot]

    start_read = {"done": False}
    recheck = QuotaRecheck(decide, clock, later=timers.later, known=lambda: start_read["done"])
    recheck.pending("a", F(remaining=59, reset=3000.0, quota=60))
    recheck.pending("a", F(remaining=58, reset=2999.0, quota=60))  # the latest facts win; one timer
    assert len(timers.due) == 1
    timers.run(AGAIN)
    assert decided == [] and len(timers.due) == 1  # the start still read: nothing decided, looks again
    start_read["done"] = True
    timers.run(AGAIN)
    assert decided == [("a", pytest.approx(2999.0 - 2 * AGAIN))]
    known["a"] = True
    timers.run(AGAIN)
    assert len(decided) == 2 and len(recheck) == 0 and not timers.due


def test_a_recheck_forgets_a_reset_that_passed_and_stops_at_close():
    clock = FakeClock()
    timers = _Timers(clock)
    recheck = QuotaRecheck(lambda slot, facts: False, clock, later=timers.later)
    recheck.pending("a", F(remaining=5, reset=0.1))
    timers.run(AGAIN)
    assert len(recheck) == 0 and not timers.due
    recheck.pending("b", F(remaining=5, reset=100.0))
    recheck.close()
    assert len(recheck) == 0 and not timers.due
