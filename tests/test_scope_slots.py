"""A scoped request's download slot (scopeslots.py), without a crawl: marks, redirects, a user's slot, settings."""

from __future__ import annotations

import collections
import logging
from typing import Any

import pytest
from scrapy import Request

from scrapy_retryafter.scopes import ScopeConfig, load_scope_config
from scrapy_retryafter.scopeslots import SCOPE_SLOT, ScopeSlots
from scrapy_retryafter.settings import RetryAfterSettingError, load_config


class Stats:
    def __init__(self) -> None:
        self.values: collections.Counter[str] = collections.Counter()

    def inc_value(self, key: str, count: int = 1) -> None:
        self.values[key] += count


def host_of(request: Request) -> str:
    return request.url.split("/")[2].split(":")[0]


def scoper(settings: dict[str, Any], per_slot: dict[str, Any] | None = None) -> tuple[ScopeSlots, Stats, dict[str, str]]:
    config = load_scope_config(settings.get) if settings else ScopeConfig()
    stats, bases = Stats(), {}
    overridden = frozenset(settings.get("RETRY_AFTER_SLOTS", {})) | frozenset(per_slot or {})
    return ScopeSlots(config, host_of, overridden, lambda: per_slot, stats, bases), stats, bases


KEYS = {"RETRY_AFTER_SCOPES": ["header:X-Api-Key"]}


def test_without_scopes_the_slot_is_the_host_and_nothing_is_written() -> None:
    scopes, stats, _ = scoper({})
    request = Request("http://a.example/x", headers={"X-Api-Key": "k"})
    assert scopes.slot_of(request) == "a.example"
    assert "download_slot" not in request.meta and SCOPE_SLOT not in request.meta
    assert not stats.values


def test_a_header_scope_becomes_the_download_slot_once() -> None:
    scopes, stats, _ = scoper(KEYS)
    a, b = (Request("http://api.example/x", headers={"X-Api-Key": key}) for key in ("secret-a", "secret-b"))
    slot_a, slot_b = scopes.slot_of(a), scopes.slot_of(b)
    assert slot_a != slot_b
    assert slot_a.startswith("header=api.example@x-api-key~") and "secret" not in slot_a
    assert a.meta["download_slot"] == slot_a
    retry = a.copy()
    assert scopes.slot_of(retry) == scopes.slot_of(a) == slot_a
    assert stats.values == {"retry_after/scopes/requests": 2, "retry_after/scopes/requests/header": 2}


def test_a_request_outside_every_scope_keeps_its_host() -> None:
    scopes, _, _ = scoper(KEYS)
    request = Request("http://api.example/x")
    assert scopes.slot_of(request) == "api.example"
    assert "download_slot" not in request.meta


def test_a_users_download_slot_wins() -> None:
    scopes, stats, _ = scoper(KEYS)
    request = Request("http://api.example/x", headers={"X-Api-Key": "k"}, meta={"download_slot": "mine"})
    assert scopes.slot_of(request) == "mine"
    assert not stats.values


def test_a_redirect_is_scoped_again_from_its_new_url() -> None:
    scopes, _, _ = scoper({"RETRY_AFTER_SCOPES": [{"path": ["/search"]}]})
    request = Request("http://api.example/search?q=1")
    assert scopes.slot_of(request).startswith("path=api.example_search~")
    moved = request.replace(url="http://other.example/search")
    assert scopes.slot_of(moved).startswith("path=other.example_search~")
    out = moved.replace(url="http://other.example/items/1")
    assert scopes.slot_of(out) == "other.example"
    assert "download_slot" not in out.meta and SCOPE_SLOT not in out.meta


def test_a_scope_slot_follows_its_hosts_per_slot_settings() -> None:
    per_slot: dict[str, Any] = {"api.example": {"concurrency": 2}}
    settings = {**KEYS, "RETRY_AFTER_SLOTS": {"api.example": {"max_retries": 9}}}
    scopes, _, bases = scoper(settings, per_slot)
    slot = scopes.slot_of(Request("http://api.example/x", headers={"X-Api-Key": "k"}))
    assert bases == {slot: "api.example"} and scopes.base_of(slot) == "api.example"
    assert per_slot[slot] == {"concurrency": 2}
    other = scopes.slot_of(Request("http://plain.example/x", headers={"X-Api-Key": "k"}))
    assert other not in bases and other not in per_slot  # no per-slot settings to follow


def test_the_config_finds_the_hosts_policy_for_its_scope_slots() -> None:
    config = load_config({**KEYS, "RETRY_AFTER_SLOTS": {"api.example": {"max_retries": 9}}})
    config.scope_bases["header=api.example@x-api-key~0123"] = "api.example"
    assert config.policy_for("header=api.example@x-api-key~0123").max_retries == 9
    assert config.policy_for("header=other@x-api-key~0123").max_retries == 4


def test_several_ids_at_run_time_are_one_combined_scope_said_once(caplog: pytest.LogCaptureFixture) -> None:
    scopes, stats, _ = scoper({})
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter.scopeslots"):
        first = Request("http://a.example/x", meta={"throttling_scopes": ["tenant-1", "region-eu"]})
        second = Request("http://a.example/y", meta={"throttling_scopes": ["region-eu", "tenant-1"]})
        assert scopes.slot_of(first) == scopes.slot_of(second) == "region-eu+tenant-1"
    assert stats.values["retry_after/scopes/combined"] == 2
    assert [r.getMessage()[:41] for r in caplog.records] == ["A request belongs to 2 scopes (tenant-1, "]


def test_a_single_throttling_scopes_id_scopes_a_request_without_settings() -> None:
    scopes, stats, _ = scoper({})
    assert scopes.slot_of(Request("http://a.example/x", meta={"throttling_scopes": "tenant-1"})) == "tenant-1"
    assert stats.values["retry_after/scopes/requests/named"] == 1


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        ({"RETRY_AFTER_SCOPES": ["slot", "header:X-Api-Key"]}, "RETRY_AFTER_SCOPES lists 2 scopes (slot, header:x-api-key)"),
        ({"RETRY_AFTER_SLOTS": {"a": {"scopes": ["proxy", "domain"]}}}, "RETRY_AFTER_SLOTS['a']['scopes'] lists 2 scopes"),
    ],
)
def test_two_scopes_for_one_request_fail_at_start(settings: dict[str, Any], where: str) -> None:
    with pytest.raises(RetryAfterSettingError) as error:
        load_config(settings)
    assert str(error.value).startswith(where)
    assert "keys a request by one scope" in str(error.value)


def test_a_slot_may_set_its_scopes_beside_its_policy() -> None:
    config = load_config({"RETRY_AFTER_SLOTS": {"api.example": {"scopes": ["header:X-Api-Key"], "max_retries": 8}}})
    assert config.policy_for("api.example").max_retries == 8
    assert [rule.kind for rule in config.scopes.rules_for("api.example")] == ["header"]
