"""Learned paces in the per-host memory: what a run saves, and what the next run starts at from a hostile file."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.hostpaces import MAX_REMEMBERED, learned_records, seeded_paces
from scrapy_retryafter.hostrecord import MAX_RATE, MIN_RATE
from scrapy_retryafter.hoststate import HostMemory, HostRecord, Pace, Refusal
from scrapy_retryafter.rate import FLOOR, MARGIN, STEADY_SCALE, RateController
from scrapy_retryafter.ratememory import learned_pace
from scrapy_retryafter.testing.clock import FakeClock

WALL = 1_800_000_000.0
WEEK = 7 * 86400.0


def learned_board(rate: float = 20.0) -> tuple[CooldownBoard, FakeClock]:
    clock = FakeClock()
    board = CooldownBoard(clock=clock)
    board.throttled("api.test", sent_at=clock())
    state = board._slots["api.test"]
    assert state.pace is not None
    state.pace.starting = False
    state.pace.rate = rate
    clock.advance(5.0)
    board.throttled("api.test", sent_at=clock())  # refused at 20/s: the plateau is just under it
    return board, clock


def test_a_run_that_was_throttled_saves_the_plateau_just_under_the_refused_pace():
    board, _ = learned_board(20.0)
    board.announce("quota.test", 5.0)  # paced by a stated quota only: nothing learned
    records = learned_records(board, WALL)
    assert records == {"api.test": HostRecord(pace=Pace(20.0 * MARGIN, WALL))}


def test_a_run_that_learned_nothing_saves_nothing_and_creates_no_file(tmp_path):
    board = CooldownBoard(clock=FakeClock())
    board.succeeded("free.test")
    assert learned_records(board, WALL) == {}
    memory = HostMemory(tmp_path / "hosts.json", clock=lambda: WALL)
    assert memory.save(learned_records(board, WALL)) == 0
    assert not (tmp_path / "hosts.json").exists()


def test_the_next_run_starts_at_the_remembered_pace_without_slow_start_and_still_probes(tmp_path):
    board, _ = learned_board(20.0)
    path = tmp_path / "hosts.json"
    HostMemory(path, clock=lambda: WALL).save(learned_records(board, WALL))
    clock = FakeClock()
    fresh = CooldownBoard(clock=clock)
    assert seeded_paces(fresh, HostMemory(path, clock=lambda: WALL + 3600).load()) == 1
    pace = fresh._slots["api.test"].pace
    remembered = 20.0 * MARGIN
    # Just under the remembered pace (it may sit at the very edge of the limit), and no slow start.
    assert pace is not None and pace.rate == pytest.approx(remembered * MARGIN)
    assert not pace.starting and pace.scale == STEADY_SCALE
    clock.advance(pace.window)
    fresh.succeeded("api.test")
    assert pace.rate == pytest.approx(remembered)  # back at it within seconds
    assert pace.window < 5.0
    clock.advance(20.0)
    fresh.succeeded("api.test")
    assert remembered < pace.rate < remembered * 1.1  # probing upward, slowly, in case the limit rose
    assert learned_pace(pace) is None  # not throttled here: the record stays as saved, and ages out
    pace.throttled(pace.rate, clock.now)
    assert learned_pace(pace) is not None  # throttled again: this run's plateau is saved in turn


def test_a_refused_host_is_left_to_its_refusal():
    board = CooldownBoard(clock=FakeClock())
    board.refuse("api.test", 600.0)
    records = {"api.test": HostRecord(refusal=Refusal(WALL + 600, "over_cap", WALL), pace=Pace(5.0, WALL))}
    assert seeded_paces(board, records) == 0


@pytest.mark.parametrize(
    "raw, seeded",
    [
        ({"rate": 18.5, "at": WALL - 60}, 18.5),
        ({"rate": "18.5", "at": WALL}, None),  # wrong type
        ({"rate": None, "at": WALL}, None),
        ({"rate": [1], "at": WALL}, None),
        ({"rate": True, "at": WALL}, None),
        ({"rate": -3.0, "at": WALL}, None),
        ({"rate": 0.0, "at": WALL}, None),
        ({"rate": 1e300, "at": WALL}, None),  # bounded to MAX_RATE by the parser, over what any crawl sends
        ({"rate": 1e-300, "at": WALL}, FLOOR),  # bounded to MIN_RATE, then the controller's floor
        ({"rate": 18.5, "at": WALL - WEEK - 1}, None),  # stale: older than RETRY_AFTER_MEMORY_AGE
        ({"rate": 18.5, "at": WALL + 30 * 86400}, None),  # learned in the future
        ({"rate": 18.5}, None),
        ("fast", None),
    ],
)
def test_a_hostile_file_seeds_only_bounded_fresh_paces(tmp_path, raw, seeded):
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"version": 1, "hosts": {"api.test": {"pace": raw}}}))
    path.chmod(0o600)
    board = CooldownBoard(clock=FakeClock())
    assert seeded_paces(board, HostMemory(path, clock=lambda: WALL).load()) == (seeded is not None)
    rate = board.rate("api.test")
    assert rate == (pytest.approx(max(FLOOR, seeded * MARGIN)) if seeded is not None else None)


def test_nan_and_infinite_paces_in_the_file_are_set_aside(tmp_path):
    path = tmp_path / "hosts.json"
    path.write_text('{"version": 1, "hosts": {"a.test": {"pace": {"rate": NaN, "at": 1}},'
                    ' "b.test": {"pace": {"rate": Infinity, "at": 1}}}}')
    path.chmod(0o600)
    memory = HostMemory(path, clock=lambda: WALL)
    board = CooldownBoard(clock=FakeClock())
    assert seeded_paces(board, memory.load()) == 0
    assert memory.set_aside == 2 and len(board) == 0


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=0.0, max_value=2 * WALL))
def test_any_number_in_the_file_seeds_a_pace_within_bounds_or_none(rate, at):
    memory_text = json.dumps({"version": 1, "hosts": {"api.test": {"pace": {"rate": rate, "at": at}}}})
    from scrapy_retryafter.hostrecord import merge_all, parse

    records, _ = parse(memory_text.encode(), WALL)
    board = CooldownBoard(clock=FakeClock())
    seeded_paces(board, merge_all(records, now=WALL, max_age=WEEK))
    seeded = board.rate("api.test")
    assert seeded is None or MIN_RATE <= seeded <= min(MAX_RATE, MAX_REMEMBERED)


@given(st.floats(min_value=1.0, max_value=1e4))
def test_what_a_throttled_controller_would_save_is_under_the_refused_pace_unless_a_faster_one_held(rate):
    pace = RateController()
    pace.starting = False
    pace.rate = rate
    pace.throttled(rate, 10.0)
    for second in range(11, 40):
        pace.succeeded(2 * rate, float(second))
        learned = learned_pace(pace)
        assert learned is not None and pace.min_rate <= learned <= max(pace.rate, rate * MARGIN)
