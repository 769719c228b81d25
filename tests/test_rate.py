"""The rate controller and the meter: pure, with the time passed in."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.meter import BUCKET, Meter
from scrapy_retryafter.rate import (
    AGAIN,
    CLIMBED,
    CONFIRMED_MOST,
    DOUBLING,
    DROP_GUARD,
    FLOOR,
    HELD,
    MARGIN,
    PINNED,
    PROBE_COOLDOWN,
    PROBE_SCALE,
    RESTART,
    SHORT,
    START,
    STEADY_SCALE,
    RateController,
    doubling_step,
    step_pays,
)
from scrapy_retryafter.ratememory import learned_pace, remember_pace, restore_pace
from scrapy_retryafter.testing.clock import FakeClock


def test_first_cut_starts_from_what_was_measured():
    pace = RateController()
    assert pace.throttled(measured=20.0, now=0.0) == pytest.approx(14.0)
    assert pace.peak == pytest.approx(20.0 * MARGIN)


def test_nothing_measured_starts_at_the_minimum_rate():
    assert RateController(min_rate=1.0).throttled(measured=0.0, now=0.0) == 1.0


def test_slow_start_at_most_doubles_per_success_and_stops_at_the_first_paced_cut():
    pace = RateController()
    pace.throttled(0.0, 0.0)
    rates = [pace.succeeded(0.0, float(t)) for t in range(1, 8)]
    assert all(b <= 2 * a + 1e-9 for a, b in zip([1.0, *rates], rates))
    assert rates[-1] > 20
    cut = pace.throttled(measured=rates[-1] * 0.8, now=8.0)
    assert cut == pytest.approx(max(rates[-1] * 0.7, rates[-2] * MARGIN))  # a paced cut starts from the paces
    assert not pace.starting


def test_a_success_rate_far_under_the_pace_means_the_limit_dropped():
    pace = RateController()
    pace.starting = False
    pace.rate = 20.0
    assert pace.throttled(measured=5.0, now=10.0) == pytest.approx(3.5)


def test_right_after_a_cut_a_low_success_rate_is_the_meter_lagging_not_a_drop():
    pace = RateController()
    pace.starting = False
    pace.rate = 20.0
    pace.throttled(measured=20.0, now=10.0)  # 14.0
    pace.rate = 30.0
    # 1.4 s later (a 1.25 s cooldown in between) the meter still shows the cooldown's silence.
    assert pace.throttled(measured=4.0, now=10.0 + DROP_GUARD / 2) == pytest.approx(30.0 * 0.7)


def test_leaving_slow_start_after_a_small_step_resumes_just_under_the_pace_before_it():
    pace = RateController()
    pace.throttled(0.0, 0.0)
    steps = []
    while pace.rate < 26.0:
        steps.append(pace.succeeded(0.0, 1.0))
    overshoot, passed = steps[-1], steps[-2]
    assert overshoot / passed < PINNED  # x1.14: the limit lies between the two
    cut = pace.throttled(measured=10.0, now=2.0)
    assert cut == pytest.approx(passed * MARGIN) == pytest.approx(pace.peak)  # the last pace the server let through
    pace.paused(3.25, now=2.0)  # the cooldown that came with the cut
    assert pace.succeeded(100.0, 3.0) == pytest.approx(cut)
    assert pace.succeeded(100.0, 3.25) == pytest.approx(cut)
    # The limit is known closely: probing past it is slow.
    assert pace.succeeded(100.0, 3.25 + 2.0) == pytest.approx(pace.peak + STEADY_SCALE * 2.0**3)


def test_leaving_slow_start_after_a_big_step_regrows_from_the_cut_to_the_pace_before_it():
    pace = RateController()
    pace.throttled(0.0, 0.0)
    while pace.rate < 8.0:
        pace.succeeded(0.0, 1.0)  # 1 -> 2 -> 4 -> 8: doubling
    cut = pace.throttled(measured=4.0, now=2.0)
    assert cut == pytest.approx(8.0 * 0.7)  # over the pace before the step (4.0 x MARGIN): a guess between the two
    assert pace.scale == PROBE_SCALE


def _climbed_past_the_plateau(seconds: float) -> RateController:
    """Slow start refused at 8/s after 4/s, then ``seconds`` of climbing above the 5.6/s it resumed at."""
    pace = RateController()
    pace.throttled(0.0, 0.0)
    while pace.rate < 8.0:
        pace.succeeded(0.0, 1.0)
    pace.throttled(measured=4.0, now=2.0)
    pace.paused(3.25, 2.0)
    for tick in range(1, int(seconds * 10) + 1):
        pace.succeeded(pace.rate, 3.25 + tick / 10)
    return pace


def test_a_pace_refused_after_seconds_of_climbing_past_the_plateau_resumes_just_under_it_pinned():
    pace = _climbed_past_the_plateau(5.0)
    climbed = pace.rate
    assert climbed * MARGIN > CLIMBED * pace.peak  # every pace on the way up was let through
    assert pace.throttled(climbed, 3.25 + 5.0) == pytest.approx(climbed * MARGIN)
    assert pace.peak == pytest.approx(climbed * MARGIN)
    assert pace.scale == STEADY_SCALE


def test_a_pace_refused_within_seconds_of_sending_is_cut_by_beta_as_a_burst_may_have_hidden_the_limit():
    pace = _climbed_past_the_plateau(5.0)
    pace.rate = pace.peak * 1.3  # as far past the plateau, but refused before SHORT seconds of sending
    refused = pace.rate
    pace.resumed = 3.25 + 5.0 - (SHORT - 0.5)
    assert pace.throttled(refused, 3.25 + 5.0) == pytest.approx(refused * 0.7)


def test_a_guess_between_the_last_two_paces_of_slow_start_refused_at_once_is_no_drop():
    pace = RateController()
    pace.throttled(0.0, 0.0)
    while pace.rate < 8.0:
        pace.succeeded(0.0, 1.0)
    guess = pace.throttled(measured=4.0, now=2.0)  # 5.6
    pace.paused(3.25, now=2.0)
    # Refused right after the cooldown: the limit lies between 4 (passed) and the guess.
    assert pace.throttled(measured=4.0, now=3.25 + AGAIN / 2) == pytest.approx(4.0 * MARGIN)
    assert pace.rate > guess * 0.7 * 0.7
    assert pace.peak == pytest.approx(4.0 * MARGIN)
    pace.paused(5.0, now=4.0)
    # Any later throttle right after a cooldown is a drop again.
    assert pace.throttled(measured=4.0, now=5.0 + AGAIN / 2) == pytest.approx(4.0 * MARGIN * 0.7 * 0.7)


def test_a_throttle_right_after_sending_resumed_cuts_deeper_and_sets_no_peak():
    pace = RateController()
    pace.starting = False
    pace.rate = 20.0
    pace.throttled(20.0, 0.0)  # 14.0
    pace.paused(1.25, now=0.0)
    cut = pace.throttled(20.0, 1.25 + AGAIN / 2)  # the first requests after the cooldown: the limit dropped
    assert cut == pytest.approx(14.0 * 0.7 * 0.7)
    assert pace.peak == pytest.approx(cut)
    pace.paused(3.0, now=2.0)
    assert pace.throttled(20.0, 3.0 + AGAIN + 1.0) == pytest.approx(cut * 0.7)  # after a while of sending: normal


def test_regrowth_well_past_the_refused_pace_goes_back_to_slow_start():
    pace = RateController()
    pace.starting = False
    pace.rate = 5.0
    pace.throttled(5.0, 0.0)
    now = 0.0
    while not pace.starting:
        now += 0.2
        rate = pace.succeeded(100.0, now)
    assert rate >= RESTART * 5.0  # the limit moved up: find it fast
    assert pace.succeeded(100.0, now + 0.2) > rate * 1.5
    capped = RateController()
    capped.starting = False
    capped.rate = 5.0
    capped.throttled(5.0, 0.0)
    capped.announced(5.4)
    assert all(capped.succeeded(100.0, t / 10) <= 5.4 for t in range(1, 1000))
    assert not capped.starting  # an announced quota is no limit that moved


def test_after_a_cut_the_rate_returns_to_just_under_the_peak_then_plateaus():
    pace = RateController()
    pace.starting = False
    pace.rate = 20.0
    pace.throttled(measured=20.0, now=0.0)
    assert pace.rate == pytest.approx(14.0)
    at_window = pace.succeeded(100.0, pace.window)
    assert at_window == pytest.approx(20.0 * MARGIN)
    just_after = pace.succeeded(100.0, pace.window + 1.0)
    assert at_window <= just_after < at_window * 1.01  # flat near the old peak
    later = pace.succeeded(100.0, pace.window + 10.0)
    assert later > 20.0  # and probes past it in the end


def test_two_cuts_at_the_same_rate_slow_the_probing():
    pace = RateController()
    pace.starting = False
    pace.rate = 20.0
    pace.throttled(20.0, 0.0)
    first = pace.succeeded(100.0, pace.window + 5.0) - pace.peak
    pace.rate = 20.0
    pace.throttled(20.0, 30.0)
    assert pace.rate == pytest.approx(20.0 * MARGIN)  # the limit is where it was: no regrowth from a deep cut
    second = pace.succeeded(100.0, 30.0 + pace.window + 5.0) - pace.peak
    assert 0 < second < first / 4


def test_probing_past_the_plateau_waits_in_proportion_to_the_cooldown_a_refusal_costs():
    def probe_at(cooldown: float) -> float:
        pace = RateController()
        pace.starting = False
        pace.rate = 20.0
        pace.throttled(20.0, 0.0)
        pace.paused(cooldown, now=0.0)
        now = cooldown + pace.window
        while pace.succeeded(100.0, now) < pace.peak + 1.0:
            now += 0.05
        return now - cooldown - pace.window

    short = probe_at(PROBE_COOLDOWN)
    assert probe_at(PROBE_COOLDOWN / 2) == pytest.approx(short)  # never faster than the constants say
    assert probe_at(60.0) == pytest.approx(short * 60.0 / PROBE_COOLDOWN, rel=0.02)  # a minute's cooldown: 48 x later


def time_to_probe(pace: RateController, start: float, above: float) -> float:
    """Seconds of sending after ``start`` until the pace first passes ``above`` (a success every 50 ms)."""
    now = start
    while pace.succeeded(100.0, now) <= above:
        now += 0.05
        assert now < start + 10_000, "never probed"
    return now - start


def test_each_probe_refused_at_the_pinned_plateau_doubles_the_time_to_the_next_up_to_a_cap():
    pace = RateController()
    pace.starting = False
    pace.rate = 10.0
    pace.throttled(10.0, 0.0)  # a first cut
    now, waits = 0.0, []
    for _ in range(CONFIRMED_MOST + 3):
        now += time_to_probe(pace, now, 10.0)  # the pace climbs past the refused 10/s: refused there again
        pace.throttled(10.0, now)
        assert pace.rate == pytest.approx(10.0 * MARGIN, rel=1e-3)  # back to the plateau, no deep cut
        waits.append(time_to_probe(pace, now, 10.0))
    assert pace.confirmed == CONFIRMED_MOST
    # waits[0]: the cut that pinned the plateau (no confirmation yet); then x2 per confirmation, capped.
    for before, after in zip(waits, waits[1:CONFIRMED_MOST + 1]):
        assert after == pytest.approx(2 * before, rel=0.05)
    assert waits[-1] == pytest.approx(waits[-2], rel=0.05)


@pytest.mark.parametrize(
    "refused, kept",
    [
        (10.0, True),  # the next probe at the plateau: confirmed once more
        (20.0, False),  # refused far above: the limit moved up, it is not where it was
        (5.0, False),  # far below: the limit dropped
    ],
)
def test_a_refusal_away_from_the_plateau_forgets_the_confirmations(refused, kept):
    pace = RateController()
    pace.starting = False
    pace.rate = 10.0
    pace.throttled(10.0, 0.0)
    now = 0.0
    for _ in range(2):
        now += time_to_probe(pace, now, 10.0)
        pace.throttled(10.0, now)
    assert pace.confirmed == 1
    now += 60.0
    pace.rate = refused
    pace.throttled(refused, now)
    assert (pace.confirmed >= 1) is kept


def test_a_limit_that_rose_is_still_found_after_confirmations():
    pace = RateController()
    pace.starting = False
    pace.rate = 10.0
    pace.throttled(10.0, 0.0)
    now = 0.0
    for _ in range(CONFIRMED_MOST + 1):
        now += time_to_probe(pace, now, 10.0)
        pace.throttled(10.0, now)
    # The limit rose to 30/s: nothing refuses; the slow probe reaches the restart point, slow start finds the rest.
    assert pace.confirmed == CONFIRMED_MOST
    took = time_to_probe(pace, now, 25.0)
    assert pace.confirmed == 0  # slow start found it: the confirmations were of a limit that moved
    assert took < 150.0, took  # about a minute at 10/s: +10 % is +1 request/s


def test_growth_never_passes_an_announced_rate_nor_twice_what_is_sent():
    pace = RateController()
    pace.starting = False
    pace.rate = 10.0
    pace.throttled(10.0, 0.0)
    pace.announced(8.0)
    assert pace.succeeded(100.0, 1000.0) == 8.0
    free = RateController()
    free.starting = False
    free.rate = 10.0
    free.throttled(10.0, 0.0)
    assert free.succeeded(3.0, 1000.0) <= 2 * max(3.0, 7.0)


def test_an_announced_rate_is_followed_up_and_down_until_a_throttle():
    pace = RateController()
    pace.announced(10.0)
    assert pace.rate == 10.0
    pace.announced(20.0)
    assert pace.rate == 20.0
    pace.throttled(20.0, 5.0)
    pace.announced(30.0)
    assert pace.rate == pytest.approx(14.0)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 100)), max_size=60))
def test_the_rate_stays_within_bounds(events):
    pace = RateController()
    now = 0.0
    for throttle, measured in events:
        now += 0.1
        rate = pace.throttled(measured, now) if throttle else pace.succeeded(measured, now)
        assert rate == 0.0 or pace.min_rate <= rate < float("inf")


def test_meter_measures_successes_per_second():
    meter = Meter(0.0)
    for i in range(1, 41):
        meter.tick(i * 0.05)  # 20 per second
    assert meter.rate == pytest.approx(20.0, rel=0.1)


def test_board_cuts_once_per_throttle_event_and_paces_releases():
    clock = FakeClock(100.0)
    board = CooldownBoard(clock=clock)
    for _ in range(20):
        clock.now += 0.05
        board.succeeded("a")
    first = board.throttled("a", sent_at=clock.now - 0.01)
    board.cool("a", 1.0)
    assert first is not None
    # in-flight requests of the same penalty, answered during the cooldown: same event
    assert board.throttled("a", sent_at=clock.now - 0.02) is None
    clock.now += 0.5
    assert board.throttled("a", sent_at=clock.now - 0.01) is None
    clock.now += 1.0
    assert board.ready_at("a") == 0.0
    board.released("a")
    assert board.ready_at("a") == pytest.approx(clock.now + 1 / board.rate("a"))


def test_a_pace_that_rises_brings_the_waiting_release_forward():
    clock = FakeClock(100.0)
    board = CooldownBoard(clock=clock)
    board.throttled("a", sent_at=clock.now)  # slow start at 1 request/s
    board.released("a")
    assert board.ready_at("a") == pytest.approx(clock.now + 1.0)
    clock.now += 0.01
    assert board.succeeded("a")  # the pace doubled: the next request need not wait a whole second
    assert board.ready_at("a") == pytest.approx(clock.now - 0.01 + 1 / board.rate("a"))
    board.released("a")
    clock.now += 1.0  # the next release is due already: nothing to bring forward
    assert not board.succeeded("a")
    assert board.ready_at("a") == 0.0


def test_a_stated_quota_makes_up_lateness_up_to_a_tenth():
    clock = FakeClock(100.0)
    stated = CooldownBoard(clock=clock)
    stated.announce("a", 10.0)
    stated.released("a")
    planned = stated.ready_at("a")
    assert planned == pytest.approx(clock.now + 0.1 - 0.01)  # the first release, after idling, gets a tenth
    clock.now = planned + 0.003  # the engine asked 3 ms late
    stated.released("a")
    assert stated.ready_at("a") == pytest.approx(planned + 0.1)  # counted from the planned time
    clock.now = stated.ready_at("a") + 0.5  # very late (idle)
    stated.released("a")
    assert stated.ready_at("a") == pytest.approx(clock.now + 0.1 - 0.01)  # made up by a tenth at most


def test_a_cut_adopted_from_the_fleet_is_no_throttle_of_this_process():
    pace = RateController()
    pace.starting = False
    pace.rate = 20.0
    pace.throttled(20.0, 0.0)  # 14.0, cooling until 1.25
    pace.paused(1.25, now=0.0)
    pace.adopted(9.8, 1.25 + AGAIN / 2)  # another process cut right after the cooldown
    assert pace.rate == pytest.approx(9.8)  # no deeper cut on top
    assert pace.succeeded(100.0, 1.25 + AGAIN / 2 + 2.0) == pytest.approx(9.8, abs=0.1)


def test_a_cut_adopted_from_the_fleet_is_the_plateau_the_adopter_probes_above():
    """The cutter resumed just under the pace refused (9.8 of 10.3, at its plateau): an adopter that
    regrew toward 9.8 / beta was at 11 a second later, and the fleet was refused right after its cooldown."""
    pace = RateController()
    pace.adopted(9.8, 0.0)
    assert pace.succeeded(100.0, 1.0) < 9.8 * 1.01
    assert pace.succeeded(100.0, 8.0) > 9.8 * 1.3  # alone, it still finds a limit that rose


def test_a_deep_cut_adopted_restarts_no_slow_start_under_the_pace_refused_before():
    """Adopting 4.9 after the fleet was refused at 10: from 4.9 / beta alone it took 7 for the pace
    refused, restarted slow start at 7.7 and doubled into the limit again."""
    pace = RateController()
    pace.starting = False
    pace.rate = 10.0
    pace.throttled(10.0, 0.0)  # refused at 10 here
    pace.adopted(4.9, 5.0)
    now = 5.0
    while pace.rate < 8.5 and now < 60.0:
        now += 0.1
        pace.succeeded(100.0, now)
    assert not pace.starting


def test_a_cut_adopted_to_the_plateau_held_here_is_probed_above_slowly():
    """A stray refusal at the fleet's plateau: probed again within seconds, every probe a cooldown."""
    pace = RateController()
    pace.adopted(9.5, 0.0)
    pace.succeeded(100.0, 1.0)
    pace.adopted(9.4, 2.0)  # the fleet's plateau, refused once elsewhere
    assert pace.succeeded(100.0, 12.0) < 9.4 * 1.02


