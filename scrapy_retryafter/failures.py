"""Which failed attempt may be tried again, when, and until when: pure.

Scrapy retries every code in RETRY_HTTP_CODES and every exception in
RETRY_EXCEPTIONS for any method, at once. A retry is only safe when the
failure can pass and repeating the request cannot do the work twice; it is
only kind when it waits longer each time, and only useful before the caller's
deadline. The rules live here, as a table, so they are tested without a crawl;
the RetryMiddleware shell carries them out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .backoff import Backoff, Uniform
from .policy import IDEMPOTENT_METHODS

__all__ = [
    "sent_at",
    "STARTED",
    "DEADLINE",
    "NOT_BEFORE",
    "PREVIOUS_WAIT",
    "ConsecutiveFailures",
    "FailureDecision",
    "Rule",
    "classify_exception",
    "classify_status",
    "deadline_of",
    "decide_failure",
    "host_down_wait",
    "past_deadline",
    "qualified_names",
    "stamp_first_attempt",
]

STARTED = "retry_after_started"
"""Meta: wall-clock time the request was first handed to the downloader."""
DEADLINE = "retry_after_deadline"
"""Meta: seconds from the first attempt after which no retry is made."""
NOT_BEFORE = "retry_after_not_before"
"""Meta: wall-clock time before which a retry must not leave the scheduler."""
PREVIOUS_WAIT = "retry_after_backoff"
"""Meta: the last backoff wait, for decorrelated jitter."""


class Rule(Enum):
    """For which methods a failure may be retried."""

    ANY_METHOD = "any method"
    """The request never reached the application (DNS failure, connection refused)."""
    IDEMPOTENT = "idempotent methods or an Idempotency-Key"
    """The server may have done the work; only the answer was lost."""
    LISTED_METHODS = "the methods in RETRY_AFTER_SERVER_ERROR_METHODS"
    """500: often a bug that fails every time; retry only reads known to be safe."""
    NEVER = "never"
    """The request itself is wrong: the same request fails again."""


# Matched on "module.qualname" along the exception's MRO, so the table needs
# no Twisted or Scrapy import and covers each Scrapy version's names.
_NOT_REACHED = frozenset({
    "twisted.internet.error.DNSLookupError",
    "twisted.internet.error.ConnectionRefusedError",
    "scrapy.exceptions.CannotResolveHostError",
    "scrapy.exceptions.DownloadConnectionRefusedError",
    "builtins.ConnectionRefusedError",
    "socket.gaierror",
})

_STATUS_RULES: Mapping[int, Rule] = {
    408: Rule.IDEMPOTENT,
    429: Rule.ANY_METHOD,  # not processed; reaches this table only when not a throttle code
    500: Rule.LISTED_METHODS,
}


def classify_status(status: int) -> Rule:
    """The rule for a status Scrapy's RETRY_HTTP_CODES lists."""
    rule = _STATUS_RULES.get(status)
    if rule is not None:
        return rule
    if 500 <= status <= 599:
        return Rule.IDEMPOTENT  # 502, 503, 504, 522, 524 and other gateway or overload answers
    return Rule.NEVER


def classify_exception(names: Iterable[str]) -> Rule:
    """The rule for an exception RETRY_EXCEPTIONS lists, from its classes' qualified names.

    Scrapy raises the same error for a connect and a read timeout, and a read
    timeout may come after the server did the work, so a timeout counts as
    "may have been processed"; so do resets and connections lost mid-response.
    """
    return Rule.ANY_METHOD if any(name in _NOT_REACHED for name in names) else Rule.IDEMPOTENT


def qualified_names(exception: BaseException) -> list[str]:
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in type(exception).__mro__]


def method_allowed(
    rule: Rule, method: str, has_idempotency_key: bool, server_error_methods: Collection[str]
) -> bool:
    method = method.upper()
    if rule is Rule.ANY_METHOD:
        return True
    if rule is Rule.IDEMPOTENT:
        return method in IDEMPOTENT_METHODS or has_idempotency_key
    if rule is Rule.LISTED_METHODS:
        return method in server_error_methods
    return False


def deadline_of(meta: Mapping[str, Any], default: float) -> float:
    """The request's deadline in seconds (math.inf: none); a bad meta value falls back to the default."""
    raw = meta.get(DEADLINE)
    if raw is None or isinstance(raw, bool):
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return default
    return value if value > 0 and not math.isnan(value) else default


def stamp_first_attempt(meta: dict[str, Any], wall: Callable[[], float], deadlines: bool) -> None:
    """Remember when a request was first sent, where a deadline may apply to it."""
    if STARTED not in meta and (deadlines or DEADLINE in meta):
        meta[STARTED] = wall()


