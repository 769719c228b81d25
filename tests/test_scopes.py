"""Scope keys: which state a request's throttles charge (pure, table and property tests)."""

from __future__ import annotations

import logging
import re
import socket
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scrapy_retryafter import scopekeys, scopes
from scrapy_retryafter.scopekeys import MAX_KEY_LENGTH, combination_key, digest, plain_key, registrable_domain
from scrapy_retryafter.scopes import (
    RequestFacts,
    ScopeConfig,
    ScopeSettingError,
    load_scope_config,
    parse_scopes,
)

SAFE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@~=-]*")
"""What a scope key may contain: a file name on Linux, macOS and Windows, a Redis key, a log word."""


def keys(setting: Any, **facts: Any) -> tuple[str, ...]:
    facts.setdefault("slot", "api.example.com")
    facts.setdefault("url", "https://api.example.com/items/1")
    return ScopeConfig(default=parse_scopes(setting)).scopes_for(RequestFacts(**facts))


def by_tenant(facts: RequestFacts) -> list[str]:
    return [f"tenant-{facts.meta['tenant']}"]


def broken(facts: RequestFacts) -> list[str]:
    raise RuntimeError("bug in the user's scope function")


@pytest.mark.parametrize(
    ("setting", "facts", "expected"),
    [
        # The default: the download slot, as before scopes existed.
        (None, {}, ("api.example.com",)),
        (["slot"], {"slot": "custom-slot"}, ("custom-slot",)),
        # A slot key that is not a plain file name keeps a readable start and a hash.
        (["slot"], {"slot": "a/b c"}, ("a_b_c~" + digest("a/b c"),)),
        # One exit IP and one host: credentials never reach the key, the user picks the exit.
        (["proxy"], {"proxy": "http://10.0.0.1:3128"}, ("proxy=10.0.0.1_3128@api.example.com",)),
        (["proxy"], {"proxy": "10.0.0.1:3128"}, ("proxy=10.0.0.1_3128@api.example.com",)),
        (["proxy"], {}, ("proxy=direct@api.example.com",)),
        (["domain"], {"url": "https://shop.example.co.uk/x", "slot": "shop.example.co.uk"}, ("domain=example.co.uk",)),
        (["domain"], {"url": "http://127.0.0.2:8080/x", "slot": "127.0.0.2"}, ("domain=127.0.0.2",)),
        # A path rule applies to its host's prefix only; the rest falls back to the slot.
        ([{"path": {"api.example.com": ["/search"]}}], {"url": "https://api.example.com/search?q=1"},
         ("path=api.example.com_search~" + digest("path", "api.example.com/search"),)),
        ([{"path": {"api.example.com": ["/search"]}}], {"url": "https://api.example.com/searchable"},
         ("api.example.com",)),
        ([{"path": {"other.example.com": ["/search"]}}], {"url": "https://api.example.com/search"},
         ("api.example.com",)),
        (["slot", "path:/search"], {"url": "https://api.example.com/search/deep"},
         ("api.example.com", "path=api.example.com_search~" + digest("path", "api.example.com/search"))),
        # Without the header the header scope does not apply.
        (["header:X-Api-Key"], {}, ("api.example.com",)),
        # A callable's ids are used as they are (Scrapy's flat scope id namespace).
        ([{"callable": f"{__name__}.by_tenant"}], {"meta": {"tenant": "acme"}}, ("tenant-acme",)),
        ([by_tenant, "slot"], {"meta": {"tenant": "acme"}}, ("tenant-acme", "api.example.com")),
        # Scrapy's throttling_scopes meta replaces the configured scopes, as it replaces the default scope there.
        (["proxy"], {"meta": {"throttling_scopes": {"api", "users"}}}, None),
        (["proxy"], {"meta": {"throttling_scopes": "api"}}, ("api",)),
    ],
)
def test_scope_keys(setting: Any, facts: dict[str, Any], expected: tuple[str, ...] | None) -> None:
    result = keys(setting, **facts)
    if expected is None:
        assert sorted(result) == ["api", "users"]
    else:
        assert result == expected
    assert all(SAFE_KEY.fullmatch(key) and len(key) <= MAX_KEY_LENGTH for key in result)


def test_two_api_keys_on_one_host_are_two_scopes_and_neither_key_is_in_them() -> None:
    first = keys(["header:X-Api-Key"], headers={"x-api-key": "sk_live_AAAAAAAAAAAA"})
    second = keys(["header:X-Api-Key"], headers={"x-api-key": "sk_live_BBBBBBBBBBBB"})
    again = keys(["header:X-Api-Key"], headers={"x-api-key": "sk_live_AAAAAAAAAAAA"})
    assert first != second and first == again
    assert all(key.startswith("header=api.example.com@x-api-key~") for key in first + second)
    assert not any("sk_live" in key for key in first + second)


