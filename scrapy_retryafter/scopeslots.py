"""A scoped request's scope becomes its download slot, so all throttle state is keyed by the scope.

Scrapy's downloader (concurrency, delay), the add-on's queue partitions
(JOBDIR directory names), the board (cooldown, pace, breaker, budget, quota),
the park file, the per-host state file and the Redis keys all name a request's
state by its download slot. Writing the scope key into the request's
``download_slot`` meta keys every one of them by the scope at once: two API
keys on one host are two slots, each paced, cooled and queued on its own.

One scope per request. A request that belongs to several scopes would have to
wait until each of them lets it go; this release keys a request by one scope.
A configuration that can give a request two scopes fails at start
(`scopes.check_one_scope`); a user callable or a ``throttling_scopes`` meta that
gives several at run time is throttled as their combination, one state for
the set, with one WARNING and the stat ``retry_after/scopes/combined``.

A user's own ``download_slot`` meta wins: the request is keyed by it, as
before. The scope slot of a host still gets the host's ``RETRY_AFTER_SLOTS``
policy and ``DOWNLOAD_SLOTS`` settings (`base_of`, and the copy into the
downloader's per-slot settings).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.httpobj import urlparse_cached

from .scopekeys import combination_key, plain_key
from .scopes import ScopeConfig, scopes_of

if TYPE_CHECKING:
    from scrapy import Request

__all__ = ["SCOPE_SLOT", "ScopeSlots"]

logger = logging.getLogger(__name__)

SCOPE_SLOT = "retry_after_scope_slot"
"""Request meta: [the scope slot written into ``download_slot``, the slot it replaced, the URL]."""
_MAX_BASES = 100_000
"""Scope slots remembered for their host's per-slot settings; past it the oldest goes."""


class ScopeSlots:
    """Gives each scoped request its scope key as its download slot, and finds the host behind a scope slot."""

    def __init__(
        self,
        config: ScopeConfig,
        fallback: Callable[[Request], str],
        overridden: frozenset[str],
        per_slot_settings: Callable[[], dict[str, Any] | None],
        stats: Any,
        bases: dict[str, str],
    ) -> None:
        self.config = config
        self.active = config != ScopeConfig()
        """Scopes configured; without, only a request's ``throttling_scopes`` meta scopes it."""
        self._fallback = fallback
        """The download slot Scrapy would give the request (the host)."""
        self._overridden = overridden
        self._per_slot_settings = per_slot_settings
        self._stats = stats
        self.bases = bases
        """Scope slot -> the slot it came from, for the slots with per-slot settings only."""
        self._warned = False

    def slot_of(self, request: Request) -> str:
        meta = request.meta
        given = meta.get("download_slot")
        kept = meta.get(SCOPE_SLOT)
        mark: list[Any] = kept if isinstance(kept, list) and len(kept) == 3 else [None, None, None]
        ours = given is not None and given == mark[0]
        if given is not None and not ours:
            return str(given)  # the user's, or the downloader's own write for an unscoped request
        if not ours and not self.active and "throttling_scopes" not in meta:
            return self._fallback(request)
        if ours and mark[2] == request.url:
            base = str(mark[1])
        elif ours:  # redirected: the scope of the new URL, from its own host
            base = urlparse_cached(request).hostname or ""
        else:
            base = self._fallback(request)
        keys = scopes_of(request, base, self.config)
        slot = keys[0] if len(keys) == 1 else combination_key(keys)
        if slot in (base, plain_key(base)):
            if ours:  # redirected out of its scope: the downloader keys it by its host again
                del meta["download_slot"], meta[SCOPE_SLOT]
            return base
        if not ours or mark[0] != slot or mark[2] != request.url:
            meta["download_slot"] = slot
            meta[SCOPE_SLOT] = [slot, base, request.url]
            if not ours:
                self._count(slot, keys)
        if slot not in self.bases and base in self._overridden:
            self._remember(slot, base)
        return slot

    def base_of(self, slot: str) -> str:
        """The slot a scope slot came from (for its per-slot settings); ``slot`` itself otherwise."""
        return self.bases.get(slot, slot)

    def _remember(self, slot: str, base: str) -> None:
        if len(self.bases) >= _MAX_BASES:
            del self.bases[next(iter(self.bases))]
        self.bases[slot] = base
        per_slot = self._per_slot_settings()
        if per_slot is not None and base in per_slot and slot not in per_slot:
            per_slot[slot] = per_slot[base]  # DOWNLOAD_SLOTS: read when the downloader makes the slot

    def _count(self, slot: str, keys: tuple[str, ...]) -> None:
        self._stats.inc_value("retry_after/scopes/requests")
        kind = slot.partition("=")[0] if len(keys) == 1 and "=" in slot else "named"
        if len(keys) == 1:
            self._stats.inc_value(f"retry_after/scopes/requests/{kind}")
            return
        self._stats.inc_value("retry_after/scopes/combined")
        if not self._warned:
            self._warned = True
            logger.warning(
                "A request belongs to %d scopes (%s): this release keys a request by one scope, so it is "
                "throttled as their combination, one state for the set, not held until each scope lets it go",
                len(keys), ", ".join(keys),
            )
