"""Throttles that do not say 429: other statuses, ban and CAPTCHA pages, even with a 200.

A server that limits a crawler does not always answer 429 or 503: Shopify
answers 430, Cloudflare a 429 whose page reads "error code: 1015" or a 403
challenge page, many sites a 200 CAPTCHA page. Passing such a page to the
spider loses the page (the callback finds nothing) and keeps hammering the
server. RETRY_AFTER_BAN_RULES lists what else counts as a throttle; the shell
then handles the response as it handles a 429 (the server's Retry-After when
there is one, backoff otherwise).

Pure: no Scrapy, no Twisted. Regular expressions are compiled once, at start;
a body is scanned only up to RETRY_AFTER_BAN_BODY_BYTES, and a header value up
to 8 KiB, however large the response.

    RETRY_AFTER_BAN_RULES = [
        "cloudflare",                                   # a preset: one line
        {"status": 430},
        {"status": 403, "body": r"(?i)access denied"},
        {"status": 200, "body": r"(?i)<title>[^<]*captcha", "name": "captcha"},
        {"header": {"X-Blocked": ""}},                  # the header's presence
    ]

A spider can flag a response itself by raising `BanDetected` from its
callback (the package's spider middleware catches it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BAN_RULES_SETTING",
    "BODY_BYTES_SETTING",
    "PRESETS",
    "BanDetected",
    "BanRule",
    "BanRuleSettingError",
    "BanRules",
    "load_ban_rules",
    "parse_ban_rules",
]

BAN_RULES_SETTING = "RETRY_AFTER_BAN_RULES"
BODY_BYTES_SETTING = "RETRY_AFTER_BAN_BODY_BYTES"
DEFAULT_BODY_BYTES = 65536
_MAX_BODY_BYTES = 4 * 1024 * 1024
_MAX_HEADER_CHARS = 8192
_MAX_REASON_CHARS = 80


class BanRuleSettingError(ValueError):
    """RETRY_AFTER_BAN_RULES or RETRY_AFTER_BAN_BODY_BYTES has a value the package cannot use."""


class BanDetected(Exception):
    """Raise from a spider callback to say "this response is a ban": the package
    throttles the response's scopes and retries its request, as for a 429.

        def parse(self, response):
            if response.css("form#captcha"):
                raise BanDetected("captcha form")

    ``retry_after`` (seconds) is the wait when the page says how long; without
    it the wait is the backoff's.
    """

    def __init__(self, reason: str = "flagged by the spider", retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = _reason(reason) or "flagged by the spider"
        self.retry_after = _wait(retry_after)


def _reason(text: Any) -> str:
    """A reason fit for a log line and a stat name: one short line."""
    return " ".join(str(text).split())[:_MAX_REASON_CHARS]


def _wait(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < float("inf") else None


@dataclass(frozen=True)
class BanRule:
    """Every condition given must hold: the status, each header, the body."""

    name: str
    statuses: frozenset[int] | None = None
    """None: any status."""
    headers: tuple[tuple[str, re.Pattern[str] | None], ...] = ()
    """(lower-case name, pattern or None for "present")."""
    body: re.Pattern[str] | None = None


@dataclass(frozen=True)
class BanRules:
    rules: tuple[BanRule, ...] = ()
    body_bytes: int = DEFAULT_BODY_BYTES

    @property
    def statuses(self) -> frozenset[int] | None:
        """Statuses some rule may match; None when a rule matches any status.

        The shell skips a response whose status is not here without reading it.
        """
        found: set[int] = set()
        for rule in self.rules:
            if rule.statuses is None:
                return None
            found |= rule.statuses
        return frozenset(found)

    @property
    def reads_body(self) -> bool:
        return any(rule.body is not None for rule in self.rules)

    def match(self, status: int, headers: Any, body: bytes | str | None) -> str | None:
        """The name of the first rule the response matches, or None.

        ``headers``: any mapping (Scrapy's Headers included) of name to a value
        or a list of values, str or bytes. ``body``: the decompressed body, or
        as much of it as the caller has; only its first ``body_bytes`` are read.
        """
        candidates = [rule for rule in self.rules if rule.statuses is None or status in rule.statuses]
        if not candidates:
            return None
        header_text: dict[str, str] | None = None
        body_text: str | None = None
        for rule in candidates:
            if rule.headers:
                if header_text is None:
                    header_text = _headers(headers)
                if not all(
                    name in header_text and (pattern is None or pattern.search(header_text[name]))
                    for name, pattern in rule.headers
                ):
                    continue
            if rule.body is not None:
                if body_text is None:
                    body_text = _prefix(body, self.body_bytes)
                if not rule.body.search(body_text):
                    continue
            return rule.name
        return None


def _headers(headers: Any) -> dict[str, str]:
    """Lower-case name to its values joined by ", ", each part bounded."""
    items: Iterable[tuple[Any, Any]]
    if headers is None:
        return {}
    items = headers.items() if hasattr(headers, "items") else headers
    result: dict[str, str] = {}
    for name, value in items:
        key = _text(name, 256).lower()
        values = value if isinstance(value, (list, tuple)) else [value]
        joined = ", ".join(_text(part, _MAX_HEADER_CHARS) for part in values if part is not None)
        result[key] = (result[key] + ", " + joined if key in result else joined)[:_MAX_HEADER_CHARS]
    return result


def _text(value: Any, limit: int) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value[:limit]).decode("latin-1")
    return str(value)[:limit]


def _prefix(body: bytes | str | None, limit: int) -> str:
    if body is None:
        return ""
    if isinstance(body, str):
        return body[:limit]
    return bytes(body[:limit]).decode("utf-8", "replace")


# The presets: off by default, one line each to enable. Sources: Cloudflare's
# documentation (challenge pages carry "cf-mitigated: challenge"; error 1015 is
# its rate limit, served with Retry-After), Shopify's 430 "Security Rejection".
PRESETS: dict[str, tuple[dict[str, Any], ...]] = {
    "cloudflare": (
        {"name": "cloudflare-1015", "status": [403, 429, 503],
         "body": r"(?i)error code:?\s*1015\b|cf-error-code[^>]*>\s*1015\b|\berror 1015\b"},
        {"name": "cloudflare-challenge", "header": {"cf-mitigated": r"(?i)^\s*challenge\s*$"}},
        {"name": "cloudflare-challenge", "status": [403, 429, 503], "header": {"server": r"(?i)cloudflare"},
         "body": r"(?i)<title>\s*just a moment\.\.\.\s*</title>|window\._cf_chl_opt"},
    ),
    "shopify": ({"name": "shopify-430", "status": [430]},),
}

_ACCEPTED = (
    "a list of rules, each a preset name (" + ", ".join(map(repr, PRESETS)) + ") or a dict with any of "
    "'status' (a status code or a list of them), 'body' (a regular expression searched in the body), "
    "'header' (a dict of header name to a regular expression, '' for present) and 'name' (the reason logged), "
    "with at least one of status, body or header"
)


def _fail(where: str, raw: Any, why: str) -> BanRuleSettingError:
    return BanRuleSettingError(f"{where} must be {_ACCEPTED}; got {raw!r}: {why}")


def _compile(pattern: Any, what: str, where: str, raw: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise _fail(where, raw, f"{what} {pattern!r} is not a string")
    try:
        return re.compile(pattern)
    except re.error as error:
        raise _fail(where, raw, f"{what} {pattern!r} is not a regular expression ({error})") from None


def _statuses(value: Any, where: str, raw: Any) -> frozenset[int]:
    values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599 for v in values):
        raise _fail(where, raw, f"status {value!r} is not an HTTP status code from 100 to 599 (or a list of them)")
    return frozenset(values)


_KEYS = frozenset({"status", "body", "header", "name"})


def _rule(entry: Mapping[str, Any], where: str, raw: Any) -> BanRule:
    unknown = sorted(set(entry) - _KEYS, key=str)
    if unknown:
        raise _fail(where, raw, f"unknown key(s) {', '.join(map(repr, unknown))}")
    if not ({"status", "body", "header"} & set(entry)):
        raise _fail(where, raw, f"the rule {dict(entry)!r} has no condition")
    statuses = _statuses(entry["status"], where, raw) if "status" in entry else None
    body = _compile(entry["body"], "body", where, raw) if "body" in entry else None
    headers: list[tuple[str, re.Pattern[str] | None]] = []
    if "header" in entry:
        given = entry["header"]
        if isinstance(given, str):
            given = {given: ""}
        if not isinstance(given, Mapping) or not given:
            raise _fail(where, raw, f"header {given!r} is not a dict of header name to a regular expression")
        for name, pattern in given.items():
            if not isinstance(name, str) or not name.strip():
                raise _fail(where, raw, f"header name {name!r} is not a string")
            compiled = None if pattern in ("", None) else _compile(pattern, f"header {name!r}", where, raw)
            headers.append((name.strip().lower(), compiled))
    name = entry.get("name")
    if name is None:
        parts = []
        if statuses is not None:
            parts.append("status " + "/".join(map(str, sorted(statuses))))
        parts += [f"header {header}" for header, _ in headers]
        if body is not None:
            parts.append("body match")
        name = " ".join(parts)
    elif not isinstance(name, str) or not _reason(name):
        raise _fail(where, raw, f"name {name!r} is not a non-empty string")
    return BanRule(name=_reason(name), statuses=statuses, headers=tuple(headers), body=body)


def parse_ban_rules(raw: Any, body_bytes: Any = None, where: str = BAN_RULES_SETTING) -> BanRules:
    """Validate the rules once, at start; None or [] means no rule (the default)."""
    if raw is None:
        raw = []
    if isinstance(raw, (str, Mapping)):
        raw = [raw]
    if not isinstance(raw, (list, tuple)):
        raise _fail(where, raw, "not a list")
    rules: list[BanRule] = []
    for entry in raw:
        if isinstance(entry, str):
            preset = PRESETS.get(entry.strip().lower())
            if preset is None:
                raise _fail(where, raw, f"unknown preset {entry!r}")
            rules += [_rule(part, where, raw) for part in preset]
        elif isinstance(entry, Mapping):
            rules.append(_rule(entry, where, raw))
        else:
            raise _fail(where, raw, f"cannot read the entry {entry!r}")
    return BanRules(rules=tuple(rules), body_bytes=_body_bytes(body_bytes))


def _body_bytes(raw: Any) -> int:
    if raw is None:
        return DEFAULT_BODY_BYTES
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        value = -1
    else:
        try:
            value = int(raw)
        except ValueError:
            value = -1
    if not 1 <= value <= _MAX_BODY_BYTES:
        raise BanRuleSettingError(
            f"{BODY_BYTES_SETTING} must be a whole number of bytes from 1 to {_MAX_BODY_BYTES}; got {raw!r}"
        )
    return value


def load_ban_rules(get: Callable[[str], Any]) -> BanRules:
    return parse_ban_rules(get(BAN_RULES_SETTING), get(BODY_BYTES_SETTING))
