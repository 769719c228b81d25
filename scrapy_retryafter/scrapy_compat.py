"""Every use of a Scrapy attribute that is not public API, in one place.

Each entry says which Scrapy versions it was checked against (2.13 to 2.19,
the supported range) and what breaks if Scrapy changes it, so a Scrapy
upgrade is checked here and nowhere else. redis/queue.py still reads
``downloader.slots`` and a slot's ``active``/``concurrency`` itself.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.core.scheduler import Scheduler
from scrapy.pqueues import DownloaderAwarePriorityQueue
from scrapy.pqueues import _path_safe as _scrapy_path_safe
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.core.engine import ExecutionEngine
    from scrapy.crawler import Crawler

__all__ = [
    "ROUND_ROBIN",
    "downloader_middlewares",
    "downloader_slots",
    "engine_of",
    "is_closing",
    "last_selected",
    "next_slot",
    "nudge_engine",
    "scheduled",
    "scheduler_state_file",
    "path_safe",
    "queued_in_downloader",
    "set_last_selected",
    "slot_key",
    "slot_load",
    "start_pending",
    "take_queued",
    "transferring",
]

# scrapy.pqueues._path_safe (2.13-2.19): the directory name of a slot's disk queue under JOBDIR.
path_safe: Callable[[str], str] = _scrapy_path_safe

# DownloaderAwarePriorityQueue._next_slot and ._last_selected_slot (2.19; absent in 2.13): ties among
# the least busy slots go round-robin by name after the last chosen; 2.13 takes the smallest name.
ROUND_ROBIN = hasattr(DownloaderAwarePriorityQueue, "_next_slot")


def next_slot(queue: DownloaderAwarePriorityQueue, stats: list[tuple[int, str]], *, update_state: bool) -> str:
    """Scrapy 2.19's round-robin choice among (active, slot) pairs (ROUND_ROBIN only)."""
    return queue._next_slot(stats, update_state=update_state)


def set_last_selected(queue: DownloaderAwarePriorityQueue, slot: str | None) -> None:
    """Where 2.19's round robin goes on from (ROUND_ROBIN only)."""
    queue._last_selected_slot = slot


def last_selected(queue: DownloaderAwarePriorityQueue) -> str | None:
    return getattr(queue, "_last_selected_slot", None)


# scrapy.core.downloader.Slot.active / .concurrency (2.13-2.19): requests of the slot in the downloader,
# and how many it may have. One C-level call in the queue's hot loop: (active set, concurrency).
slot_load: Callable[[Any], tuple[Any, int]] = operator.attrgetter("active", "concurrency")


def engine_of(crawler: Crawler | None) -> ExecutionEngine | None:
    """``crawler.engine``, or None when not crawling: 2.13 answers None there, 2.19 raises RuntimeError."""
    try:
        return getattr(crawler, "engine", None)
    except RuntimeError:
        return None


def is_closing(crawler: Crawler | None) -> bool:
    """True once the crawl stops (``engine.running`` false) or its spider closes: ``engine._slot``
    is None or its ``closing`` Deferred is set (2.13-2.19; CLOSESPIDER_*, ``engine.close_spider``).

    A spider's close waits for the downloader to empty, so a request held there must leave then,
    not only when the engine stops.
    """
    engine = engine_of(crawler)
    if engine is None or not engine.running:
        return True
    engine_slot = getattr(engine, "_slot", None)
    return engine_slot is None or getattr(engine_slot, "closing", None) is not None


def slot_key(crawler: Crawler | None, request: Request) -> str:
    """``Downloader.get_slot_key`` (2.13-2.19), or without an engine (a middleware or queue used
    outside a crawl) what it answers with no IP concurrency: ``download_slot`` meta, else the host."""
    engine = engine_of(crawler)
    if engine is not None:
        return engine.downloader.get_slot_key(request)
    meta_slot = request.meta.get("download_slot")
    if meta_slot is not None:
        return str(meta_slot)
    return urlparse_cached(request).hostname or ""


def per_slot_settings(crawler: Crawler | None) -> dict[str, Any] | None:
    """``engine.downloader.per_slot_settings`` (2.13-2.19): DOWNLOAD_SLOTS as the downloader reads it."""
    settings = getattr(getattr(engine_of(crawler), "downloader", None), "per_slot_settings", None)
    return settings if isinstance(settings, dict) else None


def downloader_slots(crawler: Crawler) -> dict[str, Any]:
    """``engine.downloader.slots`` (2.13-2.19): download slot key -> scrapy.core.downloader.Slot."""
    engine = engine_of(crawler)
    slots: dict[str, Any] = getattr(getattr(engine, "downloader", None), "slots", {})
    return slots


def downloader_middlewares(crawler: Crawler) -> list[Any]:
    """``engine.downloader.middleware.middlewares`` (2.13-2.19): the built downloader middlewares."""
    assert crawler.engine is not None
    return list(crawler.engine.downloader.middleware.middlewares)


def transferring(crawler: Crawler, slot: str) -> int:
    """``Slot.transferring`` (2.13-2.19): how many of ``slot``'s requests are on the wire."""
    downloader_slot = downloader_slots(crawler).get(slot)
    return len(downloader_slot.transferring) if downloader_slot is not None else 0


def queued_in_downloader(crawler: Crawler, slot: str) -> int:
    """``len(Slot.queue)`` (2.13-2.19): ``slot``'s requests in the downloader, not on the wire yet."""
    downloader_slot = downloader_slots(crawler).get(slot)
    return len(downloader_slot.queue) if downloader_slot is not None else 0


def scheduled(crawler: Crawler) -> int | None:
    """``len(engine._slot.scheduler)`` (2.13-2.19): requests in Scrapy's own scheduler, None for
    another one (scrapy-redis counts in Redis: a round trip) or when it cannot be told."""
    scheduler = getattr(getattr(engine_of(crawler), "_slot", None), "scheduler", None)
    if not isinstance(scheduler, Scheduler):
        return None
    try:
        return len(scheduler)
    except Exception:  # a user's SCHEDULER_*_QUEUE without a working __len__
        return None


def start_pending(crawler: Crawler) -> bool:
    """``ExecutionEngine._start`` (2.13-2.19, None once Spider.start() is read to its end): True while
    start requests may still come, or when this cannot be told (a renamed attribute reads as pending)."""
    engine = engine_of(crawler)
    return engine is None or getattr(engine, "_start", True) is not None


def take_queued(crawler: Crawler, slot: str) -> list[tuple[Any, Any]]:
    """Empty ``Slot.queue`` (2.13-2.19, a deque of (request, deferred)): the slot's requests that
    reached the downloader but are not on the wire yet."""
    downloader_slot = downloader_slots(crawler).get(slot)
    if downloader_slot is None or not downloader_slot.queue:
        return []
    waiting = list(downloader_slot.queue)
    downloader_slot.queue.clear()
    return waiting


def nudge_engine(crawler: Crawler) -> None:
    """``engine._slot.nextcall.schedule()`` (2.13-2.19): make the engine look at the scheduler soon.

    Scrapy has no public call for it; without it a reopened slot waits for the next heartbeat (5 s).
    """
    engine_slot = getattr(engine_of(crawler), "_slot", None)
    nextcall = getattr(engine_slot, "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


def scheduler_state_file(jobdir: Path) -> Path:
    """``JOBDIR/requests.queue/active.json`` (2.13-2.19): the scheduler's saved priority-queue state,
    a dict for DownloaderAwarePriorityQueue and its subclasses, a list for ScrapyPriorityQueue."""
    return jobdir / "requests.queue" / "active.json"
