"""Loading the park file on the Scrapy side: claim what is due, rebuild it, crawl each at its time.

The claim runs in the park worker. Requests are rebuilt on the loop in
slices of a few milliseconds (the reactor stays free however many there
are), and wait for their ``not_before`` in one heap under one timer: closing
with 100,000 of them waiting costs one cancel, not 100,000.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from .parkfile import Claimed, ParkFile
from .parkfold import Bad, Entry
from .parkrebuild import escape, rebuild
from .scrapy_compat import nudge_engine
from .timers import call_later

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from .parktrack import ParkTracker
    from .parkworker import ParkWorker
    from .settings import Config

__all__ = ["ParkLoader"]

logger = logging.getLogger("scrapy_retryafter.parking")

_SLICE = 0.003
"""Seconds of rebuilding or crawling per loop turn."""
_WARNINGS = 20
"""Set-aside lines named one WARNING each; past these, one line counts the rest."""


def _free_piecewise(items: list[Any]) -> None:
    """Drop a long list a slice at a time (in the worker: one call would hold the GIL)."""
    while items:
        del items[-512:]
        time.sleep(0)


class ParkLoader:
    """One crawl's load of the park file: its claim, and the claimed requests until each is crawled."""

    def __init__(self, crawler: Crawler, config: Config, file: ParkFile, spider_name: str,
                 tracker: ParkTracker, worker: ParkWorker) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        self.file = file
        self.spider_name = spider_name
        self.tracker = tracker
        self.worker = worker
        self.loading = False
        self.closed = False
        self.claimed_in_worker: set[str] = set()
        """Ids this run claimed, as the worker knows them (the loop may learn them after closing)."""
        self._waiting: list[tuple[float, int, str, Request]] = []
        self._order = itertools.count()
        self._timer: Any = None
        self._timer_at = 0.0
        self._warned = 0

    @property
    def pending(self) -> int:
        """Loaded requests waiting for their not_before."""
        return len(self._waiting)

    def start(self) -> None:
        self.loading = True
        self.worker.run(self._claim, self._loaded, time.time())

    def _claim(self, now: float) -> Claimed:
        name = self.spider_name

        def take(entry: Entry) -> bool | None:
            if entry.spider and entry.spider != name:
                return False
            if entry.not_before - now > self.config.policy_for(entry.slot).max_delay:
                return None
            return True

        claimed = self.file.claim(take)
        self.claimed_in_worker.update(record.id for record in claimed.records)
        return claimed

    def _loaded(self, claimed: Claimed | None, error: BaseException | None) -> None:
        if error is not None or claimed is None:
            self.loading = False
            logger.error(
                "Park file %(path)s could not be read (%(error)s): nothing was loaded from it",
                {"path": self.file.path, "error": error}, extra={"spider": self.crawler.spider},
            )
            return
        for bad in claimed.bad[:_WARNINGS]:
            self.set_aside_warning(bad.id, bad.url, bad.why)
        self._warned = min(len(claimed.bad), _WARNINGS)
        if len(claimed.bad) > _WARNINGS:
            self.stats.inc_value("retry_after/park_file_set_aside", len(claimed.bad) - _WARNINGS)
            logger.warning(
                "Park file %(path)s: %(count)d more unreadable line(s) set aside in %(torn)s",
                {"path": self.file.path, "count": len(claimed.bad) - _WARNINGS, "torn": self.file.torn_path.name},
                extra={"spider": self.crawler.spider},
            )
        self._schedule(claimed, 0, [], 0)

    def _schedule(self, claimed: Claimed, start: int, refused: list[Bad], loaded: int) -> None:
        """Rebuild the claimed requests, a few milliseconds per loop turn."""
        began = time.perf_counter()
        records = claimed.records
        position = start
        spider = self.crawler.spider
        while position < len(records) and not self.closed:
            record = records[position]
            records[position] = None  # type: ignore[call-overload]  # freed one by one
            position += 1
            try:
                request = rebuild(record, spider)
            except ValueError as error:
                if self._warned < _WARNINGS:
                    self._warned += 1
                    self.set_aside_warning(record.id, record.url, str(error))
                else:
                    self.stats.inc_value("retry_after/park_file_set_aside")
                refused.append(Bad(record.to_line().encode("ascii"), str(error), record.id, record.url))
                continue
            self.tracker.track()
            loaded += 1
            heapq.heappush(self._waiting, (record.not_before, next(self._order), record.id, request))
            if time.perf_counter() - began > _SLICE:
                break
        self._arm()
        if position < len(records) and not self.closed:
            call_later(0, functools.partial(self._schedule, claimed, position, refused, loaded))
            return
        self.loading = False
        if (refused or claimed.bad) and not self.closed:
            self.worker.run(self._set_aside, self._set_aside_failed, refused)
        if loaded or claimed.later:
            self.stats.inc_value("retry_after/unparked", loaded)
            logger.info(
                "Park file %(path)s: %(loaded)d request(s) due within their max delay rescheduled, "
                "%(later)d due later left in the file",
                {"path": self.file.path, "loaded": loaded, "later": claimed.later},
                extra={"spider": self.crawler.spider},
            )
        if not self.closed and not loaded:
            nudge_engine(self.crawler)  # the engine may have gone idle while the file was read

    def _arm(self) -> None:
        """One timer, for the earliest waiting request."""
        if self.closed or not self._waiting:
            return
        earliest = self._waiting[0][0]
        if self._timer is not None:
            if self._timer_at <= earliest:
                return
            self._timer.cancel()
        self._timer_at = earliest
        self._timer = call_later(max(0.0, earliest - time.time()), self._due)

    def _due(self) -> None:
        """Crawl the requests whose time has come, a few milliseconds per loop turn."""
        self._timer = None
        began = time.perf_counter()
        engine = self._engine()
        now = time.time()
        while self._waiting and self._waiting[0][0] <= now and not self.closed:
            _, _, _, request = heapq.heappop(self._waiting)
            if engine is not None:
                engine.crawl(request)
            if time.perf_counter() - began > _SLICE:
                self._timer, self._timer_at = call_later(0, self._due), 0.0
                return
        self._arm()

    def _engine(self) -> Any:
        try:
            return self.crawler.engine
        except (AttributeError, RuntimeError):  # not crawling (yet, or any more)
            return None

    def close(self) -> None:
        """Nothing more is crawled; the waiting requests are dropped in the worker."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        waiting, self._waiting = self._waiting, []
        if waiting:
            try:
                self.worker.submit(_free_piecewise, waiting)
            except RuntimeError:
                pass  # the worker has shut down: freed here
        del waiting

    def _set_aside(self, refused: list[Bad]) -> None:
        self.file.set_aside(refused)
        self.file.compact()

    def _set_aside_failed(self, result: Any, error: BaseException | None) -> None:
        if error is not None:
            logger.error(
                "Park file %(path)s could not be updated (%(error)s): handled records stay and may be "
                "fetched again by a later run",
                {"path": self.file.path, "error": error}, extra={"spider": self.crawler.spider},
            )

    def set_aside_warning(self, record_id: str | None, url: str | None, why: str) -> None:
        self.stats.inc_value("retry_after/park_file_set_aside")
        logger.warning(
            "Park file %(path)s: record %(id)s for %(url)s set aside in %(torn)s: %(why)s",
            {
                "path": self.file.path, "id": record_id or "(no id)", "url": escape(url or "(no URL)"),
                "torn": self.file.torn_path.name, "why": escape(why),
            },
            extra={"spider": self.crawler.spider},
        )
