"""Host pauses (hostpause.py): a run of one failure pauses the host, probes go one per interval. Pure."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_retryafter.backoff import Backoff
from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.hostpause import (
    PROBE_PRIORITY,
    PROBE_TIMEOUT,
    SENT,
    WITHDRAWN_AFTER,
    HostPauses,
    exception_kind,
    left_at,
    probe_interval,
    probe_priority,
)
from scrapy_retryafter.testing.clock import FakeClock

BACKOFF = Backoff("full", 1.0, 60.0)


class Top:
    """The most jitter can draw."""

    def uniform(self, a: float, b: float) -> float:
        return b

    def random(self) -> float:
        return 1.0


@pytest.mark.parametrize(
    ("probes", "low", "high"),
    [(1, 0.5, 1.0), (2, 1.0, 2.0), (3, 2.0, 4.0), (7, 30.0, 60.0), (50, 30.0, 60.0), (0, 0.5, 1.0)],
)
def test_the_probe_interval_is_the_backoff_ceiling_jittered_down_by_at_most_half(probes, low, high):
    class Low:
        def uniform(self, a, b):
            return a

    assert probe_interval(probes, BACKOFF, Low()) == pytest.approx(low)
    assert probe_interval(probes, BACKOFF, Top()) == pytest.approx(high)


@pytest.mark.parametrize(
    ("names", "kind"),
    [
        (["twisted.internet.error.TimeoutError", "builtins.Exception"], "timeout"),
        (["scrapy.exceptions.DownloadTimeoutError"], "timeout"),
        (["twisted.web._newclient.ResponseNeverReceived"], "reset"),
        (["scrapy.exceptions.ResponseDataLossError"], "reset"),
    ],
)
def test_exception_kinds(names, kind):
    assert exception_kind(names) == kind


def fail(pauses, kind="502", now=0.0, sent_at=None, threshold=3, repeat=True):
    return pauses.failed("h", kind, now, now if sent_at is None else sent_at, threshold, BACKOFF, Top(), repeat=repeat)


def test_threshold_failures_of_one_kind_in_a_row_pause_the_host():
    pauses = HostPauses()
    assert [fail(pauses).started for _ in range(2)] == [False, False]
    assert "h" not in pauses
    event = fail(pauses)
    # The host saw the three failures: the first probe waits one interval for each.
    assert event.started and not event.free and event.wait == pytest.approx(3.0)
    assert "h" in pauses


@pytest.mark.parametrize(
    ("kinds", "paused"),
    [
        (["502", "502", "502"], True),
        (["502", "504", "502"], False),  # not the same way: no run
        (["timeout", "timeout", "timeout"], True),
        (["502", "502", "answer", "502"], False),  # an answer ends the run
    ],
)
def test_only_a_run_of_one_kind_pauses(kinds, paused):
    pauses = HostPauses()
    for kind in kinds:
        if kind == "answer":
            pauses.answered("h", 0.0)
        else:
            fail(pauses, kind)
    assert ("h" in pauses) is paused


def test_one_probe_per_interval_and_a_failed_probe_waits_longer():
    clock = FakeClock(100.0)
    pauses = HostPauses()
    for _ in range(3):
        fail(pauses, now=clock.now)
    assert pauses.ready_at("h", clock.now) == pytest.approx(103.0)
    clock.now = 103.0
    assert pauses.ready_at("h", clock.now) == 0.0
    pauses.released("h", clock.now)  # the probe leaves
    assert pauses.ready_at("h", clock.now) > clock.now  # nothing else until it is answered
    pauses.released("h", clock.now)
    clock.now = 103.2
    event = fail(pauses, now=clock.now, sent_at=103.0)
    # The probe spends its own retry; the next waits the longer of its interval (2 s) and the pause's age.
    assert not event.free and event.wait == pytest.approx(3.2)
    assert pauses.ready_at("h", clock.now) == pytest.approx(106.4)


@given(st.lists(st.floats(0.0, 30.0), min_size=1, max_size=12))
def test_a_failed_probe_never_lets_the_next_come_sooner_than_the_pause_is_old(delays):
    """A 6 s outage with 8 requests in flight had two probes inside it (10 requests, 1.67/s) under load."""
    pauses = HostPauses()
    pauses.pause("h", "502", 0.0, BACKOFF, Top())
    now = 0.0
    for delay in delays:
        now = pauses.ready_at("h", now) or now
        now += delay
        pauses.released("h", now)
        fail(pauses, now=now, sent_at=now)
        assert pauses.ready_at("h", now) >= now + min(now, BACKOFF.cap) - 1e-9


def test_failures_of_requests_sent_before_the_pause_move_the_probe_one_interval_each_never_sooner():
    pauses = HostPauses()
    for _ in range(3):
        fail(pauses, now=10.0, sent_at=9.9)
    first = pauses.ready_at("h", 10.0)
    assert first == pytest.approx(13.0)
    event = fail(pauses, now=10.01, sent_at=9.95)  # in flight when the pause began
    assert event.free
    assert pauses.ready_at("h", 10.01) >= first
    assert pauses.ready_at("h", 10.01) == pytest.approx(14.0)
    assert pauses.pause_of("h").probes == 1  # the burst does not double the probes' interval


def test_requests_the_downloader_sent_after_the_pause_began_but_before_its_probe_are_the_burst_not_probes():
    """CI: 5 of 8 failures paused a cold cache at 0.06 s; 11 more queued in the downloader left by 0.09 s.
    Each was taken for a failed probe, doubling the interval: no probe in the crawl's 20 s."""
    pauses = HostPauses()
    for _ in range(5):
        fail(pauses, now=0.06, sent_at=0.05, threshold=5)
    for _ in range(11):
        # Their latency says they left at 0.07-0.09 s; the middleware passed them while nothing held the slot.
        event = fail(pauses, now=0.1, sent_at=left_at({}, 0.1), threshold=5)
        assert event.free  # the host's failure: it spends no retry
    pause = pauses.pause_of("h")
    assert pause.probes == 1
    assert pauses.ready_at("h", 0.1) == pytest.approx(0.06 + 10.0)  # one interval per failure, twice the threshold at most
    pauses.released("h", 10.06)
    event = fail(pauses, now=10.2, sent_at=10.1, threshold=5)  # the probe's own failure
    assert not event.free and pause.probes == 2


