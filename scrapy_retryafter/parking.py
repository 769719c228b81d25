"""The Scrapy side of the park file: postpone a request instead of failing it.

A parked request is written to the park file and handed back to the engine
marked as parked; our ``request_scheduled`` handler drops it there. That way
the spider's errback is not called (the request is postponed, not failed),
which raising IgnoreRequest from a middleware would do.

The next run of the spider reschedules the records that are due, each at its
``not_before``, and removes a record once its request has been handled (a
response came back, or it left the downloader for good). Until then the
record stays, so a crash costs a repeat, never a loss.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider, IgnoreRequest
from scrapy.utils.project import data_path
from scrapy.utils.request import request_from_dict

from .failures import NOT_BEFORE, PREVIOUS_WAIT, STARTED
from .parkfile import ParkFile, ParkRecord, encode_value, decode_value, iso
from .timers import call_later, looping_call

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from .settings import Config

__all__ = ["PARK_ID", "Parking", "park_file_path"]

logger = logging.getLogger(__name__)

PARK_ID = "retry_after_park_id"
"""Meta key of a request loaded from the park file: the record it came from."""
_PARKED = "_retry_after_parked"
_TRANSIENT_META = (
    # Attempts, waits and the deadline's start belong to this run: the next one starts afresh.
    "retry_after_throttles", "retry_times", "download_latency", _PARKED, STARTED, NOT_BEFORE, PREVIOUS_WAIT,
)
_FLUSH_INTERVAL = 5.0


def park_file_path(configured: str | None, jobdir: str | None, spider_name: str) -> Path:
    if configured:
        return Path(configured)
    if jobdir:
        return Path(jobdir, "retry_after.parked.jsonl")
    return Path(data_path(f"retry_after/{spider_name}.parked.jsonl", createdir=False))


class Parking:
    def __init__(self, crawler: Crawler, config: Config, held_at_close: Any) -> None:
        """``held_at_close()`` yields (request, slot, seconds left) still held when the crawl closes."""
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        self.held_at_close = held_at_close
        spider = crawler.spider
        self.spider_name = spider.name if spider is not None else ""
        self.jobdir = crawler.settings.get("JOBDIR") or None
        self.file = ParkFile(park_file_path(config.park_file, self.jobdir, self.spider_name))
        self.by_slot: collections.Counter[str] = collections.Counter()
        self._live: collections.Counter[str] = collections.Counter()
        self._reparked: set[str] = set()
        self._done: set[str] = set()
        self._pending: dict[str, Any] = {}
        self._flusher: Any = None
        self._closed = False
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        # Per-request signals cost every request of the crawl: connected only
        # once something is parked or loaded.
        self._dropping = self._tracking = False

    @property
    def path(self) -> Path:
        return self.file.path

    def park(self, request: Request, slot: str, reason: str, detail: str, attempts: int, wait: float) -> Request:
        """Write ``request`` to the park file; return it marked for the engine to drop."""
        record_id = request.meta.get(PARK_ID)
        record = ParkRecord(
            url=request.url,
            slot=slot,
            reason=reason,
            detail=detail,
            attempts=attempts,
            not_before=time.time() + max(0.0, wait),
            request=self._serialize(request),
            spider=self.spider_name,
        )
        if record_id:
            record.id = record_id
            self._reparked.add(record_id)
        if not self._dropping:
            self.crawler.signals.connect(self._request_scheduled, signal=signals.request_scheduled)
            self._dropping = True
        self.file.add(record)
        self.by_slot[slot] += 1
        self.stats.inc_value("retry_after/parked")
        self.stats.inc_value(f"retry_after/parked/{reason}")
        request.meta[_PARKED] = True
        return request

    def _serialize(self, request: Request) -> dict[str, Any] | None:
        try:
            raw = request.to_dict(spider=self.crawler.spider)
            raw["meta"] = {key: value for key, value in raw["meta"].items() if key not in _TRANSIENT_META}
            return encode_value(raw)  # type: ignore[no-any-return]
        except (TypeError, ValueError) as error:
            self.stats.inc_value("retry_after/parked_url_only")
            logger.warning(
                "Parking %(url)s as its URL only: the request cannot be serialized (%(error)s)",
                {"url": request.url, "error": error},
                extra={"spider": self.crawler.spider},
            )
            return None

    def _request_scheduled(self, request: Request, **kwargs: Any) -> None:
        if request.meta.get(_PARKED):
            raise IgnoreRequest("parked")
        record_id = request.meta.get(PARK_ID)
        if record_id:
            self._live[record_id] += 1

    def _request_gone(self, request: Request, **kwargs: Any) -> None:
        record_id = request.meta.get(PARK_ID)
        if record_id and not request.meta.get(_PARKED):
            self._live[record_id] -= 1
            # A retry of it, if any, is scheduled in the same turn: settle after.
            call_later(0, functools.partial(self._settle, record_id))

    def _response_received(self, request: Request, **kwargs: Any) -> None:
        record_id = request.meta.get(PARK_ID)
        if record_id:
            self._done.add(record_id)

    def _settle(self, record_id: str) -> None:
        if self._live[record_id] <= 0 and record_id not in self._reparked:
            self._done.add(record_id)
            del self._live[record_id]

    def _spider_opened(self, **kwargs: Any) -> None:
        call_later(0, self._load)
        self._flusher = looping_call(self._flush)
        self._flusher.start(_FLUSH_INTERVAL, now=False)

    def _load(self) -> None:
        if self._closed:
            return
        now = time.time()
        loaded = later = 0
        for record in self.file.records().values():
            if record.spider and record.spider != self.spider_name:
                continue
            wait = record.not_before - now
            if wait > self.config.policy_for(record.slot).max_delay:
                later += 1
                continue
            request = self._request(record)
            if request is None:
                continue
            if not self._tracking:
                self._track()
            loaded += 1
            if wait <= 0:
                self._crawl(record.id, request)
            else:
                self._pending[record.id] = call_later(wait, functools.partial(self._crawl, record.id, request))
        if loaded or later:
            self.stats.inc_value("retry_after/unparked", loaded)
            logger.info(
                "Park file %(path)s: %(loaded)d request(s) due within their max delay rescheduled, "
                "%(later)d due later left in the file",
                {"path": self.path, "loaded": loaded, "later": later},
                extra={"spider": self.crawler.spider},
            )

    def _track(self) -> None:
        """Follow the requests loaded from the file until they are handled."""
        connect = self.crawler.signals.connect
        if not self._dropping:
            connect(self._request_scheduled, signal=signals.request_scheduled)
            self._dropping = True
        connect(self._request_gone, signal=signals.request_left_downloader)
        connect(self._request_gone, signal=signals.request_dropped)
        connect(self._response_received, signal=signals.response_received)
        self._tracking = True

    def _request(self, record: ParkRecord) -> Request | None:
        try:
            if record.request is None:
                request = Request(record.url, dont_filter=True)
            else:
                request = request_from_dict(decode_value(record.request), spider=self.crawler.spider)
                # Seen once already (and remembered by a resumed JOBDIR's dupefilter).
                request = request.replace(dont_filter=True)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            logger.warning(
                "Park file record %(id)s for %(url)s cannot be rebuilt (%(error)s); kept in the file",
                {"id": record.id, "url": record.url, "error": error},
                extra={"spider": self.crawler.spider},
            )
            return None
        request.meta[PARK_ID] = record.id
        return request

    def _crawl(self, record_id: str, request: Request) -> None:
        self._pending.pop(record_id, None)
        engine = self.crawler.engine
        if engine is None or self._closed:
            return
        engine.crawl(request)

    def _spider_idle(self, **kwargs: Any) -> None:
        if self._pending:
            raise DontCloseSpider(f"{len(self._pending)} parked request(s) wait for their not_before")

    def _flush(self) -> None:
        if self._done:
            done, self._done = self._done, set()
            self.file.remove(done)

    def _spider_closed(self, **kwargs: Any) -> None:
        self._closed = True
        if self._flusher is not None and self._flusher.running:
            self._flusher.stop()
        for timer in self._pending.values():
            timer.cancel()
        self._pending.clear()
        for request, slot, wait, why in self.held_at_close():
            self.park(request, slot, "held_at_close", why, int(request.meta.get("retry_after_throttles", 0)), wait)
            logger.warning(
                "Parked %(request)s on %(slot)s: the crawl closed while %(why)s; not before %(when)s",
                {"request": request, "slot": slot, "why": why, "when": iso(time.time() + wait)},
                extra={"spider": self.crawler.spider},
            )
        if self.jobdir:
            # Loaded requests still queued are saved with the job and come back on resume.
            self._done.update(key for key, live in self._live.items() if live > 0 and key not in self._reparked)
        self._flush()
        self.file.close()
