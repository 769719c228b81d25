"""Converters and checks for setting values: each raises on a value it cannot use.

Shared by the crawl's settings and the Redis connection settings, so every
setting reports a bad value the same way: its name, what it accepts, and what
it got.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from .backoff import STRATEGIES

__all__ = [
    "HTTP_METHODS",
    "Check",
    "RetryAfterSettingError",
    "boolean",
    "checked_with",
    "deadline_seconds",
    "http_methods",
    "integer",
    "number",
    "status_codes",
    "strategy_name",
    "text",
]


class RetryAfterSettingError(ValueError):
    """A RETRY_AFTER_* setting has a value the package cannot use."""


def number(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError
    number = float(value)
    if not math.isfinite(number):
        raise ValueError
    return number


def integer(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, float) and not value.is_integer():
        raise ValueError
    return int(value)


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError


def status_codes(value: Any) -> frozenset[int]:
    if isinstance(value, Mapping):
        raise TypeError
    if isinstance(value, str):
        value = [part for part in value.replace(",", " ").split() if part]
    codes = frozenset(integer(code) for code in value)
    if not codes or any(not 100 <= code <= 599 for code in codes):
        raise ValueError
    return codes


def strategy_name(value: Any) -> str:
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in STRATEGIES:
        raise ValueError
    return name


def deadline_seconds(value: Any) -> float:
    """None (or 0) means no deadline, so a per-slot override can lift a global one."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return math.inf
    seconds = number(value)
    return math.inf if seconds == 0 else seconds


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
"""RFC 9110's methods and PATCH: a name outside them is a typo more often than a custom method."""


def http_methods(value: Any) -> frozenset[str]:
    if isinstance(value, Mapping):
        raise TypeError
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not all(isinstance(method, str) and method.strip().upper() in HTTP_METHODS for method in value):
        raise ValueError
    return frozenset(method.strip().upper() for method in value)


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


Check = tuple[Callable[[Any], Any], Callable[[Any], bool], str]


def checked_with(check: Check, name: str, raw: Any) -> Any:
    convert, ok, accepted = check
    try:
        value = convert(raw)
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or not ok(value):
        raise RetryAfterSettingError(f"{name} must be {accepted}; got {raw!r}")
    return value