@pytest.mark.parametrize(
    "ticks, now, reading",
    [
        ([0.0] * 8, 0.0, 8 / BUCKET),  # eight successes at once, the 429 in the same instant
        ([0.0, 0.01, 0.02, 0.03], 0.04, 4 / BUCKET),  # within 50 ms of the first success
        ([0.0], 0.3, 1 / BUCKET),
        ([0.0, 0.1, 0.2], 1.0, 3 / 1.0),  # the bucket in progress spans a second
    ],
)
def test_the_meter_reads_the_successes_over_their_span_before_its_first_bucket_closes(ticks, now, reading):
    meter = Meter(ticks[0])
    for t in ticks:
        meter.tick(t)
    assert meter.rate == 0.0  # no bucket closed yet
    assert meter.current(now) == pytest.approx(reading)


def test_a_burst_after_a_quiet_spell_counts_at_once():
    meter = Meter(0.0)
    meter.tick(0.0)
    meter.tick(10.0)  # closes a 10 s bucket with one success: the smoothed rate is near zero
    assert meter.rate < 0.1
    for i in range(7):
        meter.tick(10.0 + i * 0.005)
    assert meter.current(10.04) == pytest.approx(8 / BUCKET)


@given(st.lists(st.floats(0.0, 0.2), min_size=1, max_size=50), st.floats(0.0, 5.0))
def test_the_meter_never_reads_zero_once_a_success_was_seen(gaps, wait):
    meter = Meter(0.0)
    now = 0.0
    for gap in gaps:
        now += gap
        meter.tick(now)
    assert meter.current(now + wait) > 0.0
    assert meter.current(now + wait) >= meter.rate


