"""Table-driven and property tests of the Retry-After / HTTP-date parser."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scrapy_retryafter.headers import parse_http_date, parse_retry_after

# 30 seconds before Sun, 06 Nov 1994 08:49:37 GMT (the RFC 9110 example date).
NOW = datetime(1994, 11, 6, 8, 49, 7, tzinfo=timezone.utc)
DATE = datetime(1994, 11, 6, 8, 49, 37, tzinfo=timezone.utc)

IMF_FIXDATE = "Sun, 06 Nov 1994 08:49:37 GMT"
RFC850 = "Sunday, 06-Nov-94 08:49:37 GMT"
ASCTIME = "Sun Nov  6 08:49:37 1994"


# --------------------------------------------------------------------------
# delay-seconds
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 30 ", 30.0),
        ("\t30\t", 30.0),
        ("1.5", 1.5),
        ("0", 0.0),
        ("000", 0.0),
        ("007", 7.0),
        (b"120", 120.0),
        (b" 1.25 ", 1.25),
        ("9" * 20, 1e20),
    ],
)
def test_delay_seconds(value, expected):
    result = parse_retry_after(value, NOW)
    assert type(result) is float
    assert result == expected


def test_delay_seconds_ignore_now():
    # delay-seconds do not depend on the clock
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after("120", datetime(2100, 1, 1, tzinfo=timezone.utc)) == 120.0


@pytest.mark.parametrize("value", ["9" * 400, b"9" * 400, "9" * 5000])
def test_huge_digit_string_is_infinite_float(value):
    result = parse_retry_after(value, NOW)
    assert type(result) is float
    assert result == math.inf


# --------------------------------------------------------------------------
# HTTP-date, all three RFC 9110 forms
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (NOW, 30.0),  # 30 s before the date
        (DATE, 0.0),  # exactly at the date
        (DATE - timedelta(hours=1), 3600.0),
        (DATE - timedelta(days=1, seconds=5), 86405.0),
        (DATE - timedelta(microseconds=500_000), 0.5),
    ],
)
def test_http_date_forms(value, now, expected):
    assert parse_retry_after(value, now) == expected


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
def test_http_date_forms_as_bytes(value):
    assert parse_retry_after(value.encode("ascii"), NOW) == 30.0


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
def test_http_date_with_surrounding_whitespace(value):
    assert parse_retry_after(f"  {value}\t", NOW) == 30.0


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
@pytest.mark.parametrize(
    "now",
    [
        DATE + timedelta(seconds=1),
        DATE + timedelta(days=365),
        datetime(2030, 1, 1, tzinfo=timezone.utc),
    ],
)
def test_date_in_the_past_is_zero(value, now):
    result = parse_retry_after(value, now)
    assert type(result) is float
    assert result == 0.0


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
def test_naive_now_is_utc(value):
    naive = NOW.replace(tzinfo=None)
    assert parse_retry_after(value, naive) == 30.0


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
def test_aware_non_utc_now(value):
    # the same instant as NOW, expressed at UTC+02:00
    now = NOW.astimezone(timezone(timedelta(hours=2)))
    assert now.hour == 10
    assert parse_retry_after(value, now) == 30.0


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
def test_parse_http_date_forms(value):
    result = parse_http_date(value, NOW)
    assert result == DATE
    assert result.tzinfo is not None
    assert result.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("value", "now", "year"),
    [
        # RFC 9110 5.6.7: a two-digit year more than 50 years in the future is
        # the most recent past year with the same last two digits.
        ("Sunday, 06-Nov-94 08:49:37 GMT", datetime(2025, 1, 1, tzinfo=timezone.utc), 1994),
        ("Tuesday, 06-Nov-29 08:49:37 GMT", datetime(2025, 1, 1, tzinfo=timezone.utc), 2029),
        ("Monday, 06-Nov-00 08:49:37 GMT", datetime(2025, 1, 1, tzinfo=timezone.utc), 2000),
        ("Wednesday, 06-Nov-75 08:49:37 GMT", datetime(2025, 1, 1, tzinfo=timezone.utc), 2075),
        ("Thursday, 06-Nov-76 08:49:37 GMT", datetime(2025, 1, 1, tzinfo=timezone.utc), 1976),
        ("Sunday, 06-Nov-94 08:49:37 GMT", datetime(1994, 1, 1, tzinfo=timezone.utc), 1994),
    ],
)
def test_rfc850_two_digit_year(value, now, year):
    result = parse_http_date(value, now)
    assert result is not None
    assert result.year == year


# --------------------------------------------------------------------------
# garbage: None
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        b"",
        "   ",
        "-1",
        "+5",
        "1e3",
        "1E3",
        "inf",
        "Infinity",
        "nan",
        "NaN",
        "\u0661\u0662\u0663",  # Arabic-Indic digits
        "\uff11\uff12",  # full-width digits
        "30s",
        "30 s",
        "3 0",
        "soon",
        "1.",
        ".5",
        "1.5.5",
        "0x10",
        "1_000",
        b"1\x002",
        "1\x002",
        "12\n",
        "\n12",
        "12\r\n",
        b"\xff",
        b"12\xff",
        # impossible dates
        "Sun, 30 Feb 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 24:49:37 GMT",
        "Sun, 06 Nov 1994 08:61:37 GMT",
        "Sun, 06 Nov 0000 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun Feb 30 08:49:37 1994",
        "Sunday, 31-Apr-94 08:49:37 GMT",
        # wrong weekday / format
        "Sunday, 06 Nov 1994 08:49:37 GMT",  # long weekday in IMF-fixdate
        "Sun, 06-Nov-94 08:49:37 GMT",  # short weekday in RFC 850
        "Sund, 06 Nov 1994 08:49:37 GMT",
        "sun, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06 nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 gmt",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 6 Nov 1994 08:49:37 GMT",  # day must be two digits
        "Sun,  06 Nov 1994 08:49:37 GMT",
        "06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun Nov 6 08:49:37 1994",  # asctime day is space-padded
        "Sun Nov  6 08:49:37 94",
        "Sunday Nov  6 08:49:37 1994",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "1994-11-06T08:49:37Z",
        "Sun, 06 Nov 1994 08:49:37 GMT, Sun, 06 Nov 1994 08:49:37 GMT",
        "120, 120",
    ],
)
def test_unusable_is_none(value):
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    "value",
    [None, "", "120", "soon", b"\xff", "Sun, 30 Feb 1994 08:49:37 GMT", "Sun, 6 Nov 1994 08:49:37 GMT"],
)
def test_parse_http_date_none(value):
    assert parse_http_date(value, NOW) is None


def test_leap_second_date_is_legal():
    # RFC 9110 5.6.7 allows second 60; it is one second past 23:59:59.
    assert parse_retry_after("Sat, 31 Dec 2016 23:59:60 GMT", datetime(2016, 12, 31, 23, 59, 0, tzinfo=timezone.utc)) == 60.0


# --------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------


def _check_result(result):
    assert result is None or (type(result) is float and result >= 0.0)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_text(value):
    _check_result(parse_retry_after(value, NOW))
    _check_result(parse_retry_after(value))


@settings(max_examples=300, deadline=None)
@given(st.binary())
def test_never_raises_on_bytes(value):
    _check_result(parse_retry_after(value, NOW))
    _check_result(parse_retry_after(value))


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("0123456789 .:,-+GMTSunNovFebe\t"), max_size=40)
)
def test_never_raises_on_near_misses(value):
    _check_result(parse_retry_after(value, NOW))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=10**9))
def test_integer_seconds_roundtrip(n):
    result = parse_retry_after(str(n), NOW)
    assert type(result) is float
    assert result == float(n)
    assert parse_retry_after(str(n).encode("ascii"), NOW) == float(n)


_DATES = st.datetimes(
    min_value=datetime(1900, 1, 1),
    max_value=datetime(9998, 12, 31),
    timezones=st.just(timezone.utc),
).map(lambda d: d.replace(microsecond=0))


@settings(max_examples=300, deadline=None)
@given(_DATES, st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3650)))
def test_formatted_date_roundtrip(d, before):
    now = d - before
    header = format_datetime(d, usegmt=True)
    assert parse_http_date(header, now) == d
    assert parse_retry_after(header, now) == (d - now).total_seconds()
    assert parse_retry_after(header.encode("ascii"), now) == (d - now).total_seconds()


@settings(max_examples=200, deadline=None)
@given(_DATES, st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=3650)))
def test_formatted_date_in_past_is_zero(d, after):
    assume(d.year < 9989)  # d + after must stay a representable datetime
    header = format_datetime(d, usegmt=True)
    assert parse_retry_after(header, d + after) == 0.0
