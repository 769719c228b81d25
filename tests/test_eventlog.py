"""The event log's rules with an injected clock: one line per burst, cuts after their throttle, rises rationed."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.eventlog import EventLog, RiseGate, printable
from scrapy_retryafter.retry_reporting import add_seconds


def line(name: str):
    return ("%(name)s x%(count)d", {"name": name})


def test_a_burst_answering_the_requests_on_the_wire_is_one_line_with_its_count(clock):
    log = EventLog(clock)
    new, due = log.event("a", clock() - 0.1, line("first"), expected=6)
    assert new and due == []
    for _ in range(6):
        clock.advance(0.01)
        new, due = log.event("a", clock() - 0.5, line("member"), expected=9)
        assert not new
    assert due == [("%(name)s x%(count)d", {"name": "first", "count": 7})]
    assert log.due(everything=True) == []


def test_a_request_sent_after_the_event_began_starts_a_new_event_and_writes_the_old(clock):
    log = EventLog(clock)
    log.event("a", clock(), line("one"), expected=3)
    clock.advance(2)
    new, due = log.event("a", clock() - 0.1, line("two"), expected=0)
    assert new
    assert due == [("%(name)s x%(count)d", {"name": "one", "count": 1}), ("%(name)s x%(count)d", {"name": "two", "count": 1})]


def test_an_answer_to_a_later_request_closes_the_burst_and_grace_closes_a_lost_one(clock):
    log = EventLog(clock, grace=1.0)
    log.event("a", clock(), line("one"), expected=5)
    clock.advance(0.2)
    assert log.answered("a", clock() - 0.5) == []  # sent before: one awaited answer
    assert log.answered("a", clock() - 0.1) == [("%(name)s x%(count)d", {"name": "one", "count": 1})]
    log.event("b", clock(), line("b"), expected=5)
    assert log.due() == []
    clock.advance(1.0)
    assert log.due() == [("%(name)s x%(count)d", {"name": "b", "count": 1})]


def test_a_pace_cut_never_comes_before_its_throttle_line(clock):
    log = EventLog(clock)
    log.event("a", clock(), line("throttle"), expected=2)
    assert log.follow("a", ("cut", {})) == []
    clock.advance(0.1)
    log.event("a", clock() - 1, line("m"), expected=0)
    _, due = log.event("a", clock() - 1, line("m"), expected=0)
    assert [message for message, _ in due] == ["%(name)s x%(count)d", "cut"]
    assert log.follow("a", ("later", {})) == [("later", {})]  # the line is out: written now


def test_written_events_are_forgotten(clock):
    log = EventLog(clock, keep=60)
    for i in range(1000):
        log.event(f"s{i}", clock(), line("x"), expected=0)
    assert len(log) == 1000
    clock.advance(61)
    log.due()
    assert len(log) == 0


def test_rises_are_written_once_per_slot_per_minute(clock):
    gate = RiseGate(clock, every=60)
    assert gate.allows("a")
    clock.advance(30)
    assert not gate.allows("a")
    assert gate.allows("b")
    clock.advance(31)
    assert gate.allows("a")
    gate.noted("a")  # a cut was written: the next rise waits a minute
    clock.advance(59)
    assert not gate.allows("a")


def test_the_rise_gate_forgets_old_slots(clock):
    gate = RiseGate(clock, every=60, prune_at=100)
    for i in range(10_000):
        gate.allows(f"s{i}")
        clock.advance(0.1)
    assert len(gate._last) <= 2 * 600 + 100


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("example.com", "example.com"),
        ("evil\ncom", "evil\\ncom"),
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("x" * 300, "x" * 200 + "...(300 chars)"),
    ],
)
def test_slot_names_in_log_lines_are_one_printable_line(name, shown):
    assert printable(name) == shown


class Stats(dict):
    def get_value(self, key, default=None):
        return self.get(key, default)

    def set_value(self, key, value):
        self[key] = value


def test_summed_seconds_have_no_float_noise():
    stats = Stats()
    for seconds in (1.25, 1.264, 1.27, 1.26):  # summed as floats: 5.0440000000000005
        add_seconds(stats, "s", seconds)
    assert repr(stats["s"]) == "5.044"


@given(st.lists(st.floats(min_value=-1, max_value=1e6) | st.sampled_from([math.nan, math.inf, -math.inf]), max_size=40))
def test_any_sum_of_seconds_has_at_most_three_decimals(amounts):
    stats = Stats()
    for amount in amounts:
        add_seconds(stats, "s", amount)
    value = stats.get("s", 0)
    assert math.isfinite(value) and value >= 0
    text = repr(float(value))
    assert "e" in text or len(text.split(".")[1]) <= 3


def test_the_live_view_and_the_closing_table_keep_a_hostile_slot_name_on_one_line():
    from scrapy_retryafter.tally import SlotView, SummaryRow, live_line, summary_table

    name = "evil\nINFO: forged line\x07" + "x" * 500
    assert "\n" not in live_line(SlotView(name, 1.0, "closed", None, 3))
    table = summary_table([SummaryRow(name, 3, {429: 2}, 1.0, None, 0, 0)])
    assert len(table.splitlines()) == 2
    assert max(len(line) for line in table.splitlines()) < 200
