"""Ban rules: which responses count as throttles though they are not 429s (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy.http import Headers

from scrapy_retryafter.banrules import (
    DEFAULT_BODY_BYTES,
    BanDetected,
    BanRules,
    BanRuleSettingError,
    load_ban_rules,
    parse_ban_rules,
)

CF_1015 = b"<html><head><title>Access denied | example.com used Cloudflare to restrict access</title></head>" \
          b"<body><span class=\"cf-error-code\">1015</span> You are being rate limited</body></html>"
CF_CHALLENGE = b"<!DOCTYPE html><html><head><title>Just a moment...</title></head>" \
               b"<body><script>window._cf_chl_opt={cvId: '3'};</script></body></html>"
NORMAL_CF_PAGE = b"<html><head><title>Shop</title></head><body>products" \
                 b"<script src=\"/cdn-cgi/challenge-platform/scripts/jsd/main.js\"></script></body></html>"
CAPTCHA = b"<html><head><title>Please solve this CAPTCHA</title></head><body>...</body></html>"

CUSTOM = [
    {"status": 403, "body": r"(?i)access denied", "name": "denied"},
    {"status": 200, "body": r"(?i)<title>[^<]*captcha", "name": "captcha"},
    {"header": {"X-Blocked": ""}},
    {"status": [200, 202], "header": {"X-Queue": r"^full$"}, "body": "wait"},
]


@pytest.mark.parametrize(
    ("setting", "status", "headers", "body", "expected"),
    [
        # Nothing is a ban by default.
        (None, 430, {}, b"", None),
        ([], 200, {}, CAPTCHA, None),
        (["shopify"], 430, {}, b"", "shopify-430"),
        (["shopify"], 429, {}, b"", None),
        (["cloudflare"], 429, {"Server": "cloudflare", "Retry-After": "30"}, CF_1015, "cloudflare-1015"),
        (["cloudflare"], 429, {}, b"error code: 1015", "cloudflare-1015"),
        (["cloudflare"], 429, {}, b"error code: 10150", None),
        (["cloudflare"], 403, {"cf-mitigated": "challenge"}, b"", "cloudflare-challenge"),
        (["cloudflare"], 403, Headers({b"Cf-Mitigated": [b"challenge"]}), b"", "cloudflare-challenge"),
        (["cloudflare"], 503, {"Server": "cloudflare"}, CF_CHALLENGE, "cloudflare-challenge"),
        # Cloudflare's script on an ordinary page is not a challenge.
        (["cloudflare"], 200, {"Server": "cloudflare"}, NORMAL_CF_PAGE, None),
        (["cloudflare"], 403, {"Server": "nginx"}, CF_CHALLENGE, None),
        (CUSTOM, 403, {}, b"<h1>Access Denied</h1>", "denied"),
        (CUSTOM, 403, {}, b"<h1>Forbidden</h1>", None),
        (CUSTOM, 200, {"Content-Type": "text/html"}, CAPTCHA, "captcha"),
        (CUSTOM, 200, {}, "<title>captcha</title>", "captcha"),
        (CUSTOM, 200, {}, b"<html>a page about captchas</html>", None),
        (CUSTOM, 500, Headers({"X-Blocked": "1"}), b"", "header x-blocked"),
        # Every condition of a rule must hold.
        (CUSTOM, 202, {"X-Queue": "full"}, b"please wait", "status 200/202 header x-queue body match"),
        (CUSTOM, 202, {"X-Queue": "full"}, b"done", None),
        (CUSTOM, 202, {"X-Queue": "fullish"}, b"please wait", None),
        # The first matching rule names the reason.
        (["shopify", {"status": 430, "name": "second"}], 430, {}, b"", "shopify-430"),
    ],
)
def test_ban_rules(setting: Any, status: int, headers: Any, body: Any, expected: str | None) -> None:
    assert parse_ban_rules(setting).match(status, headers, body) == expected


def test_only_the_first_body_bytes_are_read() -> None:
    rules = parse_ban_rules([{"status": 200, "body": "captcha"}], body_bytes=1024)
    assert rules.match(200, {}, b"x" * 1000 + b"captcha") == "status 200 body match"
    assert rules.match(200, {}, b"x" * 1020 + b"captcha") is None
    assert rules.match(200, {}, "x" * 1020 + "captcha") is None


def test_the_shell_can_skip_statuses_no_rule_looks_at() -> None:
    assert parse_ban_rules(["shopify", {"status": 403, "body": "x"}]).statuses == frozenset({430, 403})
    assert parse_ban_rules(["cloudflare"]).statuses is None  # the challenge header comes with any status
    assert parse_ban_rules(None).statuses == frozenset()
    assert not parse_ban_rules(["shopify"]).reads_body
    assert parse_ban_rules(["cloudflare"]).reads_body


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("akamai", "unknown preset 'akamai'"),
        ([{"status": 999}], "is not an HTTP status code"),
        ([{"status": True}], "is not an HTTP status code"),
        ([{"status": 200, "body": "("}], "is not a regular expression"),
        ([{"status": 200, "body": b"captcha"}], "is not a string"),
        ([{"status": 200, "bdy": "x"}], "unknown key(s) 'bdy'"),
        ([{"name": "nothing"}], "has no condition"),
        ([{"header": []}], "is not a dict of header name"),
        ([{"status": 200, "name": ""}], "is not a non-empty string"),
        ([42], "cannot read the entry 42"),
        (42, "not a list"),
    ],
)
def test_bad_rules_fail_naming_the_setting_and_the_accepted_values(raw: Any, fragment: str) -> None:
    with pytest.raises(BanRuleSettingError) as error:
        parse_ban_rules(raw)
    message = str(error.value)
    assert message.startswith("RETRY_AFTER_BAN_RULES must be a list of rules, each a preset name ('cloudflare', 'shopify')")
    assert fragment in message


@pytest.mark.parametrize("raw", [0, -1, "many", 1.5, True, 10**9])
def test_a_bad_body_limit_fails_naming_the_setting(raw: Any) -> None:
    with pytest.raises(BanRuleSettingError, match=r"^RETRY_AFTER_BAN_BODY_BYTES must be a whole number of bytes"):
        load_ban_rules({"RETRY_AFTER_BAN_RULES": ["shopify"], "RETRY_AFTER_BAN_BODY_BYTES": raw}.get)


def test_settings_are_read_with_their_defaults() -> None:
    rules = load_ban_rules({}.get)
    assert rules == BanRules() and rules.body_bytes == DEFAULT_BODY_BYTES
    assert load_ban_rules({"RETRY_AFTER_BAN_BODY_BYTES": "2048"}.get).body_bytes == 2048


def test_the_spider_s_exception_carries_a_bounded_reason_and_a_sane_wait() -> None:
    flagged = BanDetected("captcha\nform " + "x" * 500, retry_after=30)
    assert flagged.reason.startswith("captcha form x") and len(flagged.reason) == 80
    assert flagged.retry_after == 30.0
    assert BanDetected().reason == "flagged by the spider"
    assert BanDetected("", retry_after=float("nan")).retry_after is None
    assert BanDetected(retry_after=-5).retry_after is None
    assert BanDetected(retry_after="30").retry_after is None


# --- properties -------------------------------------------------------------------------------

ALL = parse_ban_rules(["cloudflare", "shopify", *CUSTOM], body_bytes=256)
header_values = st.one_of(st.binary(max_size=64), st.text(max_size=64), st.lists(st.binary(max_size=16), max_size=3))


@settings(suppress_health_check=[HealthCheck.too_slow])  # header dictionaries draw slowly on a loaded machine
@given(
    status=st.integers(min_value=100, max_value=599),
    headers=st.dictionaries(st.sampled_from(["Server", "cf-mitigated", "X-Blocked", "X-Queue", b"x-queue"]), header_values),
    body=st.binary(max_size=1024),
)
def test_matching_never_raises_and_never_reads_past_the_limit(status: int, headers: Any, body: bytes) -> None:
    reason = ALL.match(status, headers, body)
    assert reason is None or isinstance(reason, str)
    prefix = body[:256].ljust(256, b" ")
    assert ALL.match(status, headers, prefix + b"captcha error code: 1015 access denied") == ALL.match(
        status, headers, prefix
    )
