"""What stock Scrapy records for a retry and a give-up, for the package's own retries.

Dashboards and alerts read Scrapy's ``retry/count`` and
``retry/reason_count/<reason>``, and projects tune the give-up line with
``RETRY_GIVE_UP_LOG_LEVEL`` and the ``give_up_log_level`` meta key (Scrapy
2.17+). A retry the package makes, a throttle included, must show there the
way ``scrapy.downloadermiddlewares.retry.get_retry_request`` would record it:
same keys, same reason strings, same level. The ``retry_after/*`` stats stay
beside them.

Everything here is a plain function of its arguments (the Scrapy release's
support for the setting is passed in), so the table tests need no crawl.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol

from scrapy.settings import default_settings
from scrapy.utils.python import global_object_name
from scrapy.utils.response import response_status_message

from .settings import RetryAfterSettingError

__all__ = [
    "add_seconds",
    "GIVE_UP_LEVEL_SETTING",
    "SCRAPY_HAS_GIVE_UP_LEVEL",
    "check_give_up_log_level",
    "count_give_up",
    "count_retry",
    "give_up_log_level",
    "log_level",
    "stock_reason",
]

GIVE_UP_LEVEL_SETTING = "RETRY_GIVE_UP_LOG_LEVEL"
GIVE_UP_LEVEL_META = "give_up_log_level"

SCRAPY_HAS_GIVE_UP_LEVEL: bool = hasattr(default_settings, GIVE_UP_LEVEL_SETTING)
"""Scrapy 2.17 added the setting and the meta key; before, a give-up was always ERROR."""


class Stats(Protocol):
    def inc_value(self, key: str, count: int = 1, start: int = 0) -> None: ...


class SecondsStats(Protocol):
    def get_value(self, key: str, default: Any = None) -> Any: ...
    def set_value(self, key: str, value: Any) -> None: ...


def add_seconds(stats: SecondsStats, key: str, seconds: float) -> None:
    """Add ``seconds`` to a stat that sums seconds, counted in whole milliseconds.

    Summing floats leaves noise in the dump (``5.0440000000000005``): the sum
    is kept as an integer count of milliseconds and stored as ``ms / 1000``,
    whose repr never has more than three decimals. A negative, NaN or
    infinite amount adds nothing; a stored value that is not a number
    (another extension's) is left alone.
    """
    if not math.isfinite(seconds) or seconds <= 0:
        return
    current = stats.get_value(key, 0)
    if isinstance(current, bool) or not isinstance(current, (int, float)) or not math.isfinite(current):
        return
    stats.set_value(key, (round(current * 1000) + round(seconds * 1000)) / 1000)


def stock_reason(reason: int | str | BaseException | type[BaseException]) -> str:
    """The reason string stock Scrapy puts in ``retry/reason_count/<reason>``.

    A status is ``response_status_message(status)`` ("429 Too Many Requests"),
    an exception (instance or class) its qualified class name
    ("twisted.internet.error.TimeoutError"), a string itself.
    """
    if isinstance(reason, bool):
        return str(reason)
    if isinstance(reason, int):
        return response_status_message(reason)
    if isinstance(reason, BaseException):
        return global_object_name(type(reason))
    if isinstance(reason, type) and issubclass(reason, BaseException):
        return global_object_name(reason)
    return str(reason)


def count_retry(stats: Stats, reason: int | str | BaseException | type[BaseException], base: str = "retry") -> str:
    """Counts one retry as stock Scrapy does; returns the reason string used.

    Call it once per retry request the package makes and stock Scrapy would
    not have counted (a throttle, a retry not made through get_retry_request).
    """
    label = stock_reason(reason)
    stats.inc_value(f"{base}/count")
    stats.inc_value(f"{base}/reason_count/{label}")
    return label


def count_give_up(stats: Stats, base: str = "retry") -> None:
    """Stock Scrapy's ``retry/max_reached``: a request whose retries ran out."""
    stats.inc_value(f"{base}/max_reached")


def log_level(value: Any) -> int | None:
    """A logging level from a name ("ERROR", "warning") or a number; None when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        level = logging.getLevelName(value.strip().upper())
        return level if isinstance(level, int) else None
    return None


def check_give_up_log_level(settings: Mapping[str, Any] | Any, supported: bool = SCRAPY_HAS_GIVE_UP_LEVEL) -> None:
    """Fails at crawl start on a RETRY_GIVE_UP_LOG_LEVEL that is not a level (stock fails at the first give-up)."""
    if not supported:
        return
    value = settings.get(GIVE_UP_LEVEL_SETTING, "ERROR")
    if log_level(value) is None:
        raise RetryAfterSettingError(
            f"{GIVE_UP_LEVEL_SETTING} must be a logging level name (DEBUG, INFO, WARNING, ERROR, "
            f"CRITICAL) or a non-negative number; got {value!r}"
        )


def give_up_log_level(
    meta: Mapping[str, Any], setting: Any, supported: bool = SCRAPY_HAS_GIVE_UP_LEVEL
) -> int:
    """The level of the give-up line for a request, as stock RetryMiddleware picks it.

    On Scrapy 2.17+: the request's ``give_up_log_level`` meta key, else (absent
    or None) RETRY_GIVE_UP_LOG_LEVEL. Before 2.17: ERROR. A meta value that is
    not a level falls back to the setting, then to ERROR: stock raises
    ValueError there, which would crash the callback chain of one request
    over a logging detail.
    """
    if not supported:
        return logging.ERROR
    for value in (meta.get(GIVE_UP_LEVEL_META), setting):
        if value is None:
            continue
        level = log_level(value)
        if level is not None:
            return level
    return logging.ERROR