def test_a_first_429_within_50_ms_of_the_first_successes_paces_from_what_they_measured():
    clock = FakeClock(100.0)
    board = CooldownBoard(clock=clock)
    for _ in range(8):
        clock.now += 0.004
        board.succeeded("a")
    clock.now += 0.01
    assert board.throttled("a", sent_at=clock.now - 0.005) == pytest.approx(8 / BUCKET * 0.7)  # not the 1/s floor


@pytest.mark.parametrize(
    "rate, step",
    [
        (1 / 86400, 2.0),  # a quota of one a day: 2 ** 345600 overflowed
        (0.5, 2.0),
        (1 / DOUBLING, 2.0),
        (8.0, 2 ** 0.5),
        (1e6, 2 ** (1 / 250000)),
    ],
)
def test_slow_start_steps(rate, step):
    assert doubling_step(rate) == pytest.approx(step)


@example(1 / 86400, [("ok", 0.0, 1.0)])
@given(
    st.floats(-math.log10(86400), 6).map(lambda exponent: 10.0**exponent),  # as many tiny quotas as huge ones
    st.lists(st.tuples(st.sampled_from(["ok", "429", "pause", "adopt", "announce", "restore"]), st.floats(0.0, 1e6),
                       st.floats(0.0, 3600.0)), max_size=40),
)
def test_quotas_from_one_a_day_to_a_million_a_second_never_overflow(quota, events):
    pace = RateController()
    pace.announced(quota)
    now = 0.0
    for kind, measured, gap in events:
        now += gap
        if kind == "ok":
            pace.succeeded(measured, now)
        elif kind == "429":
            pace.throttled(measured, now)
        elif kind == "pause":
            pace.paused(now + gap, now)
        elif kind == "adopt":
            pace.adopted(max(quota, 1e-9), now)
        elif kind == "announce":
            pace.announced(quota)
        else:
            restore_pace(pace, quota, now)
        assert 0.0 < pace.rate < float("inf")
        assert pace.rate <= max(pace.ceiling, pace.min_rate)


