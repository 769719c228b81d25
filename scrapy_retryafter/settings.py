"""Reading and validating the RETRY_AFTER_* settings once, at crawl start.

A typo in a setting should stop the crawl before the first request with a
message that names the setting and what it accepts, not surface an hour later
as a crawl that never waits.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from .backoff import STRATEGIES
from .banrules import BanRuleSettingError, load_ban_rules
from .floors import CrawlDelaySettingError, load_crawl_delay_settings
from .policy import SlotPolicy
from .scopes import load_scope_config

__all__ = [
    "KNOWN_SETTINGS",
    "SETTING_NAMES",
    "Config",
    "RedisConfig",
    "RetryAfterSettingError",
    "load_config",
    "unknown_settings",
    "unused_slot_keys",
    "warn_unknown_settings",
    "warn_unused_slot_keys",
]

logger = logging.getLogger(__name__)


class RetryAfterSettingError(ValueError):
    """A RETRY_AFTER_* setting has a value the package cannot use."""


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


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError
    number = float(value)
    if not math.isfinite(number):
        raise ValueError
    return number


def _integer(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, float) and not value.is_integer():
        raise ValueError
    return int(value)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError


def _codes(value: Any) -> frozenset[int]:
    if isinstance(value, Mapping):
        raise TypeError
    if isinstance(value, str):
        value = [part for part in value.replace(",", " ").split() if part]
    codes = frozenset(_integer(code) for code in value)
    if not codes or any(not 100 <= code <= 599 for code in codes):
        raise ValueError
    return codes


def _strategy(value: Any) -> str:
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in STRATEGIES:
        raise ValueError
    return name


def _deadline(value: Any) -> float:
    """None (or 0) means no deadline, so a per-slot override can lift a global one."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return math.inf
    number = _number(value)
    return math.inf if number == 0 else number


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
"""RFC 9110's methods and PATCH: a name outside them is a typo more often than a custom method."""


