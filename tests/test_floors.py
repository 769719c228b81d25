"""Floors on a slot's gap under Scrapy's jitter, and reading Crawl-delay (pure)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.floors import (
    CrawlDelaySettingError,
    CrawlDelaySettings,
    crawl_delay_floor,
    floored_delay,
    gap,
    load_crawl_delay_settings,
)


@pytest.mark.parametrize(
    ("delay", "jitter", "floor", "expected"),
    [
        # No floor, or a range already above it: Scrapy's own delay as it was.
        (0.0, 0.5, 0.0, (0.0, 0.5)),
        (1.0, 0.5, 0.0, (1.0, 0.5)),
        (1.0, 0.5, 0.4, (1.0, 0.5)),
        (1.0, 0.5, 0.5, (1.0, 0.5)),
        # Crawl-delay 0.5 and no DOWNLOAD_DELAY: exactly the floor.
        (0.0, 0.5, 0.5, (0.5, 0.0)),
        (0.3, 0.0, 0.5, (0.5, 0.0)),
        # DOWNLOAD_DELAY 0.8 ±50 % draws [0.4, 1.2]; floor 0.5 lifts it to [0.5, 1.2].
        (0.8, 0.5, 0.5, (0.85, 0.7 / 1.7)),
        # A jitter above 1 reaches 0 in Scrapy: [0, 5] becomes [1, 5].
        (2.0, 1.5, 1.0, (3.0, 4.0 / 6.0)),
        # Garbage counts as 0.
        (float("nan"), -1.0, 0.5, (0.5, 0.0)),
    ],
)
def test_floored_delay(delay: float, jitter: float, floor: float, expected: tuple[float, float]) -> None:
    result = floored_delay(delay, jitter, floor)
    assert result == pytest.approx(expected)


def draws(delay: float, jitter: float) -> tuple[float, float]:
    """Scrapy's lowest and highest draw for a slot (Slot.download_delay)."""
    return max(0.0, delay * (1 - jitter)), max(0.0, delay * (1 + jitter))


seconds = st.floats(min_value=0, max_value=1000, allow_nan=False)
jitters = st.floats(min_value=0, max_value=2, allow_nan=False)


@given(delay=seconds, jitter=jitters, floor=seconds)
def test_no_draw_goes_below_the_floor_and_none_above_scrapy_s_own_top(delay: float, jitter: float, floor: float) -> None:
    new_delay, new_jitter = floored_delay(delay, jitter, floor)
    low, high = draws(new_delay, new_jitter)
    assert low >= floor
    assert high <= max(floor, draws(delay, jitter)[1]) * (1 + 1e-12) + 1e-12
    assert 0 <= new_jitter <= max(jitter, 1.0)
    assert floored_delay(new_delay, new_jitter, floor) == (new_delay, new_jitter)


@given(delay=seconds, jitter=jitters)
def test_without_a_floor_scrapy_s_delay_is_left_alone(delay: float, jitter: float) -> None:
    assert floored_delay(delay, jitter, 0.0) == (delay, jitter)


@given(pace=seconds, delay=seconds, jitter=jitters, floor=seconds, draw=st.floats(min_value=-1, max_value=1))
def test_the_gap_is_the_largest_of_pace_jittered_delay_and_floor(
    pace: float, delay: float, jitter: float, floor: float, draw: float
) -> None:
    result = gap(pace, delay, jitter, floor, draw)
    assert result >= max(pace, floor)
    assert result >= min(max(0.0, delay * (1 + draw * jitter)), floor) or result >= floor
    if floor == 0:
        assert result == pytest.approx(max(pace, max(0.0, delay * (1 + draw * jitter))))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, (None, False)),
        (0.5, (0.5, False)),
        ("2", (2.0, False)),
        (0, (None, False)),
        (-3, (None, False)),
        (float("nan"), (None, False)),
        ("soon", (None, False)),
        (True, (None, False)),
        (86400, (60.0, True)),
        (float("inf"), (60.0, True)),
    ],
)
def test_a_crawl_delay_from_robots_txt_is_bounded(raw: Any, expected: tuple[float | None, bool]) -> None:
    assert crawl_delay_floor(raw, 60.0) == expected


def test_settings_defaults_and_overrides() -> None:
    assert load_crawl_delay_settings({}.get) == CrawlDelaySettings(obey=True, max_delay=60.0)
    loaded = load_crawl_delay_settings(
        {
            "RETRY_AFTER_ROBOTSTXT_OBEY": "false",
            "RETRY_AFTER_ROBOTSTXT_MAX_DELAY": "5",
            "RETRY_AFTER_SLOTS": {"mine.example": {"ignore_robots_txt": True}, "b": {"ignore_robots_txt": False}},
        }.get
    )
    assert loaded == CrawlDelaySettings(obey=False, max_delay=5.0, ignore=frozenset({"mine.example"}))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"RETRY_AFTER_ROBOTSTXT_OBEY": "maybe"}, r"^RETRY_AFTER_ROBOTSTXT_OBEY must be True or False; got 'maybe'"),
        ({"RETRY_AFTER_ROBOTSTXT_MAX_DELAY": 0}, r"^RETRY_AFTER_ROBOTSTXT_MAX_DELAY must be a number of seconds > 0"),
        ({"RETRY_AFTER_ROBOTSTXT_MAX_DELAY": math.inf}, r"^RETRY_AFTER_ROBOTSTXT_MAX_DELAY must be"),
        ({"RETRY_AFTER_ROBOTSTXT_MAX_DELAY": "x"}, r"^RETRY_AFTER_ROBOTSTXT_MAX_DELAY must be"),
        ({"RETRY_AFTER_SLOTS": {"a": {"ignore_robots_txt": "yes"}}},
         r"^RETRY_AFTER_SLOTS\['a'\]\['ignore_robots_txt'\] must be True or False"),
    ],
)
def test_bad_settings_fail_naming_the_setting(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(CrawlDelaySettingError, match=message):
        load_crawl_delay_settings(settings.get)