@example([("ok", 1e120), ("ok", 1e120)])
@example([("pause", 1e300), ("ok", 1.0)])
@given(st.lists(st.tuples(st.sampled_from(["ok", "429", "pause"]), st.floats(0.0, 1e300)), max_size=20))
def test_clocks_and_cooldowns_of_any_size_never_overflow(events):
    """A clock read as 1e120, or a cooldown until 1e300, once raised OverflowError out of the cubic."""
    pace = RateController()
    pace.throttled(0.0, 0.0)
    for kind, when in events:
        if kind == "ok":
            pace.succeeded(1.0, when)
        elif kind == "429":
            pace.throttled(1.0, when)
        else:
            pace.paused(when, 0.0)
        assert 0.0 < pace.rate < math.inf


class Recording(RateController):
    """A controller that keeps what each throttle read as the rate a burst hid."""

    __slots__ = ("hidden",)

    def __init__(self) -> None:
        super().__init__()
        self.hidden: list[tuple[float, float]] = []

    def throttled(self, measured: float, now: float) -> float:
        hidden = self.sustained(now) if self.rate and now >= self.resumed else None
        rate = super().throttled(measured, now)
        if hidden is not None and rate == pytest.approx(hidden * MARGIN):
            self.hidden.append((hidden, rate))
        return rate


