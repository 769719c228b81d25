"""Loading the park file on the Scrapy side: claim what is due, rebuild it, crawl each at its time.

The claim runs in the park worker and takes a bounded batch (``CLAIM_RECORDS``,
``CLAIM_BYTES``); the next batch is claimed when this run's loaded requests
run low, so processes that share a backlog each take a part of it, and a
crawl holds one batch in memory, never the whole file. The claimed records wait for their
``not_before`` as their lines, in one heap under one timer (closing with
100,000 waiting costs one cancel, not 100,000), and each is rebuilt into a
request only when due, a few milliseconds of them per loop turn.
"""

from __future__ import annotations

import errno
import functools
import heapq
import itertools
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from .parkfile import Claimed, ParkFile
from .parkfold import Bad, Entry
from .parkrebuild import escape, rebuild
from .parkrecord import ParkRecord
from .scrapy_compat import nudge_engine
from .timers import call_later

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from .parktrack import ParkTracker
    from .parkworker import ParkWorker
    from .settings import Config

__all__ = ["ParkLoader", "update_failed"]

logger = logging.getLogger("scrapy_retryafter.parking")

_SLICE = 0.003
"""Seconds of rebuilding or crawling per loop turn."""
CLAIM_RECORDS = 10_000
"""Records per claim. A claim reads only what was appended since the last (``parkkept``), but
after a compaction (by any process) it folds the whole file again (about 1 s of worker time at
100,000 records), while a process starting a moment later still finds most of a large backlog free."""
CLAIM_BYTES = 32 * 1024 * 1024
"""Bytes of record lines per claim: the memory a batch may hold (records with large bodies
make smaller batches). A single record over it (up to MAX_LINE) is claimed alone."""
REFILL_BELOW = CLAIM_RECORDS // 4
"""The next batch is claimed when fewer loaded requests than this are waiting or in the crawl."""
_WARNINGS = 20
"""Set-aside lines named one WARNING each; past these, one line counts the rest."""


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def update_failed(path: object, error: BaseException, spider: object, told: list[bool],
                  compaction: bool = False) -> None:
    """One ERROR for a failed update of the park file. A compaction that fails on a full disk
    leaves the file as it is (every record and removal in it stands) and is tried again later:
    that is said once per run (``told``), not at every try."""
    if compaction and isinstance(error, OSError) and error.errno in _DISK_FULL:
        if not told[0]:
            told[0] = True
            logger.error(
                "Park file %(path)s could not be compacted, the disk is full (%(error)s): it stays as it is, "
                "nothing in it is lost, and compaction is tried again later (said once per run)",
                {"path": path, "error": error}, extra={"spider": spider},
            )
        return
    logger.error(
        "Park file %(path)s could not be updated (%(error)s): handled records stay and may be "
        "fetched again by a later run",
        {"path": path, "error": error}, extra={"spider": spider},
    )


def _free_piecewise(items: list[Any]) -> None:
    """Drop a long list a slice at a time (in the worker: one call would hold the GIL)."""
    while items:
        del items[-512:]
        time.sleep(0)