def paused_at_ten(threshold, base, cap, burst, seed):
    """A host paused at 10.0 by ``threshold`` failures sent at 9.9, and ``burst`` more in flight."""
    rng = random.Random(seed)
    backoff = Backoff("full", base, cap)
    pauses = HostPauses()
    for _ in range(threshold + burst):
        pauses.failed("h", "502", 10.0, 9.9, threshold, backoff, rng, repeat=False)
    return pauses, backoff, rng


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.integers(1, 8), base=st.floats(0.1, 2.0), cap=st.floats(2.0, 30.0), burst=st.integers(0, 20),
    answer=st.floats(0.001, 5.0), seed=st.integers(0, 2**32),
)
def test_a_released_probe_that_fails_makes_the_next_probe_due_within_the_cap_or_the_pause_age(
    threshold, base, cap, burst, answer, seed
):
    """The probe's stamp is taken as it passes the middleware, after its release; a failure it sees
    (a reset at once, a timeout) re-arms the pause: an estimate from a previous attempt's latency once
    read it as part of the burst, and the host got nothing more until the 60 s probe timeout."""
    pauses, backoff, rng = paused_at_ten(threshold, base, cap, burst, seed)
    release = max(pauses.ready_at("h", 10.0), 10.0)
    pauses.released("h", release)
    now = release + answer
    event = pauses.failed("h", "reset", now, release, threshold, backoff, rng)
    assert not event.free and "h" in pauses
    assert pauses.ready_at("h", now) - now <= max(cap, now - 10.0) + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.integers(1, 8), base=st.floats(0.1, 2.0), cap=st.floats(2.0, 60.0), burst=st.integers(0, 20),
    late=st.floats(0.0, 30.0), seed=st.integers(0, 2**32),
)
def test_a_request_that_left_without_a_release_once_a_probe_was_due_holds_the_host_again(
    threshold, base, cap, burst, late, seed
):
    """engine.download bypasses the queue's release: such a request, failing once the probe was due, is
    the probe. Taken for the burst, each free retry went straight out again: 2311 requests in an 8 s outage."""
    pauses, backoff, rng = paused_at_ten(threshold, base, cap, burst, seed)
    due = max(pauses.ready_at("h", 10.0), 10.0)
    now = due + late + 0.01
    pauses.failed("h", "502", now, due + late, threshold, backoff, rng)
    assert pauses.ready_at("h", now) > now