def against_token_bucket(pace: RateController, rate: float, burst: float, seconds: float = 40.0) -> list[float]:
    """Pace a simulated token bucket that answers every refusal with Retry-After: 1 (padded: 1.25 s).

    The crawl opens with a burst read at 22 requests/s, as eight requests at once would. Returns the refusal times.
    """
    meter = Meter(0.0)
    cooldown = 1.25
    pace.throttled(22.0, 0.0)
    pace.paused(cooldown, 0.0)
    now = last = cooldown
    tokens = burst
    refusals = []
    while now < seconds:
        tokens = min(burst, tokens + rate * (now - last))
        last = now
        if tokens >= 1.0:
            tokens -= 1.0
            pace.succeeded(meter.tick(now), now)
            now += 1.0 / pace.rate
        else:
            refusals.append(now)
            pace.throttled(meter.current(now), now)
            pace.paused(now + cooldown, now)
            now += cooldown
    return refusals


@pytest.mark.parametrize(
    ("before", "this", "hidden"),
    [
        # 15 served in 0.25 s at 60/s, then 27 in 0.83 s at 32/s: a burst of 10 over 20/s (nginx burst=10, logged).
        ((15, 0.25, 60.0), (27, 0.83, 32.0), pytest.approx(12 / 0.58)),
        ((15, 0.25, 60.0), (21, 0.45, 32.0), None),  # fewer than COUNTED more successes: a fraction of a token is 1 in 6
        ((15, 0.25, 60.0), (27, 0.4, 32.0), None),  # lengths under APART apart
        ((8, 1.2, 1.4), (60, 3.0, 18.0), None),  # the first stretch began under the rate: slow start from the floor
        ((100, 5.0, 20.0), (180, 9.0, 19.0), None),  # long stretches: the paces were near what was served
        ((514, 13.3, 66.7), (390, 7.8, 39.4), None),  # 53/s with a burst of 2: 22/s read from stretches begun under it
    ],
)
def test_two_stretches_of_sending_read_the_rate_a_burst_hid(before, this, hidden):
    (served1, span1, start1), (served2, span2, start2) = before, this
    pace = RateController()
    pace.last = (served1, span1, start1)
    pace.served, pace.peak, pace.resumed = served2, start2, 100.0  # resumed at the plateau: the stretch began at it
    assert pace.start == start2
    assert pace.sustained(100.0 + span2) == hidden


def test_a_burst_allowance_no_longer_hides_the_limit():
    pace = Recording()
    refusals = against_token_bucket(pace, rate=20.0, burst=10.0)
    (hidden, resumed), *_ = pace.hidden
    assert 18.0 <= hidden <= 21.0
    assert 0.85 * 20.0 <= resumed <= 20.0  # the plateau it resumed at
    assert len(refusals) <= 4  # was 7: each cut regrew to just under a pace the burst had let through


@pytest.mark.parametrize("rate", [2.0, 5.0, 20.0, 50.0, 80.0])
def test_without_a_burst_no_rate_is_read_from_the_stretches(rate):
    pace = Recording()
    against_token_bucket(pace, rate=rate, burst=1.0)
    assert pace.hidden == []


@settings(max_examples=300, deadline=None)
@given(st.floats(2.0, 100.0), st.floats(1.0, 40.0))
def test_a_rate_read_from_a_burst_is_near_the_real_one(rate, burst):
    pace = Recording()
    against_token_bucket(pace, rate=rate, burst=burst, seconds=30.0)
    for hidden, _ in pace.hidden:
        assert 0.6 * rate <= hidden <= 1.15 * rate


