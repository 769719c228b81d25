"""The fleet's Redis connection settings, and keeping their passwords out of every message.

Read from RETRY_AFTER_REDIS_* or from the settings a scrapy-redis project
already has. Nothing here imports redis-py: a local crawl never needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .settingvalues import Check, RetryAfterSettingError, boolean, checked_with, number, text

__all__ = ["REDIS_FIELDS", "RedisConfig", "load_redis_config", "mask_url"]


_SECRET_QUERY = ("password", "pass", "passwd", "pwd", "secret", "token", "auth")


def mask_url(url: str) -> str:
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
        return mask_url(self.url)

    def scrub(self, text: str) -> str:
        """``text`` (an error from redis-py, say) with every password of this config masked."""
        for secret in _secrets_of(self.url, self.params):
            text = text.replace(secret, "***")
        return text


_REDIS_CHECKS: dict[str, Check] = {
    "RETRY_AFTER_REDIS_PREFIX": (text, lambda v: bool(v.strip()), "a non-empty string"),
    "RETRY_AFTER_REDIS_FALLBACK": (boolean, lambda v: True, "True or False"),
    "RETRY_AFTER_REDIS_REFRESH": (number, lambda v: 0 < v <= 0.25, "a number of seconds > 0 and <= 0.25"),
    "RETRY_AFTER_REDIS_TIMEOUT": (number, lambda v: 0 < v <= 5, "a number of seconds > 0 and <= 5"),
}
REDIS_FIELDS = {
    "RETRY_AFTER_REDIS_PREFIX": "prefix",
    "RETRY_AFTER_REDIS_FALLBACK": "fallback",
    "RETRY_AFTER_REDIS_REFRESH": "refresh",
    "RETRY_AFTER_REDIS_TIMEOUT": "timeout",
}
_URL_SCHEMES = ("redis://", "rediss://", "unix://")


def load_redis_config(get: Callable[[str], Any], memory_age: float) -> RedisConfig | None:
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
            f"got {mask_url(url) if isinstance(url, str) else type(url).__name__}"
        )
    values = {
        key: checked_with(_REDIS_CHECKS[setting], setting, get(setting))
        for setting, key in REDIS_FIELDS.items()
        if get(setting) is not None
    }
    return RedisConfig(url=url, params=params, memory_age=memory_age, **values)
