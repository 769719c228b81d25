"""Scrapy crawls that survive rate limiters: obey Retry-After per download slot."""

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
    "decide",
    "load_config",
    "parse_http_date",
    "parse_retry_after",
]