def _methods(value: Any) -> frozenset[str]:
    if isinstance(value, Mapping):
        raise TypeError
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not all(isinstance(method, str) and method.strip().upper() in HTTP_METHODS for method in value):
        raise ValueError
    return frozenset(method.strip().upper() for method in value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


_METHODS_ACCEPTED = (
    f"a list of HTTP methods ({', '.join(map(repr, sorted(HTTP_METHODS)))}), e.g. ['GET', 'HEAD']"
)

_Check = tuple[Callable[[Any], Any], Callable[[Any], bool], str]

_CHECKS: dict[str, _Check] = {
    "http_codes": (_codes, bool, "a non-empty list of HTTP status codes from 100 to 599"),
    "pad": (_number, lambda v: v >= 1.0, "a number >= 1.0 (the server's wait is never shortened)"),
    "max_delay": (_number, lambda v: v > 0, "a number of seconds > 0"),
    "max_retries": (_integer, lambda v: v >= 0, "a whole number >= 0"),
    "backoff_base": (_number, lambda v: v > 0, "a number of seconds > 0"),
    "backoff_max": (_number, lambda v: v > 0, "a number of seconds > 0"),
    "wake_jitter": (_number, lambda v: v >= 0, "a number of seconds >= 0"),
    "adaptive": (_boolean, lambda v: True, "True or False"),
    "ratelimit_headers": (_boolean, lambda v: True, "True or False"),
    "circuit_threshold": (_integer, lambda v: v >= 1, "a whole number >= 1"),
    "circuit_open_seconds": (_number, lambda v: v > 0, "a number of seconds > 0"),
    "budget_max_tokens": (_number, lambda v: v >= 1, "a number >= 1"),
    "budget_token_ratio": (_number, lambda v: 0 < v <= 1, "a number > 0 and <= 1"),
    "backoff_strategy": (_strategy, bool, "one of " + ", ".join(map(repr, STRATEGIES))),
    "deadline": (_deadline, lambda v: v > 0, "a number of seconds > 0, or None for no deadline"),
    "server_error_methods": (_methods, lambda v: True, _METHODS_ACCEPTED),
    "host_down_threshold": (_integer, lambda v: v >= 1, "a whole number >= 1"),
}


def _checked(name: str, key: str, raw: Any) -> Any:
    return _checked_with(_CHECKS[key], name, raw)


def _policy(base: SlotPolicy, raw: Mapping[str, Any], where: Callable[[str], str]) -> SlotPolicy:
    values = {key: _checked(where(key), key, value) for key, value in raw.items()}
    policy = replace(base, **values)
    if policy.backoff_max < policy.backoff_base:
        raise RetryAfterSettingError(
            f"{where('backoff_max')} must be >= {where('backoff_base')}; "
            f"got {policy.backoff_max!r} < {policy.backoff_base!r}"
        )
    return policy


_SECRET_QUERY = ("password", "pass", "passwd", "pwd", "secret", "token", "auth")


def _mask_url(url: str) -> str:
    """``url`` without any password: userinfo and ``?password=`` (the form redis-py reads for unix://)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***"
    rest, query_sep, query = rest.partition("?")
    location, slash, path = rest.partition("/")
    if "@" in location:
        credentials, _, host = location.rpartition("@")
        user, colon, _ = credentials.partition(":")
        location = f"{user}:***@{host}" if colon and user else f"***@{host}"
    if query_sep:
        pairs = (pair.partition("=") for pair in query.split("&"))
        query = "&".join(
            f"{key}{eq}{'***' if _secret_key(key) else value}" for key, eq, value in pairs
        )
    return f"{scheme}{sep}{location}{slash}{path}{query_sep}{query}"


def _secret_key(key: Any) -> bool:
    from urllib.parse import unquote

    return unquote(str(key)).lower() in _SECRET_QUERY


def _secrets_of(url: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    """Every password the URL and REDIS_PARAMS carry, as it may show up in a message."""
    from urllib.parse import unquote

    found: list[str] = []
    rest, _, query = url.partition("://")[2].partition("?")
    location = rest.partition("/")[0]
    if "@" in location:
        credentials = location.rpartition("@")[0]
        user, colon, password = credentials.partition(":")
        found.append(password if colon and user else credentials)
    for key, _, value in (pair.partition("=") for pair in query.split("&") if query):
        if _secret_key(key):
            found.append(value)
    found += [unquote(secret) for secret in found]
    found += [str(value) for key, value in params.items() if _secret_key(key) and value]
    return tuple(sorted({secret for secret in found if secret}, key=len, reverse=True))


@dataclass(frozen=True)
class RedisConfig:
    """Where the fleet's shared board lives, and how hard to try reaching it."""

    url: str = field(repr=False)
    params: Mapping[str, Any] = field(repr=False)
    """Extra redis-py client arguments (scrapy-redis's REDIS_PARAMS)."""
    prefix: str = "retry_after"
    fallback: bool = False
    refresh: float = 0.1
    timeout: float = 0.5
    memory_age: float = 604800.0
    """RETRY_AFTER_MEMORY_AGE: seconds a rate published to the fleet is remembered."""

    @property
    def safe_url(self) -> str:
        """The URL without its password (userinfo or query), for messages."""
        return _mask_url(self.url)

    def scrub(self, text: str) -> str:
        """``text`` (an error from redis-py, say) with every password of this config masked."""
        for secret in _secrets_of(self.url, self.params):
            text = text.replace(secret, "***")
        return text


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

    def policy_for(self, slot: str) -> SlotPolicy:
        return self.slots.get(slot, self.default)

    @property
    def all_codes(self) -> frozenset[int]:
        codes = set(self.default.http_codes)
        for policy in self.slots.values():
            codes |= policy.http_codes
        return frozenset(codes)


def _bool(name: str, raw: Any) -> bool:
    try:
        return _boolean(raw)
    except ValueError:
        raise RetryAfterSettingError(f"{name} must be True or False; got {raw!r}") from None


def _interval(name: str, raw: Any) -> float:
    try:
        value = _number(raw)
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


_REDIS_CHECKS: dict[str, _Check] = {
    "RETRY_AFTER_REDIS_PREFIX": (_text, lambda v: bool(v.strip()), "a non-empty string"),
    "RETRY_AFTER_REDIS_FALLBACK": (_boolean, lambda v: True, "True or False"),
    "RETRY_AFTER_REDIS_REFRESH": (_number, lambda v: 0 < v <= 0.25, "a number of seconds > 0 and <= 0.25"),
    "RETRY_AFTER_REDIS_TIMEOUT": (_number, lambda v: 0 < v <= 5, "a number of seconds > 0 and <= 5"),
}
_REDIS_FIELDS = {
    "RETRY_AFTER_REDIS_PREFIX": "prefix",
    "RETRY_AFTER_REDIS_FALLBACK": "fallback",
    "RETRY_AFTER_REDIS_REFRESH": "refresh",
    "RETRY_AFTER_REDIS_TIMEOUT": "timeout",
}
_URL_SCHEMES = ("redis://", "rediss://", "unix://")
_MEMORY_AGE: _Check = (
    _number, lambda v: 60 <= v <= 10 * 365 * 86400, "a number of seconds >= 60 and <= 315360000 (ten years)"
)

_OTHER_SETTINGS = (
    "RETRY_AFTER_ENABLED",
    "RETRY_AFTER_SLOTS",
    "RETRY_AFTER_PARKING",
    "RETRY_AFTER_PARK_FILE",
    "RETRY_AFTER_LOGSTATS_INTERVAL",
    "RETRY_AFTER_ALL_RETRIES",
    "RETRY_AFTER_REDIS_URL",
    "RETRY_AFTER_MEMORY_AGE",
    "RETRY_AFTER_ROBOTSTXT_OBEY",
    "RETRY_AFTER_ROBOTSTXT_MAX_DELAY",
    "RETRY_AFTER_BAN_RULES",
    "RETRY_AFTER_BAN_BODY_BYTES",
)
NOT_YET_READ = ("RETRY_AFTER_SCOPES",)
"""Settings whose parsers ship (scopes.py) but that no crawl reads yet: set,
they get a WARNING saying so rather than the closest-name hint."""
KNOWN_SETTINGS: frozenset[str] = (
    frozenset(SETTING_NAMES.values()) | frozenset(_REDIS_FIELDS) | frozenset(_OTHER_SETTINGS) | frozenset(NOT_YET_READ)
)
"""Every setting the package reads. A new setting goes into one of the three
tables above, or the guard warns that it is unknown."""

_MEANT = {"CAP": "RETRY_AFTER_MAX_DELAY", "RETRIES": "RETRY_AFTER_MAX_RETRIES", "DELAY": "RETRY_AFTER_MAX_DELAY"}
"""Words people reach for that are not close in spelling to the name they mean."""


def _redis(get: Callable[[str], Any], memory_age: float) -> RedisConfig | None:
    """RETRY_AFTER_REDIS_URL, else the Redis a scrapy-redis project already names.

    An empty RETRY_AFTER_REDIS_URL keeps the board local even then.
    """
    raw_params = get("REDIS_PARAMS") or {}
    if not isinstance(raw_params, Mapping):
        raise RetryAfterSettingError(
            f"REDIS_PARAMS must be a dict of redis-py client arguments; got a {type(raw_params).__name__}"
        )
    params = {key: value for key, value in raw_params.items() if key not in ("redis_cls", "url")}
    url = get("RETRY_AFTER_REDIS_URL")
    name = "RETRY_AFTER_REDIS_URL"
    if url is None:
        name = "REDIS_URL"
        url = get("REDIS_URL") or raw_params.get("url")
        if url is None and (get("REDIS_HOST") or get("REDIS_PORT")):
            url = f"redis://{get('REDIS_HOST') or 'localhost'}:{int(get('REDIS_PORT') or 6379)}"
    if url is None or url == "" or url is False:
        return None
    if not isinstance(url, str) or not url.startswith(_URL_SCHEMES):
        raise RetryAfterSettingError(
            f"{name} must be a Redis URL (redis://host:port/db, rediss://... or unix://...); "
            f"got {_mask_url(url) if isinstance(url, str) else type(url).__name__}"
        )
    values = {
        key: _checked_with(_REDIS_CHECKS[setting], setting, get(setting))
        for setting, key in _REDIS_FIELDS.items()
        if get(setting) is not None
    }
    return RedisConfig(url=url, params=params, memory_age=memory_age, **values)


def _checked_with(check: _Check, name: str, raw: Any) -> Any:
    convert, ok, accepted = check
    try:
        value = convert(raw)
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or not ok(value):
        raise RetryAfterSettingError(f"{name} must be {accepted}; got {raw!r}")
    return value


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
        overrides = {key: value for key, value in overrides.items() if key != "ignore_robots_txt"}
        unknown = sorted(set(overrides) - known, key=repr)
        if unknown:
            raise RetryAfterSettingError(
                f"RETRY_AFTER_SLOTS[{slot!r}] has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"accepted keys: {', '.join(sorted(known | {'ignore_robots_txt'}))}"
            )
        slots[slot] = _policy(default, overrides, functools.partial(_slot_key_name, slot))
    parking = _bool("RETRY_AFTER_PARKING", True if get("RETRY_AFTER_PARKING") is None else get("RETRY_AFTER_PARKING"))
    logstats = get("RETRY_AFTER_LOGSTATS_INTERVAL")
    interval = 30.0 if logstats is None else _interval("RETRY_AFTER_LOGSTATS_INTERVAL", logstats)
    all_retries = get("RETRY_AFTER_ALL_RETRIES")
    all_retries = False if all_retries is None else _bool("RETRY_AFTER_ALL_RETRIES", all_retries)
    raw_age = get("RETRY_AFTER_MEMORY_AGE")
    memory_age = 604800.0 if raw_age is None else _checked_with(_MEMORY_AGE, "RETRY_AFTER_MEMORY_AGE", raw_age)
    try:
        load_scope_config(get)  # checked at start, though no crawl applies scopes yet
    except ValueError as error:
        raise RetryAfterSettingError(str(error)) from None
    return Config(
        enabled=enabled, default=default, slots=slots, parking=parking,
        park_file=_park_file(get("RETRY_AFTER_PARK_FILE")), logstats_interval=interval,
        all_retries=all_retries, redis=_redis(get, memory_age), memory_age=memory_age,
    )


def _park_file(raw: Any) -> str | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str) or "\0" in raw:
        raise RetryAfterSettingError(f"RETRY_AFTER_PARK_FILE must be a file path (str or os.PathLike); got {raw!r}")
    return raw