class ParkLoader:
    """One crawl's load of the park file: its claim, and the claimed requests until each is crawled."""

    def __init__(self, crawler: Crawler, config: Config, file: ParkFile, spider_name: str,
                 tracker: ParkTracker, worker: ParkWorker, disk_full_told: list[bool] | None = None) -> None:
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
        self._waiting: list[tuple[float, int, str, bytes]] = []
        self._order = itertools.count()
        self._timer: Any = None
        self._timer_at = 0.0
        self._warned = 0
        self.more = 0
        """Due records the last claim left in the file for the next one."""
        self.claims = 0
        self.disk_full_told = [False] if disk_full_told is None else disk_full_told
        """Shared with the flush's compactions: a full disk is told once per run."""

    @property
    def pending(self) -> int:
        """Loaded requests waiting for their not_before."""
        return len(self._waiting)

    def start(self) -> None:
        self.loading = True
        self.claims += 1
        self.worker.run(self._claim, self._loaded, time.time())

    def refill(self, idle: bool = False) -> bool:
        """Claim the next batch if the last one left some and this run's loaded requests are
        running low; whether a claim is under way. Records waiting for a later not_before count:
        a batch due in an hour is held in memory once, not claimed again at every idle round."""
        if self.loading:
            return True
        if self.closed or not self.more:
            return False
        # Idle, nothing of the batch is in the crawl (a request the tracker missed cannot hold it up).
        if len(self._waiting) + (0 if idle else len(self.tracker.live)) >= REFILL_BELOW:
            return False
        self.more = 0
        self.start()
        return True

    def keeps_open(self) -> str | None:
        """Why the idle spider must stay open (a claim under way or to make, requests waiting), if it must."""
        if self.refill(idle=True):
            return "the park file is being read"
        if self._waiting:
            return f"{len(self._waiting)} parked request(s) wait for their not_before"
        return None

    def _claim(self, now: float) -> Claimed:
        name = self.spider_name

        def take(entry: Entry) -> bool | None:
            if entry.spider and entry.spider != name:
                return False
            if entry.not_before - now > self.config.policy_for(entry.slot).max_delay:
                return None
            return True

        claimed = self.file.claim(take, parse=False, limit=CLAIM_RECORDS, max_bytes=CLAIM_BYTES)
        self.claimed_in_worker.update(record_id for _, record_id, _ in claimed.lines)
        return claimed

    def _loaded(self, claimed: Claimed | None, error: BaseException | None) -> None:
        if error is not None or claimed is None:
            self.loading = False
            self.more = 0
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
        if claimed.bad:
            self.worker.run(self._set_aside, self._set_aside_failed, [])
        self.more = claimed.more
        self._schedule(claimed, 0)

    def _schedule(self, claimed: Claimed, start: int) -> None:
        """Queue the claimed lines by not_before, a few milliseconds per loop turn.

        They stay bytes until due: 100,000 rebuilt requests waiting in memory
        made every full garbage collection walk them, on the reactor.
        """
        began = time.perf_counter()
        lines = claimed.lines
        position = start
        while position < len(lines) and not self.closed:
            not_before, record_id, line = lines[position]
            lines[position] = None  # type: ignore[call-overload]  # freed one by one
            position += 1
            heapq.heappush(self._waiting, (not_before, next(self._order), record_id, line))
            if not position % 64 and time.perf_counter() - began > _SLICE:
                break
        if lines:
            self.tracker.track()
        self._arm()
        if position < len(lines) and not self.closed:
            call_later(0, functools.partial(self._schedule, claimed, position))
            return
        self.loading = False
        if lines or claimed.later:
            logger.info(
                "Park file %(path)s: %(loaded)d request(s) due within their max delay rescheduled, "
                "%(more)d more left for the next batch, %(later)d due later left in the file",
                {"path": self.file.path, "loaded": len(lines), "more": claimed.more, "later": claimed.later},
                extra={"spider": self.crawler.spider},
            )
        if not self.closed and not lines:
            nudge_engine(self.crawler)  # the engine may have gone idle while the file was read
        self.refill()

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
        """Rebuild and crawl the requests whose time has come, a few milliseconds per loop turn."""
        self._timer = None
        began = time.perf_counter()
        engine = self._engine()
        now = time.time()
        refused: list[Bad] = []
        spider = self.crawler.spider
        while self._waiting and self._waiting[0][0] <= now and not self.closed:
            _, _, record_id, line = heapq.heappop(self._waiting)
            try:
                record = ParkRecord.from_line(line.decode("ascii"))
                request = rebuild(record, spider)
            except (ValueError, UnicodeDecodeError) as error:
                self._refuse(refused, record_id, line, str(error))
            else:
                self.stats.inc_value("retry_after/unparked")
                if engine is not None:
                    engine.crawl(request)
            if time.perf_counter() - began > _SLICE:
                self._timer, self._timer_at = call_later(0, self._due), 0.0
                break
        else:
            self._arm()
        self.refill()
        if refused and not self.closed:
            self.worker.run(self._set_aside, self._set_aside_failed, refused)

    def _refuse(self, refused: list[Bad], record_id: str, line: bytes, why: str) -> None:
        url = None
        try:
            url = json.loads(line).get("url")
        except (ValueError, AttributeError):
            pass
        if self._warned < _WARNINGS:
            self._warned += 1
            self.set_aside_warning(record_id, url if isinstance(url, str) else None, why)
        else:
            self.stats.inc_value("retry_after/park_file_set_aside")
        refused.append(Bad(line, why, record_id, url[:200] if isinstance(url, str) else None))

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
        named = self.file.torn_path.name
        self.file.set_aside(refused)
        try:
            self.file.compact()  # sets aside the lines the claim found
        except OSError as error:  # the file stands; tried again at the next compaction
            update_failed(self.file.path, error, self.crawler.spider, self.disk_full_told, compaction=True)
        if self.file.torn_path.name != named:
            logger.warning(
                "Park file %(path)s: %(named)s was refused (%(why)s); lines named as set aside there are in %(torn)s",
                {"path": self.file.path, "named": named, "why": self.file.torn_refused, "torn": self.file.torn_path.name},
                extra={"spider": self.crawler.spider},
            )

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
