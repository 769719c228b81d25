"""Which throttle scopes a request belongs to: the slot, or what the server really limits by.

Servers limit by more than the host: per API key, per endpoint, per client
address (so per proxy exit), per registrable domain. A scope is one such
thing; its key names the state (cooldown, pace, breaker, budget, quota) that
a throttle of the server charges. A request may belong to several scopes and
is sent when all of them let it go.

Pure: no Scrapy, no Twisted. The shell gathers a request's facts
(`RequestFacts`) and asks `ScopeConfig.scopes_for` for its keys.

Scope keys are file-name safe (JOBDIR directory names, Redis keys, park file
records) and at most `MAX_KEY_LENGTH` characters. The ``slot`` scope's key is
the download slot key itself whenever that is already a plain name (a host
name), so a crawl with the default configuration keys everything as before.
Built-in kinds other than ``slot`` are ``kind=...``. A header or meta value
only ever appears hashed: an API key or a session cookie never reaches a key,
a log line or a stat.

Names follow Scrapy's proposed throttling scopes (pull request 6931) where
that costs nothing: a request's ``throttling_scopes`` meta key (a string, a
list or a dict whose keys are scope ids) replaces the configured scopes of
that request, as it would replace the default scope there.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .scopekeys import (
    MAX_SCOPES,
    MAX_VALUE_CHARS,
    digest,
    kind_key,
    plain_key,
    proxy_part,
    registrable_domain,
)

__all__ = [
    "KINDS",
    "SCOPES_META",
    "RequestFacts",
    "ScopeConfig",
    "ScopeRule",
    "ScopeSettingError",
    "check_one_scope",
    "facts_of",
    "load_scope_config",
    "parse_scopes",
    "scopes_of",
]

logger = logging.getLogger(__name__)

KINDS = ("slot", "proxy", "domain", "path", "header", "meta", "callable")
SETTING = "RETRY_AFTER_SCOPES"

class ScopeSettingError(ValueError):
    """RETRY_AFTER_SCOPES (or a slot's ``scopes``) has a value the package cannot use."""


@dataclass(frozen=True)
class RequestFacts:
    """What the shell knows about a request, in plain values."""

    slot: str
    """Scrapy's download slot key (``download_slot`` meta or the host)."""
    url: str
    proxy: str | None = None
    """``request.meta["proxy"]``, credentials and all: only its host, port and a user hash are kept."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Lower-case header name to value, for the names ``ScopeConfig.header_names`` lists."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Request meta (read for ``meta`` scopes and ``throttling_scopes``)."""
    request: Any = None
    """The Scrapy request itself, for user callables only."""

    @property
    def host(self) -> str:
        try:
            return (urlsplit(self.url).hostname or "").lower()
        except ValueError:
            return ""

    @property
    def path(self) -> str:
        try:
            return urlsplit(self.url).path or "/"
        except ValueError:
            return "/"


@dataclass(frozen=True)
class ScopeRule:
    """One entry of RETRY_AFTER_SCOPES."""

    kind: str
    header: str = ""
    """``header``: the lower-case header name; ``meta``: the meta key."""
    paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """``path``: host (or ``*``) to its prefixes, longest first."""
    function: Callable[[RequestFacts], Any] | None = None
    name: str = ""
    """``callable``: its import path (for messages)."""

    def key(self, facts: RequestFacts) -> list[str]:
        """The scope keys this rule gives the request; none when it does not apply."""
        kind = self.kind
        if kind == "slot":
            return [plain_key(facts.slot)]
        host = facts.host
        if kind == "proxy":
            return [kind_key("proxy", f"{proxy_part(facts.proxy)}@{host}", None)]
        if kind == "domain":
            domain = registrable_domain(host) if host else ""
            return [kind_key("domain", domain)] if domain else [plain_key(facts.slot)]
        if kind == "path":
            prefix = self._prefix(host, facts.path)
            return [] if prefix is None else [kind_key("path", f"{host}{prefix}")]
        if kind == "header":
            value = facts.headers.get(self.header)
            if value is None or value == "":
                return []
            value = value[:MAX_VALUE_CHARS]
            return [kind_key("header", f"{host}@{self.header}", f"{host}\0{self.header}\0{value}")]
        if kind == "meta":
            if self.header not in facts.meta or facts.meta[self.header] is None:
                return []
            value = repr(facts.meta[self.header])[:MAX_VALUE_CHARS]
            return [kind_key("meta", f"{host}@{self.header}", f"{host}\0{self.header}\0{value}")]
        assert kind == "callable" and self.function is not None
        return [plain_key(scope) for scope in _scope_ids(self.function(facts), self.name)]

    def _prefix(self, host: str, path: str) -> str | None:
        for prefix in self.paths.get(host, ()) + self.paths.get("*", ()):
            if path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
                return prefix
        return None


def _scope_ids(value: Any, where: str) -> list[str]:
    """Scope ids from a string, an iterable or a dict (its keys), as Scrapy's proposal accepts."""
    if value is None:
        return []
    if isinstance(value, str):
        ids = [value]
    elif isinstance(value, Mapping):
        ids = list(value.keys())
    elif isinstance(value, Iterable):
        ids = list(value)
    else:
        raise TypeError(f"{where} gave {value!r}; expected None, a string, a list of strings or a dict")
    if not all(isinstance(scope, str) and scope for scope in ids):
        raise TypeError(f"{where} gave {value!r}; scope ids must be non-empty strings")
    return ids


@dataclass(frozen=True)
class ScopeConfig:
    """The validated scopes: the default list and the slots that override it."""

    default: tuple[ScopeRule, ...] = (ScopeRule("slot"),)
    slots: Mapping[str, tuple[ScopeRule, ...]] = field(default_factory=dict)

    @property
    def header_names(self) -> frozenset[str]:
        """Header names the shell must copy into ``RequestFacts.headers``."""
        return frozenset(
            rule.header for rules in (self.default, *self.slots.values()) for rule in rules if rule.kind == "header"
        )

    @property
    def fingerprint(self) -> str:
        """Changes when the configuration does: scopes a request kept from another configuration are stale."""
        return digest(repr((self.default, sorted(self.slots.items()))))[:8]

    def rules_for(self, slot: str) -> tuple[ScopeRule, ...]:
        return self.slots.get(slot, self.default)

    def scopes_for(self, facts: RequestFacts) -> tuple[str, ...]:
        """The request's scope keys: never empty (the slot when nothing else applies), no duplicates.

        A ``throttling_scopes`` meta key replaces the configured rules. A
        callable that raises or returns garbage falls back to the slot, with
        one warning per callable: a bug in it must not stop the crawl.
        """
        keys: list[str] = []
        given = facts.meta.get("throttling_scopes") if facts.meta else None
        if given is not None:
            try:
                keys = [plain_key(scope) for scope in _scope_ids(given, "meta['throttling_scopes']")]
            except TypeError as error:
                _warn_once("throttling_scopes", f"Ignoring a request's throttling_scopes meta: {error}")
        else:
            for rule in self.rules_for(facts.slot):
                try:
                    keys.extend(rule.key(facts))
                except Exception as error:  # noqa: BLE001  a user's callable may raise anything
                    _warn_once(rule.name, f"Scope callable {rule.name} failed ({error!r}): using the slot scope")
        if not keys:
            return (plain_key(facts.slot),)
        unique = tuple(dict.fromkeys(keys))
        if len(unique) > MAX_SCOPES:
            _warn_once("too-many", f"A request belongs to {len(unique)} scopes; only the first {MAX_SCOPES} are kept")
            unique = unique[:MAX_SCOPES]
        return unique


_warned: set[str] = set()


def _warn_once(what: str, message: str) -> None:
    if what not in _warned:
        _warned.add(what)
        logger.warning(message)


_ACCEPTED = (
    "a list of scopes, each one of 'slot', 'proxy', 'domain', 'header:<name>', 'meta:<key>', "
    "{'path': {'<host or *>': ['/prefix', ...]}} (or {'path': ['/prefix', ...]} for every host), "
    "{'header': '<name>'}, {'meta': '<key>'}, or {'callable': '<import path>'} "
    "(a function taking RequestFacts and returning scope ids)"
)


def _fail(where: str, raw: Any, why: str = "") -> ScopeSettingError:
    return ScopeSettingError(f"{where} must be {_ACCEPTED}; got {raw!r}{': ' + why if why else ''}")


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _header_name(value: Any, where: str, raw: Any) -> str:
    if not isinstance(value, str) or not _HEADER_NAME.fullmatch(value.strip()):
        raise _fail(where, raw, f"{value!r} is not an HTTP header name")
    return value.strip().lower()


def _paths(value: Any, where: str, raw: Any) -> dict[str, tuple[str, ...]]:
    if isinstance(value, (list, tuple)):
        value = {"*": value}
    if not isinstance(value, Mapping) or not value:
        raise _fail(where, raw, "a path scope needs a list of prefixes or a dict of host to prefixes")
    rules: dict[str, tuple[str, ...]] = {}
    for host, prefixes in value.items():
        if not isinstance(host, str) or not host.strip() or "/" in host:
            raise _fail(where, raw, f"{host!r} is not a host name or '*'")
        if isinstance(prefixes, str):
            prefixes = [prefixes]
        if not isinstance(prefixes, (list, tuple)) or not prefixes or not all(
            isinstance(p, str) and p.startswith("/") and p != "/" for p in prefixes
        ):
            raise _fail(where, raw, f"the prefixes of {host!r} must be paths starting with '/' (not '/' alone)")
        rules[host.strip().lower()] = tuple(sorted(set(prefixes), key=len, reverse=True))
    return rules


def _function(path: Any, where: str, raw: Any) -> tuple[Callable[[RequestFacts], Any], str]:
    if callable(path):
        return path, getattr(path, "__qualname__", repr(path))
    if not isinstance(path, str) or "." not in path:
        raise _fail(where, raw, f"{path!r} is not an import path such as 'myproject.scopes.by_tenant'")
    module, _, name = path.rpartition(".")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise _fail(where, raw, f"cannot import {path!r} ({error})") from None
    if not callable(function):
        raise _fail(where, raw, f"{path!r} is not callable")
    return function, path


def _rule(entry: Any, where: str, raw: Any) -> ScopeRule:
    if isinstance(entry, str):
        name, sep, argument = entry.strip().partition(":")
        name = name.strip().lower()
        if name in ("slot", "proxy", "domain") and not sep:
            return ScopeRule(name)
        if name == "header" and sep:
            return ScopeRule("header", header=_header_name(argument, where, raw))
        if name == "meta" and sep and argument.strip():
            return ScopeRule("meta", header=argument.strip())
        if name == "path" and sep:
            return ScopeRule("path", paths=_paths([argument.strip()], where, raw))
        raise _fail(where, raw, f"unknown scope {entry!r}")
    if callable(entry):
        function, name = _function(entry, where, raw)
        return ScopeRule("callable", function=function, name=name)
    if isinstance(entry, Mapping) and len(entry) == 1:
        ((kind, value),) = entry.items()
        if kind == "path":
            return ScopeRule("path", paths=_paths(value, where, raw))
        if kind == "header":
            return ScopeRule("header", header=_header_name(value, where, raw))
        if kind == "meta" and isinstance(value, str) and value.strip():
            return ScopeRule("meta", header=value.strip())
        if kind == "callable":
            function, name = _function(value, where, raw)
            return ScopeRule("callable", function=function, name=name)
    raise _fail(where, raw, f"cannot read the entry {entry!r}")


def parse_scopes(raw: Any, where: str = SETTING) -> tuple[ScopeRule, ...]:
    """Validate one scope list; ``None`` means the default (the slot only)."""
    if raw is None:
        return (ScopeRule("slot"),)
    if isinstance(raw, str):
        raw = [part for part in (p.strip() for p in raw.split(",")) if part]
    if isinstance(raw, Mapping) or callable(raw):
        raw = [raw]
    if not isinstance(raw, (list, tuple)):
        raise _fail(where, raw, "not a list")
    if not raw:
        raise _fail(where, raw, "an empty list would throttle nothing")
    rules = tuple(_rule(entry, where, raw) for entry in raw)
    kinds = [(rule.kind, rule.header) for rule in rules if rule.kind != "path" and rule.kind != "callable"]
    if len(kinds) != len(set(kinds)):
        raise _fail(where, raw, "a scope is listed twice")
    return rules


def load_scope_config(get: Callable[[str], Any]) -> ScopeConfig:
    """RETRY_AFTER_SCOPES and each ``RETRY_AFTER_SLOTS[slot]["scopes"]``, validated at start."""
    default = parse_scopes(get(SETTING), SETTING)
    slots_raw = get("RETRY_AFTER_SLOTS")
    slots: dict[str, tuple[ScopeRule, ...]] = {}
    if isinstance(slots_raw, Mapping):
        for slot, overrides in slots_raw.items():
            if isinstance(overrides, Mapping) and "scopes" in overrides:
                where = f"RETRY_AFTER_SLOTS[{slot!r}]['scopes']"
                slots[str(slot)] = parse_scopes(overrides["scopes"], where)
    return ScopeConfig(default=default, slots=slots)


def check_one_scope(config: ScopeConfig) -> None:
    """Fail at start where a request could get two scopes: this release throttles one per request."""
    for where, rules in (("RETRY_AFTER_SCOPES", config.default), *(
        (f"RETRY_AFTER_SLOTS[{slot!r}]['scopes']", rules) for slot, rules in sorted(config.slots.items())
    )):
        if len(rules) > 1:
            raise ScopeSettingError(
                f"{where} lists {len(rules)} scopes ({', '.join(_name(rule) for rule in rules)}); this release "
                "keys a request by one scope, so a request that belongs to several would not wait for each: "
                "list one scope (one 'path' entry takes the prefixes of several hosts: "
                "{'path': {'api.example.com': ['/search', '/export']}})"
            )


def _name(rule: ScopeRule) -> str:
    if rule.kind in ("header", "meta"):
        return f"{rule.kind}:{rule.header}"
    return rule.name or rule.kind


SCOPES_META = "retry_after_scopes"
"""Request meta key: [configuration fingerprint, URL, scope keys...], kept from the first time they were computed."""


def facts_of(request: Any, slot: str, config: ScopeConfig) -> RequestFacts:
    """A Scrapy request's facts (duck-typed: ``url``, ``meta``, ``headers.get``), only the headers the scopes read."""
    headers: dict[str, str] = {}
    for name in config.header_names:
        value = request.headers.get(name)
        if value is not None:
            text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            headers[name] = text[:MAX_VALUE_CHARS]
    return RequestFacts(
        slot=slot, url=request.url, proxy=request.meta.get("proxy"), headers=headers, meta=request.meta, request=request
    )


def scopes_of(request: Any, slot: str, config: ScopeConfig) -> tuple[str, ...]:
    """The request's scope keys, computed once and kept in its meta.

    Kept, because the scheduler files a request under its scopes before
    downloader middlewares add headers (Cookie, Authorization): computed again
    at the response, the keys could differ and the throttle would charge other
    state than the one the queue holds. Computed again when the URL changed
    (a redirect) or the configuration did (a resumed JOBDIR).
    """
    kept = request.meta.get(SCOPES_META)
    stamp = config.fingerprint
    if (
        isinstance(kept, (list, tuple))
        and 3 <= len(kept) <= MAX_SCOPES + 2
        and kept[0] == stamp
        and kept[1] == request.url
        and all(isinstance(key, str) and key for key in kept[2:])
    ):
        return tuple(kept[2:])
    keys = config.scopes_for(facts_of(request, slot, config))
    request.meta[SCOPES_META] = [stamp, request.url, *keys]
    return keys
