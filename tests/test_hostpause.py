"""Host pauses (hostpause.py): a run of one failure pauses the host, probes go one per interval. Pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.backoff import Backoff
from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.hostpause import HostPauses, exception_kind, probe_interval
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


def fail(pauses, kind="502", now=0.0, sent_at=None, threshold=3):
    return pauses.failed("h", kind, now, now if sent_at is None else sent_at, threshold, BACKOFF, Top())


def test_threshold_failures_of_one_kind_in_a_row_pause_the_host():
    pauses = HostPauses()
    assert [fail(pauses).started for _ in range(2)] == [False, False]
    assert "h" not in pauses
    event = fail(pauses)
    assert event.started and not event.free and event.wait == pytest.approx(1.0)
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
    assert pauses.ready_at("h", clock.now) == pytest.approx(101.0)
    clock.now = 101.0
    assert pauses.ready_at("h", clock.now) == 0.0
    pauses.released("h", clock.now)  # the probe leaves
    assert pauses.ready_at("h", clock.now) > clock.now  # nothing else until it is answered
    pauses.released("h", clock.now)
    clock.now = 101.2
    event = fail(pauses, now=clock.now, sent_at=101.0)
    assert not event.free and event.wait == pytest.approx(2.0)  # the probe spends its own retry
    assert pauses.ready_at("h", clock.now) == pytest.approx(103.2)


def test_failures_of_requests_sent_before_the_pause_grow_the_interval_but_never_bring_the_probe_sooner():
    pauses = HostPauses()
    for _ in range(3):
        fail(pauses, now=10.0, sent_at=9.9)
    first = pauses.ready_at("h", 10.0)
    event = fail(pauses, now=10.01, sent_at=9.95)  # in flight when the pause began
    assert event.free
    assert pauses.ready_at("h", 10.01) >= first
    assert pauses.ready_at("h", 10.01) == pytest.approx(10.01 + 2.0)


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