def test_a_probe_that_hangs_past_the_probe_timeout_still_counts_as_the_failed_probe():
    """A second probe leaves when the first is 60 s out; the first one's failure is still the probe's."""
    pauses = HostPauses()
    pauses.pause("h", "502", 0.0, BACKOFF, Top())
    first = pauses.ready_at("h", 0.0)
    pauses.released("h", first, probe_timeout=60.0)
    pauses.released("h", first + 60.0, probe_timeout=60.0)  # its replacement
    event = fail(pauses, now=first + 120.0, sent_at=first)
    assert not event.free and pauses.pause_of("h").probes == 2


def test_a_released_probe_that_never_left_frees_the_host_for_the_next_after_a_grace():
    """Parked past its deadline before it was sent, a probe held its host for the 60 s probe timeout."""
    pauses = HostPauses()
    pauses.tracks_departures = True
    pauses.pause("h", "502", 0.0, BACKOFF, Top())
    due = pauses.ready_at("h", 0.0)
    pauses.released("h", due)
    assert pauses.ready_at("h", due) == pytest.approx(due + WITHDRAWN_AFTER)  # the queue asks again then
    assert pauses.ready_at("h", due + WITHDRAWN_AFTER) == 0.0
    mark = pauses.released("h", due + WITHDRAWN_AFTER)
    pauses.left("h", due)  # a copy of the first probe's meta: not the probe out
    assert pauses.ready_at("h", due + 2 * WITHDRAWN_AFTER) == 0.0
    mark = pauses.released("h", due + 2 * WITHDRAWN_AFTER)
    pauses.left("h", mark)  # this one left: its outcome is awaited
    assert pauses.ready_at("h", due + 30.0) == pytest.approx(due + 2 * WITHDRAWN_AFTER + PROBE_TIMEOUT)


def test_a_probe_withdrawn_on_its_way_frees_the_host_at_once_and_only_the_probe_can():
    pauses = HostPauses()
    pauses.tracks_departures = True
    pauses.pause("h", "502", 0.0, BACKOFF, Top())
    due = pauses.ready_at("h", 0.0)
    mark = pauses.released("h", due)
    assert mark == due and pauses.released("h", due) is None  # one probe out
    for other in (None, True, due - 1.0, "x"):
        pauses.withdrawn("h", other)
        assert pauses.ready_at("h", due + 0.1) > due + 0.1
    pauses.withdrawn("h", mark)  # parked past its deadline, put back to wait, cooled on its way
    assert pauses.ready_at("h", due + 0.1) == 0.0


def test_a_probe_that_left_is_awaited_though_its_retry_carrying_its_mark_is_put_back_to_wait():
    """A probe refused its connection (no pause rule) is retried with a backoff: its retry's mark
    once freed the host, and up to five probes left back to back."""
    pauses = HostPauses()
    pauses.tracks_departures = True
    pauses.pause("h", "502", 0.0, BACKOFF, Top())
    due = pauses.ready_at("h", 0.0)
    mark = pauses.released("h", due)
    pauses.left("h", mark)
    assert not pauses.withdrawn("h", mark)
    assert pauses.ready_at("h", due + 1.0) == pytest.approx(due + PROBE_TIMEOUT)
    assert pauses.withdrawn("h", mark, sent_back=True)  # it left the middleware, not the downloader's queue
    assert pauses.ready_at("h", due + 1.0) == 0.0


def test_without_departures_reported_a_released_probe_is_awaited_until_the_timeout():
    pauses = HostPauses()
    pauses.pause("h", "502", 0.0, BACKOFF, Top())
    due = pauses.ready_at("h", 0.0)
    pauses.released("h", due)
    assert pauses.ready_at("h", due + 30.0) == pytest.approx(due + PROBE_TIMEOUT)