def pinned_at(rate: float, held: float) -> tuple[RateController, float]:
    """A controller whose limit is pinned near ``rate`` and held for ``held`` s, then refused (a stray or not)."""
    pace = RateController()
    pace.starting = False
    pace.rate = rate
    pace.throttled(rate, 0.0)
    pace.rate = rate
    pace.throttled(rate, 1.0)  # refused twice at the same pace: pinned
    assert pace.scale == STEADY_SCALE
    pace.paused(2.25, now=1.0)
    now = 2.25 + held
    plateau = pace.succeeded(100.0, now)
    pace.throttled(plateau, now)  # refused at the plateau after holding it
    pace.paused(now + 1.25, now)
    return pace, now + 1.25


def test_a_pinned_pace_that_held_refused_once_after_a_cooldown_is_a_stray_not_a_drop():
    pace, resumed = pinned_at(20.0, held=10.0)
    before = pace.rate
    # nginx limit_req without burst: the first requests after the pause arrive 4 ms too close.
    # An ordinary cut, regrowing to just under the plateau; it was x0.49 with the peak set there.
    assert pace.throttled(before, resumed + 0.05) == pytest.approx(before * 0.7)
    assert pace.peak == pytest.approx(before * MARGIN)
    pace.paused(resumed + 1.35, resumed + 0.05)
    # Refused at once again: the limit did drop.
    again = pace.rate
    assert pace.throttled(again, resumed + 1.4) == pytest.approx(again * 0.7 * 0.7)


def test_a_pinned_pace_refused_right_after_a_short_stretch_is_still_cut_deep():
    pace, resumed = pinned_at(20.0, held=HELD / 2)
    before = pace.rate
    assert pace.throttled(before, resumed + 0.05) == pytest.approx(before * 0.7 * 0.7)


@pytest.mark.parametrize(
    ("rate", "grown", "left", "cooldown", "pays"),
    [
        (1.4, 2.8, 10, 3.75, False),  # saves 3.57 s, a refusal costs 3.75 s
        (1.4, 2.8, 11, 3.75, True),  # saves 3.93 s
        (1.4, 2.8, None, 3.75, True),  # unknown: more may come
        (10.0, 20.0, 399, 1.25, True),
        (10.0, 20.0, 24, 1.25, False),  # 1.2 s saved
        (10.0, 20.0, 0, 1.25, False),
    ],
)
def test_a_step_of_slow_start_pays_only_when_it_can_save_more_than_a_cooldown(rate, grown, left, cooldown, pays):
    assert step_pays(rate, grown, left, cooldown) is pays


def small_crawl_pace(left: int | None) -> RateController:
    """An unpaced burst got one success (read as 2/s) and a 429 with a 3.75 s cooldown; then one success."""
    pace = RateController()
    pace.throttled(measured=2.0, now=10.0)
    pace.paused(until=13.75, now=10.0)
    pace.succeeded(measured=2.0, now=13.8, left=lambda: left)
    return pace


def test_with_few_requests_left_slow_start_rises_only_to_what_the_burst_got_through():
    pace = small_crawl_pace(left=9)
    assert pace.rate == pytest.approx(2.0 * MARGIN)  # not x2 (2.8/s): a refusal would cost more than it saves
    assert pace.starting and pace.passed == pytest.approx(1.4)  # the new pace is not tested yet
    assert learned_pace(pace) == pytest.approx(1.4)
    assert pace.succeeded(measured=2.0, now=14.4, left=lambda: 8) == pytest.approx(2.0 * MARGIN)
    assert pace.passed == pytest.approx(2.0 * MARGIN)  # it held
    assert learned_pace(pace) == pytest.approx(2.0 * MARGIN)  # what held is what the next run starts at


def test_a_rise_without_a_probe_refused_at_once_resumes_under_the_pace_before_it():
    pace = small_crawl_pace(left=9)
    pace.throttled(measured=1.0, now=14.0)
    assert pace.rate < 1.4 and not pace.starting  # the untested 1.9/s is no plateau to pin at


def test_a_doubling_is_judged_not_one_small_step_of_it():
    # At 14/s a success steps x1.22: judged alone it saves 0.8 s on 60 pages; the doubling it is part of, 2.1 s.
    pace = RateController()
    pace.throttled(measured=20.0, now=10.0)
    before = pace.rate
    assert pace.succeeded(measured=14.0, now=10.1, left=lambda: 60) > before


@pytest.mark.parametrize("left", [None, 400])
def test_with_many_requests_left_or_an_unknown_count_slow_start_doubles(left):
    assert small_crawl_pace(left=left).rate == pytest.approx(2.8)


def test_once_more_requests_come_slow_start_goes_on_from_where_it_held():
    pace = small_crawl_pace(left=3)
    held = pace.rate
    assert pace.succeeded(measured=2.0, now=14.4, left=lambda: 500) == pytest.approx(held * 2)


def test_the_count_of_requests_left_is_asked_only_when_slow_start_would_step_up():
    asked: list[float] = []

    def left() -> int:
        asked.append(pace.rate)
        return 1000

    pace = RateController()
    restore_pace(pace, 5.0, now=1.0)  # steady: cubic growth never asks
    for tick in range(5):
        pace.succeeded(measured=5.0, now=2.0 + tick, left=left)
    assert asked == []
    pace = RateController()
    pace.throttled(measured=2.0, now=10.0)
    pace.succeeded(measured=2.0, now=10.5, left=left)
    pace.succeeded(measured=2.0, now=11.0, left=left)
    assert asked == [1.4, 2.8]


