"""The settings guard: a typo in a setting's name or a slot key is said, not silently ignored.

Its lines are logged under ``scrapy_retryafter.settings``, beside the errors
of bad values, so a user filtering the log finds every settings message in one place.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .settings import KNOWN_SETTINGS, NOT_YET_READ, Config

__all__ = ["unknown_settings", "unused_slot_keys", "warn_unknown_settings", "warn_unused_slot_keys"]

logger = logging.getLogger("scrapy_retryafter.settings")

_MEANT = {"CAP": "RETRY_AFTER_MAX_DELAY", "RETRIES": "RETRY_AFTER_MAX_RETRIES", "DELAY": "RETRY_AFTER_MAX_DELAY"}
"""Words people reach for that are not close in spelling to the name they mean."""


def _closest(name: str) -> str:
    suffix = name[len("RETRY_AFTER_"):]
    if suffix in _MEANT:
        return _MEANT[suffix]

    def likeness(known: str) -> float:
        tail = known[len("RETRY_AFTER_"):]
        prefix = tail.startswith(suffix) or suffix.startswith(tail)
        return difflib.SequenceMatcher(None, suffix, tail).ratio() + (0.5 if prefix else 0.0)

    return max(sorted(KNOWN_SETTINGS), key=likeness)


def unknown_settings(names: Iterable[Any]) -> list[tuple[str, str]]:
    """(unknown RETRY_AFTER_* name, the closest known name), sorted by name."""
    unknown = {name for name in names if isinstance(name, str) and name.startswith("RETRY_AFTER_")} - KNOWN_SETTINGS
    return [(name, _closest(name)) for name in sorted(unknown)]


def warn_unknown_settings(settings: Mapping[str, Any] | Any, log: logging.Logger = logger) -> list[str]:
    """One WARNING per RETRY_AFTER_* setting the package does not read: a typo is otherwise silent."""
    lines = [
        f"Unknown setting {name} is ignored; did you mean {closest}?"
        for name, closest in unknown_settings(list(settings.keys()))
    ]
    lines += [
        f"{name} is not read by this release yet (scopes are parsed, not applied): it is ignored"
        for name in NOT_YET_READ
        if name in settings
    ]
    for line in lines:
        log.warning("%s", line)
    return lines


def _slot_hint(key: str, used: set[str]) -> str:
    host = urlsplit(key).hostname if "://" in key else None
    if host and host in used:
        return f"a slot is named by its host alone: {host!r}"
    match = difflib.get_close_matches(key, sorted(used), n=1, cutoff=0.6)
    if match:
        return f"did you mean {match[0]!r}?"
    return "a slot is named by the request's host, or by its download_slot meta"


def unused_slot_keys(config: Config, used: Iterable[str]) -> list[str]:
    """A line per RETRY_AFTER_SLOTS key that no request's download slot matched.

    ``used`` is every slot that got a response in this crawl. A key in URL form
    or with a typo never matches, and its overrides silently never apply.
    """
    if not config.enabled:
        return []
    seen = set(used)
    return [
        f"RETRY_AFTER_SLOTS[{key!r}] matched no request's download slot, so its settings never applied; "
        + _slot_hint(key, seen)
        for key in sorted(config.slots)
        if key not in seen
    ]


def warn_unused_slot_keys(config: Config, used: Iterable[str], log: logging.Logger = logger) -> list[str]:
    """Call at spider_closed with the slots that got responses; logs one WARNING per unused key."""
    lines = unused_slot_keys(config, used)
    for line in lines:
        log.warning("%s", line)
    return lines