def test_a_stamp_from_the_future_or_none_is_before_any_pause():
    assert left_at({SENT: 5.0}, 6.0) == 5.0
    for meta in ({}, {SENT: 7.0}, {SENT: "5"}, {SENT: True}, {SENT: float("nan")}):
        assert left_at(meta, 6.0) == -math.inf


@pytest.mark.parametrize(("in_flight", "first_probe"), [(5, 5.0), (8, 8.0), (10, 10.0), (16, 10.0), (100, 10.0)])
def test_a_burst_in_flight_puts_the_first_probe_one_interval_per_request_out_up_to_twice_the_threshold(
    in_flight, first_probe
):
    """A one-second blip with 16 requests in flight once put the first probe 55 s out (doubling per request)."""
    pauses = HostPauses()
    for _ in range(in_flight):
        fail(pauses, now=0.5, sent_at=0.0, threshold=5)
    assert pauses.ready_at("h", 0.5) == pytest.approx(0.5 + first_probe)


@pytest.mark.parametrize(
    ("base", "failures", "spent", "priority"),
    [
        (0, 1, False, PROBE_PRIORITY),
        (-2, 3, False, 3 * PROBE_PRIORITY - 2),  # the most failed first, whatever retries took off
        (-1, 2, False, 2 * PROBE_PRIORITY - 1),
        (5, 4, True, 5),  # its last attempt failed as a probe: an always-failing URL can't hold the host
        (0, 10**9, False, 1000 * PROBE_PRIORITY),  # bounded
        (0, -7, False, PROBE_PRIORITY),
    ],
)
def test_the_probe_is_a_request_that_failed_before_most_failed_first(base, failures, spent, priority):
    assert probe_priority(base, failures, spent) == priority


@given(st.integers(-(2**16), 2**16), st.integers(1, 1000), st.integers(1, 1000), st.integers(0, 50))
def test_more_failures_probe_first_though_each_retry_lowered_the_priority(base, fewer, more, adjusted):
    """A request's own priority drops by RETRY_PRIORITY_ADJUST on each retry; failures still rank first."""
    fewer, more = sorted((fewer, more))
    assert probe_priority(base - adjusted, more, False) >= probe_priority(base, fewer, False) or more == fewer
    assert probe_priority(base, fewer, False) > base


def test_an_answer_ends_the_pause_and_says_how_long_it_lasted():
    pauses = HostPauses()
    for _ in range(3):
        fail(pauses, now=5.0)
    assert pauses.answered("h", 8.5) == pytest.approx(3.5)
    assert "h" not in pauses and pauses.ready_at("h", 8.5) == 0.0
    assert pauses.answered("h", 9.0) is None


def test_a_probe_that_never_comes_back_is_replaced_after_the_timeout():
    pauses = HostPauses()
    pauses.pause("h", "502", 0.0, BACKOFF, Top())
    pauses.released("h", 1.0, probe_timeout=30.0)
    assert pauses.ready_at("h", 29.0) == pytest.approx(31.0)
    assert pauses.ready_at("h", 31.0) == 0.0


def test_streaks_are_pruned_and_pauses_kept_until_answered():
    pauses = HostPauses()
    pauses.failed("a", "502", 0.0, 0.0, 3, BACKOFF, Top())
    pauses.pause("b", "502", 0.0, BACKOFF, Top())
    assert pauses.prune(before=10.0) == 1
    assert list(pauses) == ["b"]


def test_the_board_holds_a_paused_slot_and_lets_one_probe_out():
    clock = FakeClock(0.0)
    board = CooldownBoard(clock=clock)
    wait = board.pauses.pause("h", "502", clock.now, BACKOFF, Top())
    board.cool("h", wait)
    clock.now = wait + 0.01
    assert board.ready_at("h") == 0.0
    board.released("h")
    assert board.ready_at("h") > clock.now
    clock.now += 1000.0
    board.sweep()
    assert "h" in board  # a paused slot is not forgotten
    board.pauses.answered("h", clock.now)
    assert board.ready_at("h") == 0.0