def test_two_proxies_to_one_host_are_two_scopes_and_the_password_is_not_in_them() -> None:
    first = keys(["proxy"], proxy="http://bob:hunter2@127.0.0.11:8001")
    second = keys(["proxy"], proxy="http://bob:hunter2@127.0.0.12:8001")
    other_user = keys(["proxy"], proxy="http://alice:hunter2@127.0.0.11:8001")
    assert len({first, second, other_user}) == 3
    assert not any("hunter2" in key or "bob" in key for key in first + second + other_user)
    # The same exit to another host is another scope: a 429 is about that IP and that host.
    assert keys(["proxy"], proxy="http://127.0.0.11:8001", url="http://b.example/") != keys(
        ["proxy"], proxy="http://127.0.0.11:8001"
    )


def test_subdomains_share_a_domain_scope_but_not_a_slot() -> None:
    www = keys(["domain"], url="https://www.example.com/", slot="www.example.com")
    img = keys(["domain"], url="https://img.example.com/a.png", slot="img.example.com")
    assert www == img == ("domain=example.com",)
    assert keys(["slot"], slot="www.example.com") != keys(["slot"], slot="img.example.com")


def test_a_cookie_jar_in_meta_is_a_scope() -> None:
    jar1 = keys(["meta:cookiejar"], meta={"cookiejar": 1})
    jar2 = keys(["meta:cookiejar"], meta={"cookiejar": 2})
    assert jar1 != jar2 and jar1[0].startswith("meta=api.example.com@cookiejar~")
    assert keys(["meta:cookiejar"]) == ("api.example.com",)


def test_longest_path_prefix_wins() -> None:
    setting = [{"path": {"api.example.com": ["/v1", "/v1/search"]}}]
    search = keys(setting, url="https://api.example.com/v1/search/x")
    other = keys(setting, url="https://api.example.com/v1/items")
    assert search != other
    assert search == ("path=api.example.com_v1_search~" + digest("path", "api.example.com/v1/search"),)


def test_a_failing_callable_falls_back_to_the_slot_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    scopes._warned.clear()
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter.scopes"):
        assert keys([broken]) == ("api.example.com",)
        assert keys([broken]) == ("api.example.com",)
    warnings = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and "broken" in warnings[0].getMessage()


@pytest.mark.parametrize("bad", [42, [42], [""], ["a", 3]])
def test_garbage_from_a_callable_or_meta_falls_back_to_the_slot(bad: Any) -> None:
    scopes._warned.clear()
    assert keys([lambda facts: bad]) == ("api.example.com",)
    assert keys(["slot"], meta={"throttling_scopes": bad}) == ("api.example.com",)


def test_a_request_belongs_to_at_most_eight_scopes() -> None:
    result = keys([lambda facts: [f"s{i}" for i in range(100)]])
    assert result == tuple(f"s{i}" for i in range(8))


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ([], "an empty list"),
        (["host"], "unknown scope 'host'"),
        (["slot", "slot"], "listed twice"),
        (["header:"], "is not an HTTP header name"),
        ([{"header": "X Api Key"}], "is not an HTTP header name"),
        ([{"path": {"api.example.com": ["search"]}}], "starting with '/'"),
        ([{"path": {"api.example.com": ["/"]}}], "not '/' alone"),
        ([{"path": {}}], "a path scope needs"),
        ([{"callable": "no_such_module_xyz.f"}], "cannot import"),
        ([{"callable": "scrapy_retryafter.scopekeys.MAX_KEY_LENGTH"}], "is not callable"),
        ([{"callable": "nodots"}], "is not an import path"),
        ([{"proxy": True}], "cannot read the entry"),
        (42, "not a list"),
    ],
)
def test_bad_settings_fail_naming_the_setting_and_the_accepted_values(raw: Any, fragment: str) -> None:
    with pytest.raises(ScopeSettingError) as error:
        parse_scopes(raw)
    message = str(error.value)
    assert message.startswith("RETRY_AFTER_SCOPES must be a list of scopes, each one of 'slot', 'proxy', 'domain'")
    assert fragment in message


def test_a_slot_overrides_the_scopes_and_its_errors_name_it() -> None:
    settings = {
        "RETRY_AFTER_SCOPES": ["slot"],
        "RETRY_AFTER_SLOTS": {"api.example.com": {"scopes": ["header:X-Api-Key"], "max_retries": 8}, "b": {}},
    }
    config = load_scope_config(settings.get)
    assert [rule.kind for rule in config.rules_for("api.example.com")] == ["header"]
    assert [rule.kind for rule in config.rules_for("elsewhere")] == ["slot"]
    assert config.header_names == frozenset({"x-api-key"})
    settings["RETRY_AFTER_SLOTS"] = {"api.example.com": {"scopes": ["nope"]}}
    with pytest.raises(ScopeSettingError, match=r"^RETRY_AFTER_SLOTS\['api.example.com'\]\['scopes'\] must be"):
        load_scope_config(settings.get)