def _closest(name: str) -> str:
    suffix = name[len("RETRY_AFTER_"):]
    if suffix in _MEANT:
        return _MEANT[suffix]

    def likeness(known: str) -> float:
        tail = known[len("RETRY_AFTER_"):]
        prefix = tail.startswith(suffix) or suffix.startswith(tail)
        return difflib.SequenceMatcher(None, suffix, tail).ratio() + (0.5 if prefix else 0.0)

    return max(sorted(KNOWN_SETTINGS), key=likeness)


def unknown_settings(names: Iterable[Any]) -> list[tuple[str, str]]:
    """(unknown RETRY_AFTER_* name, the closest known name), sorted by name."""
    unknown = {name for name in names if isinstance(name, str) and name.startswith("RETRY_AFTER_")} - KNOWN_SETTINGS
    return [(name, _closest(name)) for name in sorted(unknown)]


def warn_unknown_settings(settings: Mapping[str, Any] | Any, log: logging.Logger = logger) -> list[str]:
    """One WARNING per RETRY_AFTER_* setting the package does not read: a typo is otherwise silent."""
    lines = [
        f"Unknown setting {name} is ignored; did you mean {closest}?"
        for name, closest in unknown_settings(list(settings.keys()))
    ]
    lines += [
        f"{name} is not read by this release yet (scopes are parsed, not applied): it is ignored"
        for name in NOT_YET_READ
        if name in settings
    ]
    for line in lines:
        log.warning("%s", line)
    return lines


