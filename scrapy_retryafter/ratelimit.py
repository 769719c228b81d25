"""What a response's rate-limit headers say, before any 429 comes.

Three dialects are in the wild: the IETF structured fields (``RateLimit`` and
``RateLimit-Policy``), the older draft's ``RateLimit-Limit/-Remaining/-Reset``
and the de-facto ``X-RateLimit-*``, whose reset is a delta or an epoch
timestamp depending on the server. Values that make no sense are reported as
invalid rather than trusted: reading an epoch as a delta must never park a
slot for 56 years. Every number is bounded before it leaves: resets and
windows at a week, counts at a billion, a stated pace at a million requests
per second, so no quota from one a week to a million a second overflows
anything downstream. Pure: the caller passes the wall-clock time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

__all__ = ["RateLimitFacts", "parse_ratelimit", "parse_retry_after_ms", "quota_pace", "speaks_ratelimit"]

_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_EPOCH = 1e9  # a reset this large is a timestamp (2001-09-09 onwards), not a delta
_EPOCH_MS = 1e12
MAX_RESET = 86400.0 * 7
"""The longest reset or window believed: a slot is never refused for longer."""
_MIN_WINDOW = 0.001
_MAX_COUNT = 1e9
"""More than any quota or remainder a server means: a longer digit string is clipped, not trusted to infinity."""
MAX_RATE = 1e6
"""The fastest stated pace kept, requests per second: faster is no pace at all."""

Get = Callable[[bytes], "bytes | None"]


@dataclass(frozen=True)
class RateLimitFacts:
    remaining: float | None = None
    reset: float | None = None
    """Seconds until the quota is refilled."""
    quota: float | None = None
    window: float | None = None
    """Seconds, between a millisecond and a week."""
    invalid: bool = False
    reset_at: float | None = None
    """The reset as the epoch timestamp the server sent, when it sent one."""

    @property
    def rate(self) -> float | None:
        """The rate to pace at so that a window never runs dry, requests per second."""
        if self.quota and self.window:
            return quota_pace(self.quota, self.window)
        return None


def quota_pace(quota: float, window: float) -> float:
    """Requests spaced 1/r apart land at most floor(r*w)+1 to a window of w
    seconds, whatever its phase; at r = (q-1)/w, q+1 of them would need q
    intervals inside one window even after the board's late-release credit
    (a tenth of an interval), so no window gets more than its quota."""
    return min(max(quota - 1.0, quota / 2) / max(window, _MIN_WINDOW), MAX_RATE)


class _Invalid(ValueError):
    pass


_MAX_LENGTH = 1024


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    if len(raw) > _MAX_LENGTH:
        raise _Invalid
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise _Invalid from None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    if not _NUMBER.fullmatch(text):
        raise _Invalid
    return float(text)


def _count(text: str | None) -> float | None:
    value = _number(text)
    return None if value is None else min(value, _MAX_COUNT)


def _seconds(text: str | None) -> float | None:
    value = _number(text)
    return None if value is None else _bounded_reset(value)


def _bounded_reset(value: float) -> float:
    """Between 0 and a week, and never so near 0 that a quota spread over it is infinite."""
    if value <= 0.0:
        return 0.0
    return min(max(value, _MIN_WINDOW), MAX_RESET)


def _window(text: str | None) -> float | None:
    """A window of 0 says nothing; one of a billion seconds is read as a week."""
    value = _number(text)
    if not value:
        return None
    return min(max(value, _MIN_WINDOW), MAX_RESET)


def _first_number(text: str | None) -> float | None:
    """``100`` or ``100, 100;w=60``: the leading number."""
    if text is None:
        return None
    return _count(text.split(",")[0].split(";")[0].strip())


def _items(text: str) -> list[dict[str, str]]:
    """A structured-field list of ``"name";k=v;k=v`` items (names may be quoted)."""
    items = []
    for item in re.split(r',(?=(?:[^"]*"[^"]*")*[^"]*$)', text):
        parts = [part.strip() for part in item.split(";")]
        params = {}
        for part in parts[1:]:
            key, _, value = part.partition("=")
            params[key.strip()] = value.strip()
        params[""] = parts[0].strip('"')
        items.append(params)
    return items


def _reset(value: float, now_epoch: float) -> tuple[float, float | None]:
    """Seconds until the reset, and the epoch it happens at if the value was one."""
    reset_at = None
    if value >= _EPOCH_MS:
        reset_at = value / 1000.0
    elif value >= _EPOCH:
        reset_at = value
    if reset_at is not None:
        value = reset_at - now_epoch
    if value > MAX_RESET:
        raise _Invalid
    return _bounded_reset(value), reset_at


_PREFIXES = (b"ratelimit", b"x-ratelimit")


def speaks_ratelimit(names: Collection[bytes]) -> bool:
    """Whether any header name is a rate-limit one: a scan ten times cheaper than parsing.

    Most answers have none: one search of the names joined settles it, and only
    names that mention "ratelimit" somewhere are looked at one by one."""
    if b"ratelimit" not in b"".join(names).lower():
        return False
    return any(name.lower().startswith(_PREFIXES) for name in names)


def parse_ratelimit(get: Get, now_epoch: float) -> RateLimitFacts | None:
    """Facts from whichever dialect the response speaks; None when it speaks none."""
    try:
        facts = _ietf(get) or _draft(get, now_epoch) or _de_facto(get, now_epoch)
    except (_Invalid, ValueError, OverflowError):
        return RateLimitFacts(invalid=True)
    if facts is None:
        return None
    for value in (facts.remaining, facts.reset, facts.quota, facts.window):
        if value is not None and not math.isfinite(value):
            return RateLimitFacts(invalid=True)
    return facts


def _ietf(get: Get) -> RateLimitFacts | None:
    limit, policy = _text(get(b"RateLimit")), _text(get(b"RateLimit-Policy"))
    if limit is None or "r=" not in limit:
        if policy is None or "q=" not in policy:
            return None
    remaining = reset = quota = window = None
    if limit:
        # Several policies: the one with the least left is the one that binds.
        states = [(_count(i.get("r")), _seconds(i.get("t"))) for i in _items(limit) if "r" in i]
        if states:
            remaining, reset = min(states, key=lambda s: s[0] if s[0] is not None else math.inf)
    if policy:
        policies = [(_count(i.get("q")), _window(i.get("w"))) for i in _items(policy) if "q" in i]
        rates = [(q / w if w else math.inf, q, w) for q, w in policies if q is not None and w]
        if rates:
            _, quota, window = min(rates)
    return RateLimitFacts(remaining, reset, quota, window)


def _draft(get: Get, now_epoch: float) -> RateLimitFacts | None:
    remaining = _count(_text(get(b"RateLimit-Remaining")))
    reset_text = _text(get(b"RateLimit-Reset"))
    limit_text = _text(get(b"RateLimit-Limit"))
    if remaining is None and reset_text is None and limit_text is None:
        return None
    reset = _number(reset_text)
    quota = _first_number(limit_text)
    window = None
    if limit_text and "w=" in limit_text:
        window = _window(limit_text.split("w=")[1].split(",")[0].split(";")[0].strip())
    reset_at = None
    if reset is not None:
        reset, reset_at = _reset(reset, now_epoch)
    return RateLimitFacts(remaining, reset, quota, window, reset_at=reset_at)


def _de_facto(get: Get, now_epoch: float) -> RateLimitFacts | None:
    remaining = _count(_text(get(b"X-RateLimit-Remaining")))
    reset_after = _seconds(_text(get(b"X-RateLimit-Reset-After")))
    reset_text = _text(get(b"X-RateLimit-Reset"))
    if remaining is None and reset_after is None and reset_text is None:
        return None
    reset = reset_after if reset_after is not None else _number(reset_text)
    reset_at = None
    if reset is not None:
        if reset_after is None:
            reset, reset_at = _reset(reset, now_epoch)
    quota = _first_number(_text(get(b"X-RateLimit-Limit")))
    return RateLimitFacts(remaining, reset, quota, None, reset_at=reset_at)


def parse_retry_after_ms(get: Get) -> float | None:
    """Seconds from ``retry-after-ms`` or ``x-ms-retry-after-ms``, or None."""
    for name in (b"Retry-After-Ms", b"X-Ms-Retry-After-Ms"):
        raw = get(name)
        if raw is None:
            continue
        try:
            value = _number(_text(raw))
        except _Invalid:
            return None
        return None if value is None else min(value / 1000.0, MAX_RESET)
    return None