@given(st.lists(st.tuples(st.sampled_from(["502", "504", "timeout", "ok", "probe"]), st.floats(0, 5)), max_size=60))
def test_a_paused_host_never_sees_two_probes_in_one_interval(steps):
    """Whatever the failures and answers, the host is never released twice while one probe is out."""
    pauses = HostPauses()
    now = 0.0
    out = False
    probe_deadline = -1.0
    for step, dt in steps:
        now += dt
        if step == "ok":
            pauses.answered("h", now)
            out = False
        elif step == "probe":
            if "h" in pauses and pauses.ready_at("h", now) == 0.0:
                assert not out or now >= probe_deadline
                pauses.released("h", now, probe_timeout=100.0)
                out, probe_deadline = True, now + 100.0
        else:
            pauses.failed("h", step, now, now, 3, BACKOFF, Top())
            out = False
        assert pauses.remaining("h", now) <= 100.0 + 1e-9  # a probe timeout or the 60 s interval cap, at most


@pytest.mark.parametrize(
    ("method", "meta", "retry", "gave_up"),
    [
        ("GET", {"retry_times": 2}, True, False),  # retries exhausted, but the host was paused: none spent
        ("POST", {}, False, False),  # a paused host does not make a POST repeatable
        ("GET", {"retry_after_started": 0.0, "retry_after_deadline": 5.0}, False, True),  # past its deadline
    ],
)
def test_a_failure_while_the_host_is_paused_spends_no_retry_but_keeps_method_and_deadline(method, meta, retry, gave_up):
    from scrapy_retryafter.failures import Rule, decide_failure

    decision = decide_failure(
        Rule.IDEMPOTENT, method=method, has_idempotency_key=False, server_error_methods={"GET"},
        attempt=3, max_retries=2, backoff=BACKOFF, previous_wait=None, meta=meta, deadline=float("inf"),
        now=4.0, host_paused=3.0,
    )
    assert (decision.retry, decision.gave_up) == (retry, gave_up)
    if retry:
        assert decision.wait == 0.0


def test_a_fresh_url_failing_after_a_pause_ended_teaches_that_the_failures_are_per_url():
    pauses = HostPauses()
    for _ in range(3):
        fail(pauses, now=0.0, repeat=False)
    assert "h" in pauses  # before any lesson, fresh failures of one kind are an outage
    pauses.answered("h", 5.0)  # the probe (a request that failed before) got through
    # Fresh URLs fail again while the host answers: their first attempts, not the host.
    for i in range(10):
        event = fail(pauses, now=5.1 + i / 100, repeat=False)
        assert not event.started and not event.free and event.wait == 0.0
    assert "h" not in pauses
    # The same URLs failing again still pause the host, first probe one interval out.
    events = [fail(pauses, now=6.0, repeat=True) for _ in range(3)]
    assert events[-1].started and events[-1].wait == pytest.approx(1.0)
    # In flight meanwhile: a fresh URL's failure is held but does not move the probe.
    assert fail(pauses, now=6.1, sent_at=5.9, repeat=False).free
    assert pauses.ready_at("h", 6.1) == pytest.approx(7.0)
    assert fail(pauses, now=6.1, sent_at=5.9, repeat=True).free
    assert pauses.ready_at("h", 6.1) == pytest.approx(8.0)


def test_without_a_pause_that_ended_fresh_failures_still_pause_and_lessons_are_forgotten():
    pauses = HostPauses()
    pauses.answered("h", 0.0)  # never paused: nothing learnt
    assert fail(pauses, now=1.0, repeat=False).wait == 0.0
    fail(pauses, now=1.0, repeat=False)
    assert fail(pauses, now=1.0, repeat=False).started
    pauses.answered("h", 2.0)
    fail(pauses, now=2.5, repeat=False)  # the lesson
    assert "h" in list(pauses)
    assert pauses.prune(before=100.0) == 1
    assert list(pauses) == []
    events = [fail(pauses, now=200.0, repeat=False) for _ in range(3)]
    assert events[-1].started  # forgotten: an outage again


