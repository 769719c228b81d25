"""Reading and validating the RETRY_AFTER_* settings once, at crawl start.

A typo in a setting should stop the crawl before the first request with a
message that names the setting and what it accepts, not surface an hour later
as a crawl that never waits.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .backoff import STRATEGIES
from .banrules import BanRuleSettingError, load_ban_rules
from .floors import CrawlDelaySettingError, load_crawl_delay_settings
from .policy import SlotPolicy
from .redisconfig import REDIS_FIELDS, RedisConfig, load_redis_config
from .scopes import ScopeConfig, check_one_scope, load_scope_config
from .settingvalues import (
    HTTP_METHODS,
    Check,
    RetryAfterSettingError,
    boolean,
    checked_with,
    deadline_seconds,
    http_methods,
    integer,
    number,
    status_codes,
    strategy_name,
)

__all__ = [
    "KNOWN_SETTINGS",
    "SETTING_NAMES",
    "Config",
    "RetryAfterSettingError",
    "load_config",
]

logger = logging.getLogger(__name__)


SETTING_NAMES: dict[str, str] = {
    "http_codes": "RETRY_AFTER_HTTP_CODES",
    "pad": "RETRY_AFTER_PAD",
    "max_delay": "RETRY_AFTER_MAX_DELAY",
    "max_retries": "RETRY_AFTER_MAX_RETRIES",
    "backoff_base": "RETRY_AFTER_BACKOFF_BASE",
    "backoff_max": "RETRY_AFTER_BACKOFF_MAX",
    "wake_jitter": "RETRY_AFTER_WAKE_JITTER",
    "adaptive": "RETRY_AFTER_ADAPTIVE",
    "ratelimit_headers": "RETRY_AFTER_RATELIMIT_HEADERS",
    "circuit_threshold": "RETRY_AFTER_CIRCUIT_THRESHOLD",
    "circuit_open_seconds": "RETRY_AFTER_CIRCUIT_OPEN_SECONDS",
    "budget_max_tokens": "RETRY_AFTER_BUDGET_MAX_TOKENS",
    "budget_token_ratio": "RETRY_AFTER_BUDGET_TOKEN_RATIO",
    "backoff_strategy": "RETRY_AFTER_BACKOFF_STRATEGY",
    "deadline": "RETRY_AFTER_DEADLINE",
    "server_error_methods": "RETRY_AFTER_SERVER_ERROR_METHODS",
    "host_down_threshold": "RETRY_AFTER_HOST_DOWN_THRESHOLD",
}


_METHODS_ACCEPTED = (
    f"a list of HTTP methods ({', '.join(map(repr, sorted(HTTP_METHODS)))}), e.g. ['GET', 'HEAD']"
)

_CHECKS: dict[str, Check] = {
    "http_codes": (status_codes, bool, "a non-empty list of HTTP status codes from 100 to 599"),
    "pad": (number, lambda v: v >= 1.0, "a number >= 1.0 (the server's wait is never shortened)"),
    "max_delay": (number, lambda v: v > 0, "a number of seconds > 0"),
    "max_retries": (integer, lambda v: v >= 0, "a whole number >= 0"),
    "backoff_base": (number, lambda v: v > 0, "a number of seconds > 0"),
    "backoff_max": (number, lambda v: v > 0, "a number of seconds > 0"),
    "wake_jitter": (number, lambda v: v >= 0, "a number of seconds >= 0"),
    "adaptive": (boolean, lambda v: True, "True or False"),
    "ratelimit_headers": (boolean, lambda v: True, "True or False"),
    "circuit_threshold": (integer, lambda v: v >= 1, "a whole number >= 1"),
    "circuit_open_seconds": (number, lambda v: v > 0, "a number of seconds > 0"),
    "budget_max_tokens": (number, lambda v: v >= 1, "a number >= 1"),
    "budget_token_ratio": (number, lambda v: 0 < v <= 1, "a number > 0 and <= 1"),
    "backoff_strategy": (strategy_name, bool, "one of " + ", ".join(map(repr, STRATEGIES))),
    "deadline": (deadline_seconds, lambda v: v > 0, "a number of seconds > 0, or None for no deadline"),
    "server_error_methods": (http_methods, lambda v: True, _METHODS_ACCEPTED),
    "host_down_threshold": (integer, lambda v: v >= 1, "a whole number >= 1"),
}


def _checked(name: str, key: str, raw: Any) -> Any:
    return checked_with(_CHECKS[key], name, raw)


def _policy(base: SlotPolicy, raw: Mapping[str, Any], where: Callable[[str], str]) -> SlotPolicy:
    values = {key: _checked(where(key), key, value) for key, value in raw.items()}
    policy = replace(base, **values)
    if policy.backoff_max < policy.backoff_base:
        raise RetryAfterSettingError(
            f"{where('backoff_max')} must be >= {where('backoff_base')}; "
            f"got {policy.backoff_max!r} < {policy.backoff_base!r}"
        )
    return policy


@dataclass(frozen=True)
class Config:
    enabled: bool
    default: SlotPolicy
    slots: Mapping[str, SlotPolicy]
    parking: bool = True
    park_file: str | None = None
    """None: inside JOBDIR when set, else under the project's .scrapy directory."""
    logstats_interval: float = 30.0
    """Seconds between live-view lines about held slots; 0 turns them off."""
    all_retries: bool = False
    """RETRY_AFTER_ALL_RETRIES: take over Scrapy's retries of RETRY_HTTP_CODES and RETRY_EXCEPTIONS."""
    redis: RedisConfig | None = None
    memory_age: float = 604800.0
    """RETRY_AFTER_MEMORY_AGE: seconds a remembered per-host limit lives (the fleet's rates too)."""
    host_state: bool = True
    """RETRY_AFTER_HOST_STATE: keep refusals in the per-host state file for the next run."""
    host_state_file: str | None = None
    """RETRY_AFTER_HOST_STATE_FILE; None: ``retry_after.hosts.json`` beside the park file."""

    scopes: ScopeConfig = field(default_factory=ScopeConfig)
    """RETRY_AFTER_SCOPES and the slots' ``scopes``."""
    scope_bases: dict[str, str] = field(default_factory=dict, compare=False)
    """Scope slot -> the slot whose RETRY_AFTER_SLOTS entry it follows (filled as requests get scopes)."""

    def policy_for(self, slot: str) -> SlotPolicy:
        policy = self.slots.get(slot)
        if policy is not None:
            return policy
        base = self.scope_bases.get(slot) if self.scope_bases else None
        return self.default if base is None else self.slots.get(base, self.default)

    @property
    def all_codes(self) -> frozenset[int]:
        codes = set(self.default.http_codes)
        for policy in self.slots.values():
            codes |= policy.http_codes
        return frozenset(codes)