def test_an_adopted_cut_heard_during_the_fleet_s_cooldown_regrows_only_once_it_ends():
    """Heard just after the fleet's cooldown, the cut restarted the curve at once: the pace climbed
    through the cooldown and resumed a third over the cut (9.36 to 12.55 seen in the fleet)."""
    pace = RateController()
    pace.starting = False
    pace.rate = 10.0
    pace.paused(3.0, now=0.5)  # the fleet's cooldown, told first
    pace.adopted(7.0, now=0.6)
    assert pace.resumed == 3.0
    assert pace.succeeded(100.0, 2.9) == pytest.approx(7.0)  # nothing grows while nothing is sent
    assert pace.succeeded(100.0, 3.0 + pace.window) == pytest.approx(pace.peak)  # from the cooldown's end
    later = RateController()
    later.starting = False
    later.rate = 10.0
    later.paused(0.4, now=0.0)
    later.adopted(7.0, now=0.6)  # after a cooldown that is over, the cut's curve starts now
    assert later.resumed == 0.6


def test_slow_start_s_pace_that_ran_ahead_of_what_was_sent_is_cut_from_what_was_sent():
    """In a fleet the grants are booked ahead at the pace claimed then: slow start's pace doubled to
    16 while the processes sent 9 together. Cut from 16, it resumed at 11.2, over a limit of 10."""
    ahead = RateController()
    ahead.rate, ahead.passed = 16.0, 8.0
    ahead.ran_ahead(9.0)
    assert (ahead.rate, ahead.passed) == (9.0, 0.0)  # its own step to 8 ran ahead too
    ahead.throttled(9.0, 0.0)
    assert ahead.rate == pytest.approx(9.0 * 0.7) and ahead.scale == PROBE_SCALE  # not pinned on a guess
    told = RateController()
    told.rate, told.passed = 16.0, 8.0
    told.throttled(9.0, 0.0)
    assert told.rate == pytest.approx(16.0 * 0.7)
    for sent, starting in [(20.0, True), (0.0, True), (9.0, False)]:  # not ahead, unknown, out of slow start
        pace = RateController()
        pace.rate, pace.passed, pace.starting = 16.0, 8.0, starting
        pace.ran_ahead(sent)
        assert (pace.rate, pace.passed) == (16.0, 8.0)


def test_a_cut_adopted_with_the_cutter_s_plateau_regrows_to_it_and_a_refusal_there_is_at_the_peak():
    """Adopted as a plateau (7), the next refusal here, near 10 (the processes take turns), was no
    refusal "at the peak": it probed fast, and the fleet paid a cooldown every 15 s."""
    paces = {}
    for told in (True, False):
        pace = RateController()
        restore_pace(pace, 9.5, 0.0)
        pace.adopted(7.0, 1.0, (9.5, True, 0.0) if told else None)
        now = 1.0
        while now < 10.0:
            now += 0.1
            pace.succeeded(100.0, now)
        paces[told] = pace
    told = paces[True]
    assert told.scale == STEADY_SCALE and 9.4 < told.rate < 9.5 * 1.02  # back at the plateau, probing slowly
    told.throttled(100.0, 10.0)
    assert told.scale == STEADY_SCALE  # at the peak
    assert paces[False].rate < 7.0 * 1.05  # untold: the cut is the plateau


@pytest.mark.parametrize(("passed", "resumed"), [(9.19, 9.19 * MARGIN), (0.0, 10.87 * 0.7 * 0.7)])
def test_slow_start_s_exit_adopted_and_refused_at_once_resumes_under_the_pace_it_passed(passed, resumed):
    """A fleet of eight: one process left slow start refused at 15.5 having passed 9.2, and cut to 10.9,
    over the limit of 10. Another, whose send was refused right after the cooldown, cut by beta twice
    (5.3), and the fleet crept back from there for half a minute."""
    pace = RateController()
    pace.adopted(10.87, 1.0, (10.87, False, passed))
    pace.paused(3.5, 1.0)
    pace.throttled(10.0, 3.6)
    assert pace.rate == pytest.approx(resumed)


@pytest.mark.parametrize(("plateau", "peak"), [((1e9, False, 0.0), 7.0 / 0.7 * MARGIN), ((0.5, True, 0.0), 7.0)])
def test_an_adopted_plateau_lies_between_the_cut_and_just_under_the_pace_it_cut_from(plateau, peak):
    pace = RateController()
    pace.adopted(7.0, 0.0, plateau)
    assert pace.rate == 7.0 and pace.peak == pytest.approx(peak)
    assert pace.scale == (STEADY_SCALE if plateau[1] else PROBE_SCALE)


def test_slow_start_that_ran_ahead_resumes_over_the_pace_the_fleet_let_through():
    pace = RateController()
    pace.rate, pace.passed = 24.0, 12.0
    pace.ran_ahead(12.0, 9.0)  # refused at 12, the grant before went at 9
    assert (pace.rate, pace.passed) == (12.0, 9.0)
    pace.throttled(12.0, 0.0)
    assert pace.rate == pytest.approx(8.4) and pace.peak == pytest.approx(9.0 * MARGIN)
    unknown = RateController()
    unknown.rate, unknown.passed = 24.0, 12.0
    unknown.ran_ahead(9.0)  # its own step before ran ahead too
    assert unknown.passed == 0.0
    unknown.throttled(9.0, 0.0)
    assert unknown.rate == pytest.approx(6.3) and unknown.scale == PROBE_SCALE  # not pinned on a guess


