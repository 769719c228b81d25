"""Scrapy crawls that survive rate limiters: obey Retry-After per download slot.

The names below are imported on first use, not with the package: Scrapy
imports ``scrapy_retryafter.commands`` through its ``scrapy.commands`` entry
point on every ``scrapy`` call, in every project, and a failure there would
break every Scrapy command, so importing the package itself does nothing
that can fail.

Public: these names, the class paths the settings name, ``signals`` and
``testing``; every other module is internal and may change in any release
(the manual's "What you may import").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .addon import Addon
    from .board import CooldownBoard
    from .extension import RetryAfterExtension
    from .headers import parse_http_date, parse_retry_after
    from .logstats import RetryAfterLogStats
    from .middleware import RetryAfterMiddleware
    from .policy import Decision, SlotPolicy, decide
    from .pqueue import CooldownAwarePriorityQueue
    from .retry import RetryMiddleware
    from .settings import RetryAfterSettingError, load_config

_WHERE = {
    "Addon": "addon",
    "CooldownAwarePriorityQueue": "pqueue",
    "CooldownBoard": "board",
    "Decision": "policy",
    "RetryAfterExtension": "extension",
    "RetryAfterLogStats": "logstats",
    "RetryAfterMiddleware": "middleware",
    "RetryAfterSettingError": "settings",
    "RetryMiddleware": "retry",
    "SlotPolicy": "policy",
    "decide": "policy",
    "load_config": "settings",
    "parse_http_date": "headers",
    "parse_retry_after": "headers",
}

__all__ = [
    "Addon",
    "CooldownAwarePriorityQueue",
    "CooldownBoard",
    "Decision",
    "RetryAfterExtension",
    "RetryAfterLogStats",
    "RetryAfterMiddleware",
    "RetryAfterSettingError",
    "RetryMiddleware",
    "SlotPolicy",
    "__version__",
    "decide",
    "load_config",
    "parse_http_date",
    "parse_retry_after",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        # ``scrapy_retryafter.signals`` after a bare ``import scrapy_retryafter``, as before.
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