def _bool(name: str, raw: Any) -> bool:
    try:
        return boolean(raw)
    except ValueError:
        raise RetryAfterSettingError(f"{name} must be True or False; got {raw!r}") from None


def _interval(name: str, raw: Any) -> float:
    try:
        value = number(raw)
    except (TypeError, ValueError, OverflowError):
        value = -1.0
    if value < 0:
        raise RetryAfterSettingError(f"{name} must be a number of seconds >= 0 (0 turns it off); got {raw!r}")
    return value


def _slots(raw: Any) -> dict[str, Mapping[str, Any]]:
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raw = None
    if not isinstance(raw, Mapping) or not all(
        isinstance(key, str) and isinstance(value, Mapping) for key, value in raw.items()
    ):
        raise RetryAfterSettingError(
            "RETRY_AFTER_SLOTS must be a dict of slot name to a dict of "
            f"policy values; got {raw!r}"
        )
    return {key: dict(value) for key, value in raw.items()}


_NOT_POLICY_KEYS = frozenset({"ignore_robots_txt", "scopes"})
"""RETRY_AFTER_SLOTS keys read by other modules than the policy's (floors.py, scopes.py)."""

_MEMORY_AGE: Check = (
    number, lambda v: 60 <= v <= 10 * 365 * 86400, "a number of seconds >= 60 and <= 315360000 (ten years)"
)

_OTHER_SETTINGS = (
    "RETRY_AFTER_ENABLED",
    "RETRY_AFTER_SLOTS",
    "RETRY_AFTER_PARKING",
    "RETRY_AFTER_PARK_FILE",
    "RETRY_AFTER_HOST_STATE",
    "RETRY_AFTER_HOST_STATE_FILE",
    "RETRY_AFTER_LOGSTATS_INTERVAL",
    "RETRY_AFTER_ALL_RETRIES",
    "RETRY_AFTER_REDIS_URL",
    "RETRY_AFTER_MEMORY_AGE",
    "RETRY_AFTER_ROBOTSTXT_OBEY",
    "RETRY_AFTER_ROBOTSTXT_MAX_DELAY",
    "RETRY_AFTER_BAN_RULES",
    "RETRY_AFTER_BAN_BODY_BYTES",
    "RETRY_AFTER_SCOPES",
)
NOT_YET_READ: tuple[str, ...] = ()
"""Settings whose parsers ship (scopes.py) but that no crawl reads yet: set,
they get a WARNING saying so rather than the closest-name hint."""
KNOWN_SETTINGS: frozenset[str] = (
    frozenset(SETTING_NAMES.values()) | frozenset(REDIS_FIELDS) | frozenset(_OTHER_SETTINGS) | frozenset(NOT_YET_READ)
)
"""Every setting the package reads. A new setting goes into one of the three
tables above, or the guard warns that it is unknown."""

