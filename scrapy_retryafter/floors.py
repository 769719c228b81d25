"""Floors on a slot's gap between requests that no jitter goes below.

Scrapy spaces a slot's requests by its delay, drawn at random in
``[delay * (1 - jitter), delay * (1 + jitter)]`` (never below 0): with the
default ±50 % (``RANDOMIZE_DOWNLOAD_DELAY``, ``DOWNLOAD_DELAY_JITTER`` in 2.19,
a ``DOWNLOAD_SLOTS`` entry's ``jitter``) half the gaps are shorter than the
delay. A floor (a robots.txt ``Crawl-delay``, the pace the server allows) is
a promise about every gap, so the draw's range is lifted: its lower end to the
floor, its upper end to at least the floor. A range already above the floor is
left alone, so a crawl without floors behaves as before.

The gap between two requests of a slot is then ``max(pace, Scrapy's jittered
delay, floor)``: the pace is kept by the scheduler's queue, the lifted delay
by Scrapy's downloader (`gap` states it as one function for the tests).

Pure: no Scrapy, no Twisted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CrawlDelaySettingError",
    "CrawlDelaySettings",
    "crawl_delay_floor",
    "floored_delay",
    "gap",
    "load_crawl_delay_settings",
]


def _bounds(delay: float, jitter: float) -> tuple[float, float]:
    """The range Scrapy draws a slot's gap from."""
    return max(0.0, delay * (1 - jitter)), max(0.0, delay * (1 + jitter))


def floored_delay(delay: float, jitter: float, floor: float) -> tuple[float, float]:
    """The slot's (delay, jitter) whose draws lie in ``[max(floor, low), max(floor, high)]``.

    ``(delay, jitter)`` itself when its lowest draw is already at or above the
    floor, so applying it twice changes nothing. Bad numbers (negative, NaN)
    count as 0.
    """
    delay, jitter, floor = (_sane(value) for value in (delay, jitter, floor))
    low, high = _bounds(delay, jitter)
    if low >= floor:
        return delay, jitter
    low, high = floor, max(floor, high)
    centre = (low + high) / 2
    if centre <= 0:
        return 0.0, 0.0
    spread = (high - low) / (high + low)
    for _ in range(64):  # rounding: Scrapy's lowest draw must not fall a hair short of the floor
        if centre * (1 + -spread) >= floor:
            return centre, spread
        centre = math.nextafter(centre, math.inf)
    return max(centre, floor), 0.0


def gap(pace: float, delay: float, jitter: float, floor: float, draw: float) -> float:
    """The gap between two requests of a slot, for ``draw`` in [-1, 1] (Scrapy's uniform draw).

    ``pace``: seconds between requests the queue keeps (0 when unpaced).
    """
    floored, spread = floored_delay(delay, jitter, floor)
    jittered = max(0.0, floored * (1 + max(-1.0, min(1.0, draw)) * spread))
    return max(_sane(pace), jittered, _sane(floor))


def _sane(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def crawl_delay_floor(value: Any, max_delay: float) -> tuple[float | None, bool]:
    """(floor, capped) for a robots.txt Crawl-delay: None when absent or unusable, capped at ``max_delay``.

    The number comes from the site's robots.txt: hostile until bounded.
    """
    if value is None or isinstance(value, bool):
        return None, False
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None, False
    if math.isnan(number) or number <= 0:
        return None, False
    if number > max_delay:
        return max_delay, True
    return number, False


class CrawlDelaySettingError(ValueError):
    """RETRY_AFTER_ROBOTSTXT_OBEY or RETRY_AFTER_ROBOTSTXT_MAX_DELAY has a value the package cannot use."""


OBEY_SETTING = "RETRY_AFTER_ROBOTSTXT_OBEY"
MAX_DELAY_SETTING = "RETRY_AFTER_ROBOTSTXT_MAX_DELAY"
DEFAULT_MAX_DELAY = 60.0


@dataclass(frozen=True)
class CrawlDelaySettings:
    obey: bool = True
    """Read Crawl-delay (when ROBOTSTXT_OBEY is on too); False ignores it."""
    max_delay: float = DEFAULT_MAX_DELAY
    """A longer Crawl-delay is capped here (a typo of 86400 must not stall the host for a day)."""
    ignore: frozenset[str] = frozenset()
    """Slots whose RETRY_AFTER_SLOTS entry says ``"ignore_robots_txt": True``."""


def load_crawl_delay_settings(get: Callable[[str], Any]) -> CrawlDelaySettings:
    obey_raw = get(OBEY_SETTING)
    if obey_raw is None:
        obey = True
    elif isinstance(obey_raw, bool):
        obey = obey_raw
    elif isinstance(obey_raw, str) and obey_raw.strip().lower() in ("true", "false", "1", "0"):
        obey = obey_raw.strip().lower() in ("true", "1")
    elif isinstance(obey_raw, int) and obey_raw in (0, 1):
        obey = bool(obey_raw)
    else:
        raise CrawlDelaySettingError(f"{OBEY_SETTING} must be True or False; got {obey_raw!r}")
    raw = get(MAX_DELAY_SETTING)
    if raw is None:
        max_delay = DEFAULT_MAX_DELAY
    else:
        try:
            max_delay = float(raw) if not isinstance(raw, bool) else -1.0
        except (TypeError, ValueError, OverflowError):
            max_delay = -1.0
        if not (math.isfinite(max_delay) and max_delay > 0):
            raise CrawlDelaySettingError(f"{MAX_DELAY_SETTING} must be a number of seconds > 0; got {raw!r}")
    ignore: set[str] = set()
    slots = get("RETRY_AFTER_SLOTS")
    if isinstance(slots, dict):
        for slot, overrides in slots.items():
            if isinstance(overrides, dict) and "ignore_robots_txt" in overrides:
                value = overrides["ignore_robots_txt"]
                if not isinstance(value, bool):
                    raise CrawlDelaySettingError(
                        f"RETRY_AFTER_SLOTS[{slot!r}]['ignore_robots_txt'] must be True or False; got {value!r}"
                    )
                if value:
                    ignore.add(str(slot))
    return CrawlDelaySettings(obey=obey, max_delay=max_delay, ignore=frozenset(ignore))