@given(st.lists(st.tuples(st.sampled_from(["fresh", "repeat", "answer"]), st.floats(0, 2)), max_size=80))
def test_a_run_of_repeated_failures_always_pauses_whatever_was_learnt(steps):
    pauses = HostPauses()
    now = 0.0
    for step, dt in steps:
        now += dt
        if step == "answer":
            pauses.answered("h", now)
        else:
            fail(pauses, now=now, sent_at=now, repeat=step == "repeat")
    pauses.answered("h", now)
    assert [fail(pauses, now=now, sent_at=now, repeat=True).started for _ in range(3)] == [False, False, True]


def outage_then_resume(pauses: HostPauses, now: float) -> float:
    for _ in range(5):
        pauses.failed("h", "502", now, now, 5, BACKOFF, repeat=False)
    assert "h" in pauses
    pauses.answered("h", now + 2.0)
    return now + 2.0


def test_a_fresh_failure_minutes_after_a_pause_ended_does_not_teach_the_per_url_lesson():
    """The lesson is for a fresh URL failing right after a pause ended, not one broken page 5 minutes later."""
    pauses = HostPauses()
    later = outage_then_resume(pauses, 0.0) + 300.0
    pauses.failed("h", "502", later, later, 5, BACKOFF, repeat=False)  # one broken page
    for i in range(1, 6):  # a real outage now: the fresh requests in flight fail alike
        pauses.failed("h", "502", later + i * 0.01, later + i * 0.01, 5, BACKOFF, repeat=False)
    assert "h" in pauses


def test_the_per_url_lesson_is_not_renewed_by_fresh_failures_and_is_forgotten():
    pauses = HostPauses()
    t = outage_then_resume(pauses, 0.0)
    pauses.failed("h", "502", t + 0.1, t + 0.1, 5, BACKOFF, repeat=False)  # the lesson
    for minute in range(1, 60):  # one broken page a minute, for an hour
        t = minute * 60.0
        pauses.prune(t - 600.0)
        pauses.failed("h", "502", t, t, 5, BACKOFF, repeat=False)
        pauses.answered("h", t + 1.0)
    for i in range(1, 6):  # then the host goes down
        pauses.failed("h", "502", t + 2 + i * 0.01, t + 2 + i * 0.01, 5, BACKOFF, repeat=False)
    assert "h" in pauses


def test_under_the_lesson_a_long_run_of_fresh_failures_with_no_answer_still_pauses():
    """A real outage after the lesson: every fresh request fails, nothing answers in between."""
    pauses = HostPauses()
    t = outage_then_resume(pauses, 0.0)
    pauses.failed("h", "502", t + 0.1, t + 0.1, 5, BACKOFF, repeat=False)  # the lesson
    started = [pauses.failed("h", "502", t + 1, t + 1, 5, BACKOFF, repeat=False).started for _ in range(20)]
    assert started == [False] * 19 + [True]


def test_a_run_of_fresh_failures_that_disproves_the_lesson_stops_it_being_taught_again():
    """A host that flaps (down again right after each pause) looked per-URL once; not twice.
    A cold cache's run of fresh failures is paused too, but its probe (a retry) gets through."""
    pauses = HostPauses()
    t = outage_then_resume(pauses, 0.0)
    pauses.failed("h", "502", t + 0.1, t + 0.1, 5, BACKOFF, repeat=False)  # the lesson
    for _ in range(20):
        pauses.failed("h", "502", t + 1, t + 1, 5, BACKOFF, repeat=False)
    assert "h" in pauses
    pauses.released("h", t + 2.5)  # its probe, a retry, leaves, and fails too
    pauses.failed("h", "502", t + 3, t + 2.5, 5, BACKOFF, repeat=True)
    pauses.answered("h", t + 5.0)
    events = [pauses.failed("h", "502", t + 5.5, t + 5.5, 5, BACKOFF, Top(), repeat=False) for _ in range(5)]
    assert events[-1].started  # fresh failures right after this pause are an outage again
    assert events[-1].wait == pytest.approx(5.0)  # one interval per failure, as for any outage