def load_config(settings: Mapping[str, Any] | Any) -> Config:
    """Build the validated configuration from Scrapy settings (or a dict).

    A bad value raises RetryAfterSettingError, logged first as one ERROR
    line: Scrapy prints an exception raised while a crawl starts inside an
    asyncio "Task exception was never retrieved" traceback (Scrapy 2.19) or
    Twisted's "Unhandled error in Deferred" (2.13); the line above it is what
    a user reads.
    """
    try:
        return _load_config(settings)
    except RetryAfterSettingError as error:
        logger.error("%s", error)
        raise


def _slot_key_name(slot: str, key: str) -> str:
    return f"RETRY_AFTER_SLOTS[{slot!r}][{key!r}]"


def _load_config(settings: Mapping[str, Any] | Any) -> Config:
    get = settings.get
    enabled = _bool("RETRY_AFTER_ENABLED", True if get("RETRY_AFTER_ENABLED") is None else get("RETRY_AFTER_ENABLED"))
    defaults = SlotPolicy()
    given = {
        key: get(name)
        for key, name in SETTING_NAMES.items()
        if get(name) is not None
    }
    default = _policy(defaults, given, SETTING_NAMES.__getitem__)
    try:
        load_crawl_delay_settings(get)
    except CrawlDelaySettingError as error:
        raise RetryAfterSettingError(str(error)) from None
    try:
        load_ban_rules(get)
    except BanRuleSettingError as error:
        raise RetryAfterSettingError(str(error)) from None
    known = {f.name for f in fields(SlotPolicy)}
    slots: dict[str, SlotPolicy] = {}
    for slot, overrides in _slots(get("RETRY_AFTER_SLOTS")).items():
        overrides = {key: value for key, value in overrides.items() if key not in _NOT_POLICY_KEYS}
        unknown = sorted(set(overrides) - known, key=repr)
        if unknown:
            raise RetryAfterSettingError(
                f"RETRY_AFTER_SLOTS[{slot!r}] has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"accepted keys: {', '.join(sorted(known | _NOT_POLICY_KEYS))}"
            )
        slots[slot] = _policy(default, overrides, functools.partial(_slot_key_name, slot))
    parking = _bool("RETRY_AFTER_PARKING", True if get("RETRY_AFTER_PARKING") is None else get("RETRY_AFTER_PARKING"))
    logstats = get("RETRY_AFTER_LOGSTATS_INTERVAL")
    interval = 30.0 if logstats is None else _interval("RETRY_AFTER_LOGSTATS_INTERVAL", logstats)
    all_retries = get("RETRY_AFTER_ALL_RETRIES")
    all_retries = False if all_retries is None else _bool("RETRY_AFTER_ALL_RETRIES", all_retries)
    raw_age = get("RETRY_AFTER_MEMORY_AGE")
    memory_age = 604800.0 if raw_age is None else checked_with(_MEMORY_AGE, "RETRY_AFTER_MEMORY_AGE", raw_age)
    raw_state = get("RETRY_AFTER_HOST_STATE")
    host_state = True if raw_state is None else _bool("RETRY_AFTER_HOST_STATE", raw_state)
    try:
        scopes = load_scope_config(get)
        check_one_scope(scopes)
    except ValueError as error:
        raise RetryAfterSettingError(str(error)) from None
    return Config(
        enabled=enabled, default=default, slots=slots, parking=parking,
        park_file=_park_file(get("RETRY_AFTER_PARK_FILE")), logstats_interval=interval,
        all_retries=all_retries, redis=load_redis_config(get, memory_age), memory_age=memory_age,
        host_state=host_state, host_state_file=_park_file(get("RETRY_AFTER_HOST_STATE_FILE"), "RETRY_AFTER_HOST_STATE_FILE"),
        scopes=scopes,
    )


def _park_file(raw: Any, name: str = "RETRY_AFTER_PARK_FILE") -> str | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str) or "\0" in raw:
        raise RetryAfterSettingError(f"{name} must be a file path (str or os.PathLike); got {raw!r}")
    return raw