def test_settings_may_be_given_as_a_comma_separated_string() -> None:
    assert [rule.kind for rule in parse_scopes("slot, proxy,header:X-Api-Key")] == ["slot", "proxy", "header"]


def test_the_registrable_domain_comes_from_the_bundled_list_without_network_or_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("tldextract tried the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(scopekeys, "_extract", None)
    registrable_domain.cache_clear()
    assert registrable_domain("a.b.example.co.uk") == "example.co.uk"
    assert registrable_domain("WWW.Example.COM.") == "example.com"
    assert registrable_domain("localhost") == "localhost"
    assert list(tmp_path.iterdir()) == []


# --- properties -------------------------------------------------------------------------------

texts = st.text(min_size=1, max_size=400)


@given(texts)
def test_plain_key_is_a_bounded_safe_file_name(text: str) -> None:
    key = plain_key(text)
    assert SAFE_KEY.fullmatch(key) and len(key) <= MAX_KEY_LENGTH
    assert key not in (".", "..")
    assert plain_key(key) == key


@given(texts, texts)
def test_plain_key_keeps_different_texts_apart(a: str, b: str) -> None:
    if a != b:
        assert plain_key(a) != plain_key(b)


secret = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", min_size=12, max_size=64)
hosts = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}\.(com|co\.uk|org|io)", fullmatch=True)
paths = st.from_regex(r"(/[A-Za-z0-9%._~-]{0,30}){0,6}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    host=hosts,
    path=paths,
    api_key=secret,
    password=secret,
    proxy_host=st.sampled_from(["127.0.0.11", "proxy.example.net", "10.1.2.3"]),
    slot=st.one_of(st.just(""), texts),
)
def test_every_key_is_safe_bounded_and_free_of_secrets(
    host: str, path: str, api_key: str, password: str, proxy_host: str, slot: str
) -> None:
    assume(api_key not in slot and password not in slot)
    config = ScopeConfig(
        default=parse_scopes(
            ["slot", "proxy", "domain", "header:Authorization", "meta:cookiejar", {"path": {"*": ["/v1", "/search"]}}]
        )
    )
    facts = RequestFacts(
        slot=slot or host,
        url=f"https://{host}{path or '/'}?token={api_key}",
        proxy=f"http://user:{password}@{proxy_host}:8080",
        headers={"authorization": f"Bearer {api_key}"},
        meta={"cookiejar": api_key},
    )
    result = config.scopes_for(facts)
    assert result and len(result) == len(set(result))
    for key in result:
        assert SAFE_KEY.fullmatch(key), key
        assert len(key) <= MAX_KEY_LENGTH
        assert api_key not in key and password not in key
    combined = combination_key(result)
    assert SAFE_KEY.fullmatch(combined.replace("+", "-")) and len(combined) <= 200
    assert combined == combination_key(tuple(reversed(result)))


# --- Scrapy requests ------------------------------------------------------------------------


def test_a_request_s_scopes_are_kept_in_its_meta_until_its_url_or_the_configuration_changes() -> None:
    from scrapy import Request

    from scrapy_retryafter.scopes import SCOPES_META, scopes_of

    config = ScopeConfig(default=parse_scopes(["header:X-Api-Key", "proxy"]))
    request = Request("https://api.example.com/a", headers={"X-Api-Key": "k1"}, meta={"proxy": "http://127.0.0.11:8001"})
    first = scopes_of(request, "api.example.com", config)
    assert first == (
        "header=api.example.com@x-api-key~" + digest("header", "api.example.com\0x-api-key\0k1"),
        "proxy=127.0.0.11_8001@api.example.com",
    )
    # A downloader middleware changing the header later does not move the request to other state.
    request.headers["X-Api-Key"] = "k2"
    assert scopes_of(request, "api.example.com", config) == first
    # A retry is a copy: same scopes. A redirect is a new URL: computed again.
    assert scopes_of(request.copy(), "api.example.com", config) == first
    redirected = request.replace(url="https://api.example.com/b")
    assert scopes_of(redirected, "api.example.com", config) != first
    # Another configuration (a resumed JOBDIR, settings changed) computes them again.
    assert scopes_of(request, "api.example.com", ScopeConfig()) == ("api.example.com",)
    # Garbage in the meta is not trusted.
    request.meta[SCOPES_META] = ["x", request.url, 42]
    assert scopes_of(request, "api.example.com", ScopeConfig()) == ("api.example.com",)
