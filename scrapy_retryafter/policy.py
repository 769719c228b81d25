"""What to do with one throttling response: pure, so every rule is a table row.

The decision says how long the slot cools down and whether the request is
retried; the middleware carries it out. Keeping the two apart means the
rules from the reference (Retry-After wins, pad it, cap it, bound retries,
never repeat a non-idempotent request that may have run) are tested without
a crawl.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from .backoff import Backoff, Uniform

__all__ = ["IDEMPOTENT_METHODS", "Decision", "SlotPolicy", "decide", "spider_handles"]

_REFUSE_AT_MOST = 7 * 86400.0
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


@dataclass(frozen=True)
class SlotPolicy:
    """Every value a user may set globally or per slot (RETRY_AFTER_SLOTS)."""

    http_codes: frozenset[int] = field(default_factory=lambda: frozenset({429, 503}))
    pad: float = 1.25
    max_delay: float = 300.0
    max_retries: int = 4
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    wake_jitter: float = 1.0
    adaptive: bool = True
    """Pace the slot at a learned rate after its first throttle."""
    ratelimit_headers: bool = True
    """Act on RateLimit / X-RateLimit headers before a throttle comes."""
    circuit_threshold: int = 25
    circuit_open_seconds: float = 600.0
    budget_max_tokens: float = 10.0
    budget_token_ratio: float = 0.1
    backoff_strategy: str = "full"
    """How waits the server did not announce are drawn (backoff.STRATEGIES)."""
    deadline: float = math.inf
    """Seconds from a request's first attempt after which no retry is made."""
    server_error_methods: frozenset[str] = field(default_factory=lambda: frozenset({"GET", "HEAD"}))
    """Methods retried after a 500 (often a bug that fails every time)."""
    host_down_threshold: int = 5
    """Connection failures in a row (DNS, refused) that pause the whole slot."""

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.backoff_strategy, self.backoff_base, self.backoff_max)


@dataclass(frozen=True)
class Decision:
    retry: bool
    cooldown: float
    """Seconds the whole slot waits from now (0.0: no cooldown)."""
    refuse: float
    """Seconds the slot's requests are given up unsent (Retry-After over the cap)."""
    reason: str
    outcome: str = "retry"
    """``retry``, or why not: ``over_cap``, ``not_repeatable``, ``retries_exhausted``, ``budget_spent``."""


def decide(
    policy: SlotPolicy,
    *,
    status: int,
    method: str,
    has_idempotency_key: bool,
    throttles: int,
    retry_after: float | None,
    max_retries: int | None = None,
    budget_spent: bool = False,
    rng: Uniform = random,
    previous_wait: float | None = None,
) -> Decision:
    """Decide for a request throttled for the ``throttles``-th time (1-based).

    ``previous_wait`` is the request's last backoff, which decorrelated jitter grows from.
    """
    limit = policy.max_retries if max_retries is None else max_retries
    # Checked before the cap: a request that may have run is never parked to be replayed later.
    repeatable = status == 429 or method.upper() in IDEMPOTENT_METHODS or has_idempotency_key
    not_repeatable = f"{method.upper()} without Idempotency-Key is not repeated after {status}"
    if retry_after is not None and retry_after > policy.max_delay:
        refuse = min(retry_after, _REFUSE_AT_MOST)
        over_cap = f"Retry-After {retry_after:g}s is over the {policy.max_delay:g}s cap"
        if not repeatable:
            return Decision(False, 0.0, refuse, f"{not_repeatable} ({over_cap})", "not_repeatable")
        return Decision(False, 0.0, refuse, over_cap, "over_cap")
    if retry_after is not None and retry_after > 0:
        cooldown = retry_after * policy.pad
        why = f"Retry-After {retry_after:g}s x{policy.pad:g}"
    else:
        cooldown = policy.backoff.wait(throttles, previous_wait, rng)
        why = "no usable Retry-After, backoff"
    if not repeatable:
        return Decision(False, cooldown, 0.0, not_repeatable, "not_repeatable")
    if throttles > limit:
        return Decision(False, cooldown, 0.0, f"{limit} retries exhausted", "retries_exhausted")
    if budget_spent and not (retry_after is not None and retry_after > 0):
        return Decision(False, cooldown, 0.0, "retry budget spent: too many blind retries of late", "budget_spent")
    return Decision(True, cooldown, 0.0, why)


def spider_handles(
    status: int,
    meta: Mapping[str, Any],
    spider_codes: Any,
    *,
    allow_all: bool,
    allowed_codes: Collection[Any],
) -> bool:
    """Whether Scrapy's HttpErrorMiddleware would hand a ``status`` response to the callback.

    The same order as stock: the request's meta, then HTTPERROR_ALLOW_ALL, then the spider's
    ``handle_httpstatus_list`` (``spider_codes``, None when it has none), then HTTPERROR_ALLOWED_CODES.
    A spider that asked for the status gets the final response instead of having it parked.
    A value that is not a collection of codes allows nothing (stock would fail on it).
    """
    if 200 <= status < 300 or meta.get("handle_httpstatus_all", False):
        return True
    if "handle_httpstatus_list" in meta:
        allowed = meta["handle_httpstatus_list"]
    elif allow_all:
        return True
    else:
        allowed = allowed_codes if spider_codes is None else spider_codes
    try:
        return status in allowed
    except TypeError:
        return False
