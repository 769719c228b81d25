"""Parsing of the Retry-After header (RFC 9110 section 10.2.3).

Servers send delay-seconds, HTTP-dates in three historic forms, and a fair
amount of garbage. The parser accepts the legal forms plus a fractional
number of seconds, and answers ``None`` for everything else: a header a
crawler cannot trust must not crash it nor make it sleep for an absurd time.
Capping is left to the policy.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

__all__ = ["parse_http_date", "parse_retry_after"]

_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")

_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_LONG_DAY = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_MONTH = r"(?P<month>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TIME = r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"

_IMF_FIXDATE = re.compile(
    rf"{_DAY}, (?P<day>[0-9]{{2}}) {_MONTH} (?P<year>[0-9]{{4}}) {_TIME} GMT"
)
_RFC850 = re.compile(
    rf"{_LONG_DAY}, (?P<day>[0-9]{{2}})-{_MONTH}-(?P<year>[0-9]{{2}}) {_TIME} GMT"
)
_ASCTIME = re.compile(
    rf"{_DAY} {_MONTH} (?P<day>[ 0-9][0-9]) {_TIME} (?P<year>[0-9]{{4}})"
)
_MONTHS = {
    name: number
    for number, name in enumerate(
        "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), start=1
    )
}


def _text(value: str | bytes) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not value.isascii():
        return None
    value = value.strip(" \t")
    if not value.isprintable():
        return None
    return value


def _two_digit_year(yy: int, now: datetime) -> int:
    # RFC 9110 5.6.7: a year more than 50 years ahead is the most recent past
    # year with the same last two digits.
    year = now.year - now.year % 100 + yy
    if year > now.year + 50:
        year -= 100
    return year


def parse_http_date(
    value: str | bytes | None, now: datetime | None = None
) -> datetime | None:
    """The aware UTC datetime of an HTTP-date in any RFC 9110 form, or None."""
    if value is None:
        return None
    text = _text(value)
    if not text:
        return None
    now = _aware(now)
    for pattern in (_IMF_FIXDATE, _RFC850, _ASCTIME):
        match = pattern.fullmatch(text)
        if match is None:
            continue
        year = int(match["year"])
        if pattern is _RFC850:
            year = _two_digit_year(year, now)
        second = int(match["second"])
        leap = second == 60  # legal in an HTTP-date; datetime stops at 59
        try:
            when = datetime(
                year,
                _MONTHS[match["month"]],
                int(match["day"]),
                int(match["hour"]),
                int(match["minute"]),
                59 if leap else second,
                tzinfo=timezone.utc,
            )
        except ValueError:
            return None
        return when + timedelta(seconds=1) if leap else when
    return None


def _aware(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(timezone.utc)
    if now.tzinfo is None:
        return now.replace(tzinfo=timezone.utc)
    return now


def parse_retry_after(
    value: str | bytes | None, now: datetime | None = None
) -> float | None:
    """Seconds to wait according to a Retry-After value, or None if unusable.

    An HTTP-date is measured from ``now`` (an aware datetime; the caller
    passes the response's own ``Date`` so that clock skew between crawler and
    server cancels out) and a date in the past means 0.0.
    """
    if value is None:
        return None
    text = _text(value)
    if not text:
        return None
    if _SECONDS.fullmatch(text):
        return float(text)
    now = _aware(now)
    when = parse_http_date(text, now)
    if when is None:
        return None
    return max(0.0, (when - now).total_seconds())
