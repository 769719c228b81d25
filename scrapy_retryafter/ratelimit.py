"""What a response's rate-limit headers say, before any 429 comes.

Three dialects are in the wild: the IETF structured fields (``RateLimit`` and
``RateLimit-Policy``), the older draft's ``RateLimit-Limit/-Remaining/-Reset``
and the de-facto ``X-RateLimit-*``, whose reset is a delta or an epoch
timestamp depending on the server. Values that make no sense are reported as
invalid rather than trusted: reading an epoch as a delta must never park a
slot for 56 years. Pure: the caller passes the wall-clock time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["RateLimitFacts", "parse_ratelimit", "parse_retry_after_ms", "speaks_ratelimit"]

_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_EPOCH = 1e9  # a reset this large is a timestamp (2001-09-09 onwards), not a delta
_EPOCH_MS = 1e12
_MAX_RESET = 86400.0 * 7

Get = Callable[[bytes], "bytes | None"]


@dataclass(frozen=True)
class RateLimitFacts:
    remaining: float | None = None
    reset: float | None = None
    """Seconds until the quota is refilled."""
    quota: float | None = None
    window: float | None = None
    invalid: bool = False

    @property
    def rate(self) -> float | None:
        """The rate to pace at so that a window never runs dry, requests per second.

        Evenly paced requests land floor(r*w) or floor(r*w)+1 to a window of
        w seconds, whatever its phase: r*w must stay under quota - 1.
        """
        if self.quota and self.window:
            return max(self.quota - 1.5, self.quota / 2) / self.window
        return None


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


def _first_number(text: str | None) -> float | None:
    """``100`` or ``100, 100;w=60``: the leading number."""
    if text is None:
        return None
    return _number(text.split(",")[0].split(";")[0].strip())


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


def _reset(value: float, now_epoch: float) -> float:
    if value >= _EPOCH_MS:
        value = value / 1000.0 - now_epoch
    elif value >= _EPOCH:
        value -= now_epoch
    if value > _MAX_RESET:
        raise _Invalid
    return max(0.0, value)


_PREFIXES = (b"ratelimit", b"x-ratelimit")


def speaks_ratelimit(names: Iterable[bytes]) -> bool:
    """Whether any header name is a rate-limit one: a scan ten times cheaper than parsing."""
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
        states = [(_number(i.get("r")), _number(i.get("t"))) for i in _items(limit) if "r" in i]
        if states:
            remaining, reset = min(states, key=lambda s: s[0] if s[0] is not None else math.inf)
    if policy:
        policies = [(_number(i.get("q")), _number(i.get("w"))) for i in _items(policy) if "q" in i]
        rates = [(q / w if w else math.inf, q, w) for q, w in policies if q is not None and w]
        if rates:
            _, quota, window = min(rates)
    return RateLimitFacts(remaining, reset, quota, window)


def _draft(get: Get, now_epoch: float) -> RateLimitFacts | None:
    remaining = _number(_text(get(b"RateLimit-Remaining")))
    reset_text = _text(get(b"RateLimit-Reset"))
    limit_text = _text(get(b"RateLimit-Limit"))
    if remaining is None and reset_text is None and limit_text is None:
        return None
    reset = _number(reset_text)
    quota = _first_number(limit_text)
    window = None
    if limit_text and "w=" in limit_text:
        window = _number(limit_text.split("w=")[1].split(",")[0].split(";")[0].strip())
    return RateLimitFacts(remaining, None if reset is None else _reset(reset, now_epoch), quota, window)


def _de_facto(get: Get, now_epoch: float) -> RateLimitFacts | None:
    remaining = _number(_text(get(b"X-RateLimit-Remaining")))
    reset_after = _number(_text(get(b"X-RateLimit-Reset-After")))
    reset_text = _text(get(b"X-RateLimit-Reset"))
    if remaining is None and reset_after is None and reset_text is None:
        return None
    reset = reset_after if reset_after is not None else _number(reset_text)
    if reset is not None:
        reset = _reset(reset, now_epoch) if reset_after is None else min(reset, _MAX_RESET)
    quota = _first_number(_text(get(b"X-RateLimit-Limit")))
    return RateLimitFacts(remaining, reset, quota, None)


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
        return None if value is None else value / 1000.0
    return None