def test_a_host_that_allows_one_request_a_second_is_paced_under_it():
    """The floor was 1 request/s: a host allowing exactly that was paced at its limit, refused by any gap a ms short."""
    pace = RateController()
    pace.starting = False
    pace.rate = 1.0
    pace.throttled(1.0, 0.0)
    pace.rate = 1.0
    pace.throttled(1.0, 5.0)  # refused twice at the same pace: pinned just under it
    assert pace.scale == STEADY_SCALE
    assert pace.rate == pytest.approx(0.95)
    assert pace.succeeded(1.0, 10.0) < 1.0  # the plateau holds under the limit



def _back_to(pace: RateController, limit: float, now: float, cooldown: float = 1.25) -> float:
    """Seconds until ``pace`` reaches 95 % of a strict ``limit`` (a sliding second), sending at its pace."""
    start, sent, cool = now, [], 0.0
    while now - start < 600.0:
        if pace.rate >= 0.95 * limit:
            return now - start
        now = max(now + 1.0 / pace.rate, cool)
        sent = [t for t in sent if t > now - 1.0]
        if len(sent) >= limit:
            pace.throttled(pace.rate, now)
            cool = now + cooldown
            pace.paused(cool, now)
        else:
            sent.append(now)
            pace.succeeded(float(len(sent)), now)
    return math.inf


def test_a_pace_cut_to_the_floor_by_refusals_in_a_row_regrows_within_seconds():
    """Cut after cut at once (a limit that dropped to nothing) ends at the floor, 0.2/s. Its growth
    share was 0.2 / 4 there, so the limit's return to 20/s took 12.7 s to find; now 8.9 s."""
    pace = RateController()
    pace.throttled(0.0, 0.0)
    for k in range(40):
        pace.succeeded(20.0, 0.05 * k)
    now = 2.0
    while pace.rate > FLOOR:
        pace.throttled(pace.rate, now)
        pace.paused(now + PROBE_COOLDOWN, now)
        now += PROBE_COOLDOWN + 0.05
    assert pace.rate == FLOOR
    assert _back_to(pace, 20.0, now) < 10.0


def test_a_sparse_meter_and_one_stray_refusal_do_not_send_the_pace_to_the_floor():
    """A success every 10 s reads 0.1/s: demand, not a limit. The limit-dropped rule stops at START."""
    pace = RateController()
    restore_pace(pace, 20.0, 0.0)
    assert pace.throttled(0.1, DROP_GUARD + 5.0) == pytest.approx(START * pace.beta)
    dropped = RateController()
    restore_pace(dropped, 20.0, 0.0)
    assert dropped.throttled(4.0, DROP_GUARD + 5.0) == pytest.approx(4.0 * dropped.beta)  # a real drop still cuts deep


@given(st.sampled_from([0.0, -1.0, math.inf, -math.inf, math.nan]))
def test_a_rate_that_is_not_positive_and_finite_leaves_the_pace_as_it_was(bad):
    for setup in (lambda p: None, lambda p: restore_pace(p, 8.0, 0.0)):
        pace = RateController()
        setup(pace)
        before = (pace.rate, pace.peak, pace.ceiling, pace.min_rate)
        pace.announced(bad)
        pace.adopted(bad, 1.0)
        restore_pace(pace, bad, 1.0)
        remember_pace(pace, bad, 1.0)
        assert (pace.rate, pace.peak, pace.ceiling, pace.min_rate) == before
        for now in (2.0, 3.0):
            rate = pace.throttled(bad, now)
            assert 0.0 < rate < math.inf and 0.0 < pace.peak < math.inf
            assert 0.0 < pace.succeeded(bad, now + 5.0) < math.inf


def test_a_saved_or_adopted_pace_never_passes_a_stated_quota():
    pace = RateController()
    pace.announced(5.0)
    restore_pace(pace, 50.0, 0.0)
    assert pace.rate == 5.0
    remember_pace(pace, 50.0, 1.0)
    assert pace.rate <= 5.0
    pace.adopted(40.0, 2.0)
    assert pace.rate <= 5.0


def test_a_quota_under_the_floor_lowers_it_only_while_it_is_stated():
    pace = RateController()
    pace.announced(0.05)  # 3 a minute
    pace.throttled(0.05, 1.0)
    assert pace.rate == pytest.approx(0.05)  # the quota is the floor while stated
    assert pace.unannounced() is pace
    assert pace.min_rate == FLOOR and pace.rate >= FLOOR


@pytest.mark.parametrize("beta, min_rate", [(0.0, FLOOR), (1.0, FLOOR), (-0.5, FLOOR), (0.7, 0.0), (0.7, math.nan)])
def test_a_controller_that_could_not_cut_or_could_stop_is_refused(beta, min_rate):
    with pytest.raises(ValueError, match="beta"):
        RateController(beta=beta, min_rate=min_rate)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_saved_or_remembered_pace_that_is_not_a_rate_leaves_the_slot_unpaced_and_sending(bad):
    """A JOBDIR state of {"rate": NaN} restored a pace of 0, and the next send divided by it."""
    clock = FakeClock(10.0)
    board = CooldownBoard(clock=clock)
    board.restore({"h": {"rate": bad}})
    assert board.remember_paces({"k": bad}) == 0
    for slot in ("h", "k"):
        board.ready_at(slot)
        board.released(slot)
        assert board.rate(slot) is None
    board.announce("q", bad)
    assert board.rate("q") is None