def _slot_hint(key: str, used: set[str]) -> str:
    host = urlsplit(key).hostname if "://" in key else None
    if host and host in used:
        return f"a slot is named by its host alone: {host!r}"
    match = difflib.get_close_matches(key, sorted(used), n=1, cutoff=0.6)
    if match:
        return f"did you mean {match[0]!r}?"
    return "a slot is named by the request's host, or by its download_slot meta"


def unused_slot_keys(config: Config, used: Iterable[str]) -> list[str]:
    """A line per RETRY_AFTER_SLOTS key that no request's download slot matched.

    ``used`` is every slot that got a response in this crawl. A key in URL form
    or with a typo never matches, and its overrides silently never apply.
    """
    if not config.enabled:
        return []
    seen = set(used)
    return [
        f"RETRY_AFTER_SLOTS[{key!r}] matched no request's download slot, so its settings never applied; "
        + _slot_hint(key, seen)
        for key in sorted(config.slots)
        if key not in seen
    ]


def warn_unused_slot_keys(config: Config, used: Iterable[str], log: logging.Logger = logger) -> list[str]:
    """Call at spider_closed with the slots that got responses; logs one WARNING per unused key."""
    lines = unused_slot_keys(config, used)
    for line in lines:
        log.warning("%s", line)
    return lines
