"""Table-driven and property tests of the Retry-After / HTTP-date parser."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scrapy_retryafter.headers import MAX_WAIT, parse_http_date, parse_retry_after, reference_time

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
        ("9" * 20, MAX_WAIT),
        ("604801", MAX_WAIT),
        ("604799.5", 604799.5),
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


@pytest.mark.parametrize("value", ["9" * 400, b"9" * 400, "9" * 1000])
def test_huge_digit_string_is_a_week(value):
    result = parse_retry_after(value, NOW)
    assert type(result) is float
    assert result == MAX_WAIT


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
        ("Saturday, 01-Jan-00 00:00:00 GMT", datetime(1994, 1, 1, tzinfo=timezone.utc), 2000),
        ("Friday, 01-Jan-00 00:00:00 GMT", datetime(2099, 1, 1, tzinfo=timezone.utc), 2100),
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
        "Sunday Nov  6 08:49:37 1994",
        "1994-11-06T08:49:37Z",
    ],
)
def test_unusable_is_none(value):
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    "value",
    [None, "", "120", "soon", b"\xff", "Sun, 30 Feb 1994 08:49:37 GMT", "Sun, 06 Nov 1994 25:49:37 +0000"],
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
    assert result == min(float(n), MAX_WAIT)
    assert parse_retry_after(str(n).encode("ascii"), NOW) == min(float(n), MAX_WAIT)


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
    assert parse_retry_after(header, now) == min((d - now).total_seconds(), MAX_WAIT)
    assert parse_retry_after(header.encode("ascii"), now) == min((d - now).total_seconds(), MAX_WAIT)


@settings(max_examples=200, deadline=None)
@given(_DATES, st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=3650)))
def test_formatted_date_in_past_is_zero(d, after):
    assume(d.year < 9989)  # d + after must stay a representable datetime
    header = format_datetime(d, usegmt=True)
    assert parse_retry_after(header, d + after) == 0.0


# --------------------------------------------------------------------------
# the forms urllib3 accepts (email.utils.parsedate_tz), beyond RFC 9110's three
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 6 Nov 1994 08:49:37 GMT",  # day not padded
        "sun, 06 nov 1994 08:49:37 gmt",  # lowercase names
        "SUN, 06 NOV 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 10:49:37 +0200",  # another zone, same instant
        "Sun, 06 Nov 1994 03:49:37 EST",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37",  # no zone: an HTTP-date is GMT
        "06 Nov 1994 08:49:37 GMT",  # no weekday
        "Sunday, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06-Nov-94 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun Nov 6 08:49:37 1994",  # asctime, day not space-padded
        "Sun,  06 Nov 1994 08:49:37 GMT",
    ],
)
def test_date_forms_urllib3_accepts(value):
    assert parse_retry_after(value, NOW) == 30.0
    assert parse_http_date(value, NOW) == DATE


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 06 Nov 1994 08:49:37 +9999",  # no zone is 99 hours from GMT
        "Sun, 06 Nov 99999 08:49:37 GMT",
        "Sun, 31 Feb 1994 08:49:37 +0000",  # rolled over by mktime in urllib3: refused here
        "Sun, 06 Nov 1994 08:49:37.5 GMT",
        "Nov 1994",
        "Sun, 06 Nov 1994 08:49:37 GMT\x00",
        "Sun, 06 Nov 1994 08:49:37 GMT\r\nX-Evil: 1",
    ],
)
def test_loose_dates_still_refuse_nonsense(value):
    assert parse_retry_after(value, NOW) is None


_ZONES = st.integers(min_value=-12 * 60, max_value=14 * 60).map(lambda m: timezone(timedelta(minutes=m)))


@settings(max_examples=300, deadline=None)
@given(
    _DATES.filter(lambda d: 1970 <= d.year < 9999),
    _ZONES,
    st.sampled_from(["imf", "lower", "unpadded", "numeric", "asctime", "rfc850"]),
)
def test_every_form_reads_the_same_instant(d, zone, form):
    local = d.astimezone(zone)
    if form == "imf":
        text = format_datetime(d, usegmt=True)
    elif form == "lower":
        text = format_datetime(d, usegmt=True).lower()
    elif form == "unpadded":
        text = format_datetime(d, usegmt=True).replace(f" {d.day:02d} ", f" {d.day} ", 1)
    elif form == "numeric":
        text = format_datetime(local)
    elif form == "asctime":
        text = d.strftime("%a %b ") + f"{d.day:2d}" + d.strftime(" %H:%M:%S %Y")
    else:
        text = d.strftime("%A, %d-%b-%y %H:%M:%S GMT")
        assume(abs(d.year - NOW.year) < 50)
    assert parse_http_date(text, NOW) == d


# --------------------------------------------------------------------------
# several values: the largest wait wins
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120, 120", 120.0),
        ("1, 400", 400.0),
        ("400,1", 400.0),
        ([b"400", b"1"], 400.0),  # two headers: the last no longer wins
        ([b"1", b"400"], 400.0),
        (["soon", "5"], 5.0),
        ("soon, 5", 5.0),
        (f"5, {IMF_FIXDATE}", 30.0),
        (f"{IMF_FIXDATE}, 5", 30.0),
        (f"{IMF_FIXDATE}, {IMF_FIXDATE}", 30.0),
        (f"{RFC850}, 40", 40.0),
        ("sunday, 06-nov-94 08:49:37 gmt, 2", 30.0),
        ([], None),
        (["soon", b"\xff"], None),
        (",,,", None),
        ([None, "7"], 7.0),
    ],
)
def test_several_values_largest_wins(value, expected):
    assert parse_retry_after(value, NOW) == expected


def test_values_are_bounded_in_number_and_length():
    assert parse_retry_after(["1"] * 10_000 + ["99"], NOW) == 1.0  # only the first values are read
    assert parse_retry_after("1," * 500 + "99", NOW) == 1.0
    assert parse_retry_after("5" + " " * 10_000, NOW) is None  # 10 KB: not read at all


# --------------------------------------------------------------------------
# the response's Date: used only within a day of the local clock
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("date", "expected"),
    [
        (None, 30.0),  # measured from the local clock
        ("Sun, 06 Nov 1994 08:49:17 GMT", 20.0),  # server clock 10 s ahead: skew cancels out
        ("Sun, 06 Nov 1994 08:48:57 GMT", 40.0),
        ("Sat, 05 Nov 1994 08:49:37 GMT", 86400.0),  # 23:59:30 behind: still trusted
        ("Sat, 05 Nov 1994 08:49:00 GMT", 30.0),  # a day and 7 s behind: a broken clock
        ("Thu, 01 Jan 1970 00:00:00 GMT", 30.0),  # the 57 years
        ("Mon, 07 Nov 1994 08:49:08 GMT", 30.0),  # a day and 1 s ahead
        ("garbage", 30.0),
        (b"\xff", 30.0),
        (DATE - timedelta(seconds=5), 5.0),
    ],
)
def test_date_header_is_trusted_within_a_day(date, expected):
    assert parse_retry_after(IMF_FIXDATE, NOW, date=date) == expected


def test_date_header_does_not_touch_delay_seconds():
    assert parse_retry_after("7", NOW, date="Thu, 01 Jan 1970 00:00:00 GMT") == 7.0


def test_reference_time():
    assert reference_time(None, NOW) == NOW
    assert reference_time("Thu, 01 Jan 1970 00:00:00 GMT", NOW) == NOW
    assert reference_time(IMF_FIXDATE, NOW) == DATE
    assert reference_time(DATE.replace(tzinfo=None), NOW) == DATE


# --------------------------------------------------------------------------
# hostile values
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (" 5 ", 5.0),
        ("5.", None),
        (".5", None),
        ("+5", None),
        ("-5", None),
        ("0x10", None),
        ("1e309", None),
        ("1e3", None),
        ("\u0663", None),  # Arabic-Indic three
        ("5\u00a0", None),  # no-break space
        ("5\x00", None),
        ("5\x1f", None),
        ("\x7f5", None),
        ("5\x0b", None),
        ("5" * 10_000, None),  # 10 KB: over the length read
        ("5" * 1000, MAX_WAIT),
        ("nan", None),
        ("inf", None),
        ("-inf", None),
        (b"\xef\xbb\xbf5", None),  # a byte-order mark
    ],
)
def test_hostile_values(value, expected):
    assert parse_retry_after(value, NOW) == expected


def _bounded(result):
    assert result is None or (type(result) is float and 0.0 <= result <= MAX_WAIT)


_PIECES = st.one_of(
    st.text(max_size=60),
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.floats().map(repr),
    st.sampled_from([IMF_FIXDATE, RFC850, ASCTIME, "Thu, 1 Jan 1970 00:00:00 +0000", "Fri, 31 Dec 9999 23:59:59 GMT"]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(_PIECES, _PIECES.map(lambda s: s.encode("utf-8", "surrogatepass"))), max_size=4),
    st.one_of(st.none(), _PIECES, st.datetimes(timezones=st.just(timezone.utc))),
    st.datetimes(timezones=st.just(timezone.utc)),
)
def test_any_values_any_date_any_clock_stay_bounded(values, date, now):
    _bounded(parse_retry_after(values, now, date=date))
    _bounded(parse_retry_after(", ".join(v if isinstance(v, str) else repr(v) for v in values), now, date=date))
