"""Parsing of the Retry-After header (RFC 9110 section 10.2.3).

Servers send delay-seconds, HTTP-dates in three historic forms and their
looser cousins (``Thu, 1 Jan ...``, lowercase names, ``+0000``: whatever
urllib3 accepts), several values at once, and a fair amount of garbage. The
parser answers ``None`` for what it cannot use and never more than a week
for what it can: a header a crawler cannot trust must not crash it nor make
it sleep for an absurd time. The cap itself is the policy's.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone

__all__ = ["MAX_WAIT", "parse_http_date", "parse_retry_after", "reference_time"]

MAX_WAIT = 7 * 86400.0
"""The longest wait any header is read as: past the cap a slot is refused, and a week is the longest refusal."""
DATE_TRUST = 86400.0
"""A response's ``Date`` this far from the local clock is a broken server clock, not skew to cancel out."""
_MAX_LENGTH = 1024
"""Longer than any honest Retry-After (several dates fit in 200 characters): ignored unread."""
_MAX_VALUES = 16

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
_DAY_NAME = re.compile(
    r"(?:mon|tue|wed|thu|fri|sat|sun)(?:day|sday|nesday|rsday|urday)?", re.IGNORECASE
)
_LOOSE_DATE = re.compile(r"[A-Za-z0-9 ,:+\-]+")
"""What the lenient date parser is given at all: the characters of every date form it knows."""


def _text(value: str | bytes) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if len(value) > _MAX_LENGTH or not value.isascii():
        return None
    value = value.strip(" \t")
    if not value.isprintable():
        return None
    return value


def _two_digit_year(yy: int, now: datetime) -> int:
    # RFC 9110 5.6.7: a year more than 50 years ahead is the most recent past
    # year with the same last two digits; otherwise it is the one ahead.
    year = now.year - now.year % 100 + yy
    if year < now.year - 50:
        year += 100
    if year > now.year + 50:
        year -= 100
    return year


def parse_http_date(
    value: str | bytes | None, now: datetime | None = None
) -> datetime | None:
    """The aware UTC datetime of an HTTP-date, or None.

    The three RFC 9110 forms are read exactly (``now`` places a two-digit
    year); anything else goes to the standard library's lenient mail-date
    parser, as urllib3 does, but a date that does not exist (30 February,
    hour 25) is refused rather than rolled over, and a date without a zone is
    GMT, as every HTTP-date is.
    """
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
        return _datetime(
            year, _MONTHS[match["month"]], int(match["day"]),
            int(match["hour"]), int(match["minute"]), int(match["second"]), 0,
        )
    return _loose_date(text)


def _loose_date(text: str) -> datetime | None:
    if not _LOOSE_DATE.fullmatch(text) or not any(c.isalpha() for c in text):
        return None  # a date names its month; a bare number is no date
    try:
        parts = email.utils.parsedate_tz(text)
    except (ValueError, TypeError, IndexError, OverflowError, NameError):
        return None  # older Pythons raise on some malformed dates instead of answering None
    if parts is None:
        return None
    year, month, day, hour, minute, second = parts[:6]
    offset = parts[9] or 0
    if abs(offset) > 14 * 3600:
        return None  # no zone on Earth is further from GMT
    return _datetime(year, month, day, hour, minute, second, offset)


def _datetime(year: int, month: int, day: int, hour: int, minute: int, second: int, offset: int) -> datetime | None:
    leap = second == 60  # legal in an HTTP-date; datetime stops at 59
    try:
        when = datetime(year, month, day, hour, minute, 59 if leap else second, tzinfo=timezone.utc)
        return when + timedelta(seconds=leap - offset)
    except (ValueError, OverflowError):
        return None


def _aware(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(timezone.utc)
    if now.tzinfo is None:
        return now.replace(tzinfo=timezone.utc)
    return now


def reference_time(date: str | bytes | datetime | None, now: datetime | None = None) -> datetime:
    """The time an HTTP-date Retry-After is measured from: the response's ``Date`` when it is sane.

    Measuring from the server's own clock cancels out skew between the two
    clocks; a ``Date`` more than a day from the local clock is a broken
    clock (1970 turns five seconds into 57 years), so the local clock wins.
    """
    now = _aware(now)
    server = date if isinstance(date, datetime) else parse_http_date(date, now)
    if server is None:
        return now
    server = _aware(server)
    if abs((server - now).total_seconds()) > DATE_TRUST:
        return now
    return server


def _values(value: str | bytes | Iterable[str | bytes] | None) -> list[str | bytes]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        return [value]
    return list(value)[:_MAX_VALUES]


def _split(text: str) -> list[str]:
    """``120, Thu, 01 Jan 2026 00:00:00 GMT``: the values of a comma-joined header.

    A date's own comma follows its day name, so a piece that is only a day
    name is glued back to the piece after it.
    """
    pieces = [piece.strip(" \t") for piece in text.split(",", 2 * _MAX_VALUES)]
    values: list[str] = []
    glue = ""
    for piece in pieces:
        if glue:
            values.append(f"{glue}, {piece}")
            glue = ""
        elif _DAY_NAME.fullmatch(piece):
            glue = piece
        else:
            values.append(piece)
    if glue:
        values.append(glue)
    return values[:_MAX_VALUES]


def parse_retry_after(
    value: str | bytes | Iterable[str | bytes] | None,
    now: datetime | None = None,
    *,
    date: str | bytes | datetime | None = None,
) -> float | None:
    """Seconds to wait according to Retry-After, at most ``MAX_WAIT``; None if unusable.

    ``value`` is one header value or all of them (``headers.getlist``); with
    several, comma-joined or repeated, the largest usable wait wins, as a
    fresh throttle never shortens a cooldown. ``now`` is the local clock (an
    aware datetime). An HTTP-date is measured from the response's ``date``
    when that is within a day of ``now`` (see ``reference_time``), else from
    ``now``; a date in the past means 0.0.
    """
    pieces: list[str] = []
    for raw in _values(value):
        if len(pieces) >= _MAX_VALUES:
            break
        text = _text(raw) if isinstance(raw, (str, bytes)) else None
        if text:
            pieces.extend(_split(text))
    waits = []
    reference: datetime | None = None
    for piece in pieces[:_MAX_VALUES]:
        if _SECONDS.fullmatch(piece):
            waits.append(min(float(piece), MAX_WAIT))
            continue
        if reference is None:
            reference = reference_time(date, now)
        when = parse_http_date(piece, reference)
        if when is not None:
            waits.append(min(max(0.0, (when - reference).total_seconds()), MAX_WAIT))
    return max(waits) if waits else None