def past_deadline(meta: Mapping[str, Any], default: float, now: float, wait: float) -> str | None:
    """Why a retry ``wait`` seconds from ``now`` (wall clock) is not made, or None if it fits.

    Checked before the wait, so a request that cannot make it gives up now
    instead of after one more doomed wait.
    """
    deadline = deadline_of(meta, default)
    if math.isinf(deadline):
        return None
    started = meta.get(STARTED)
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        return None
    ends = now + wait - started
    if ends <= deadline:
        return None
    return f"a retry in {wait:.2f}s would end {ends:.2f}s after the first attempt, past the {deadline:g}s deadline"


@dataclass(frozen=True)
class FailureDecision:
    retry: bool
    wait: float
    """Seconds the retry waits in the scheduler (0.0 when not retried)."""
    reason: str
    gave_up: bool
    """True when the request could have been retried but a bound stopped it
    (retries exhausted, deadline): it goes through the give-up path."""


def decide_failure(
    rule: Rule,
    *,
    method: str,
    has_idempotency_key: bool,
    server_error_methods: Collection[str],
    attempt: int,
    max_retries: int,
    backoff: Backoff,
    previous_wait: float | None,
    meta: Mapping[str, Any],
    deadline: float,
    now: float,
    rng: Uniform = random,
    host_paused: float | None = None,
) -> FailureDecision:
    """Decide for the ``attempt``-th retry (1-based) of a request that failed under ``rule``.

    ``host_paused`` is given when the request failed while its host was paused for an outage
    (hostpause.py), as the seconds to its next probe: the failure is the host's, so it spends
    none of the request's retries, and the request waits for its slot (wait 0.0), not for a
    backoff of its own. Only its method and its deadline still stop it.
    """
    if not method_allowed(rule, method, has_idempotency_key, server_error_methods):
        why = "the request itself is wrong" if rule is Rule.NEVER else f"retried only for {rule.value}"
        return FailureDecision(False, 0.0, f"{method.upper()} not repeated: {why}", gave_up=False)
    if host_paused is not None:
        late = past_deadline(meta, deadline, now, host_paused)
        if late is not None:
            return FailureDecision(False, 0.0, late, gave_up=True)
        return FailureDecision(True, 0.0, "host paused by an outage: held for it, no retry spent", gave_up=False)
    if attempt > max_retries:
        return FailureDecision(False, 0.0, f"{max_retries} retries exhausted", gave_up=True)
    wait = backoff.wait(attempt, previous_wait, rng)
    late = past_deadline(meta, deadline, now, wait)
    if late is not None:
        return FailureDecision(False, 0.0, late, gave_up=True)
    return FailureDecision(True, wait, f"{backoff.name} jitter backoff, attempt {attempt}", gave_up=False)


class ConsecutiveFailures:
    """Connection failures in a row per slot: a burst of them means the host is down.

    One refused connection says little; several in a row say the host, not
    the request, is the problem, so the whole slot should pause. The board
    owns it and prunes it in its sweep: a broad crawl over dead hosts must
    not grow it without bound.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, float]] = {}
        """Slot -> (failures in a row, when the last one happened)."""

    def __bool__(self) -> bool:
        return bool(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, slot: str) -> bool:
        return slot in self._counts

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def failed(self, slot: str, now: float) -> int:
        count = self._counts.get(slot, (0, now))[0] + 1
        self._counts[slot] = (count, now)
        return count

    def reached(self, slot: str) -> None:
        """The host answered: whatever came before was not an outage."""
        self._counts.pop(slot, None)

    def prune(self, before: float) -> int:
        """Forget the streaks whose last failure is older than ``before``; return how many."""
        stale = [slot for slot, (_, last) in self._counts.items() if last < before]
        for slot in stale:
            del self._counts[slot]
        return len(stale)


def host_down_wait(count: int, threshold: int, backoff: Backoff, rng: Uniform = random) -> float | None:
    """Seconds to pause a slot after ``count`` connection failures in a row, or None below ``threshold``.

    The pause grows with the streak, from the backoff's first wait at the threshold on.
    """
    if count < threshold:
        return None
    return backoff.wait(count - threshold + 1, rng=rng)


def sent_at(meta: Mapping[str, Any], now: float) -> float:
    """When a request now answered left, on the board's clock: its answer came ``download_latency`` after."""
    latency = meta.get("download_latency")
    return now - (float(latency) if isinstance(latency, (int, float)) and 0 < latency < math.inf else 0.0)
