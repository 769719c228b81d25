"""The Scrapy side of the park file: postpone a request instead of failing it.

A parked request is written to the park file and handed back to the engine
marked as parked; our ``request_scheduled`` handler drops it there. That way
the spider's errback is not called (the request is postponed, not failed),
which raising IgnoreRequest from a middleware would do. When the record
cannot be made durable, ``park`` raises ParkFileError (an OSError) and the
request is not marked: the give-up path hands it to the spider instead.

The file is opened at ``spider_opened`` under the spider's own name and
nothing is created until something is parked. The next run *claims* the
records that are due, so processes sharing the file never take the same one,
reschedules each at its ``not_before``, and marks a record done once its
request has been handled (a response came back, or it left the downloader
for good). Until then the record stays claimed, and a claim of a process
that died goes back to the pool: a crash costs a repeat, never a loss.
Everything but ``park`` itself (claims, removals, compaction) runs in one
worker thread, off the reactor.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider, IgnoreRequest
from scrapy.utils.project import data_path
from scrapy.utils.request import request_from_dict

from . import parklock
from .failures import NOT_BEFORE, PREVIOUS_WAIT, STARTED
from .parkfile import Claimed, ParkFile, ParkFileError
from .parkfold import MAX_LINE, Bad, Entry
from .parkrecord import ParkRecord, decode_value, encode_value, iso
from .settings import RetryAfterSettingError
from .timers import call_from_thread, call_later, looping_call

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Spider
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
_LOAD_BATCH = 200
_WARNINGS = 20
"""Set-aside lines named one WARNING each; past these, one line counts the rest."""
_COMPACT_AFTER = 10_000
"""Records marked done by this run since its last compaction that start one."""


def park_file_path(configured: str | None, jobdir: str | None, spider_name: str) -> Path:
    if configured:
        return Path(configured)
    if jobdir:
        return Path(jobdir, "retry_after.parked.jsonl")
    return Path(data_path(f"retry_after/{spider_name}.parked.jsonl", createdir=False))


def _name_refused(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return "the spider has no name, and parked requests are kept per spider name"
    if name in (".", "..") or "\0" in name or "/" in name or (os.altsep and os.altsep in name) or os.sep in name:
        return f"the spider name {name!r} cannot be part of a file name"
    return None


def _escape(text: str, limit: int = 200) -> str:
    return text[:limit].encode("unicode_escape").decode("ascii")


class Parking:
    def __init__(self, crawler: Crawler, config: Config, held_at_close: Any) -> None:
        """``held_at_close()`` yields (request, slot, seconds left, why) still held when the crawl closes.

        Nothing is opened here (a crawler is often built long before it
        crawls, or never crawls); a configured path is checked at once.
        """
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        self.held_at_close = held_at_close
        self.jobdir = crawler.settings.get("JOBDIR") or None
        if getattr(parklock, "fcntl", None) is None:
            raise RetryAfterSettingError(
                "RETRY_AFTER_PARKING: parking needs POSIX file locks (fcntl), which this platform lacks; "
                "set RETRY_AFTER_PARKING = False"
            )
        if config.park_file:
            probe = ParkFile(config.park_file)
            try:
                probe.check()
            except ParkFileError as error:
                raise RetryAfterSettingError(f"RETRY_AFTER_PARK_FILE: {error}") from None
            finally:
                probe.close()
        self.file: ParkFile | None = None
        self.spider_name = ""
        self._refused: str | None = None
        self.by_slot: collections.Counter[str] = collections.Counter()
        self._live: collections.Counter[str] = collections.Counter()
        self._claimed_in_worker: set[str] = set()
        """Ids this run claimed, as the worker knows them (the loop may learn them after closing)."""
        self._reparked: set[str] = set()
        self._done: set[str] = set()
        self._pending: dict[str, Any] = {}
        self._flusher: Any = None
        self._flushing: concurrent.futures.Future[Any] | None = None
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._to_loop: Any = None
        self._loading = False
        self._closed = False
        self._warned = 0
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        # Per-request signals cost every request of the crawl: connected only
        # once something is parked or loaded.
        self._dropping = self._tracking = False

    @property
    def path(self) -> Path:
        if self.file is not None:
            return self.file.path
        return park_file_path(self.config.park_file, self.jobdir, self.spider_name or "<spider>")

    # -- parking ------------------------------------------------------------------------

    def park(self, request: Request, slot: str, reason: str, detail: str, attempts: int, wait: float) -> Request:
        """Write ``request`` to the park file; return it marked for the engine to drop.

        Raises ParkFileError (an OSError) when the record is not durable; the
        request is then untouched.
        """
        return self.park_many([(request, slot, reason, detail, attempts, wait)])[0]

    def park_many(self, items: Iterable[tuple[Request, str, str, str, int, float]]) -> list[Request]:
        """Park several requests with one locked write and one fsync; all or none."""
        items = list(items)
        file = self._writable()
        now = time.time()
        records = []
        for request, slot, reason, detail, attempts, wait in items:
            record = ParkRecord(
                url=request.url, slot=slot, reason=reason, detail=detail, attempts=attempts,
                not_before=now + max(0.0, wait), request=self._serialize(request), spider=self.spider_name,
            )
            record_id = request.meta.get(PARK_ID)
            if isinstance(record_id, str) and record_id:
                record.id = record_id
            if record.request is not None and len(record.to_line()) > MAX_LINE:
                self._url_only(request, f"its record would be over {MAX_LINE} bytes")
                record.request = None
            records.append(record)
        file.add_many(records)
        for (request, slot, reason, *_), record in zip(items, records):
            if request.meta.get(PARK_ID):
                self._reparked.add(record.id)
            self.by_slot[slot] += 1
            self.stats.inc_value("retry_after/parked")
            self.stats.inc_value(f"retry_after/parked/{reason}")
            request.meta[_PARKED] = True
        if items and not self._dropping:
            self.crawler.signals.connect(self._request_scheduled, signal=signals.request_scheduled)
            self._dropping = True
        return [request for request, *_ in items]

    def _writable(self) -> ParkFile:
        if self._refused is not None:
            raise ParkFileError(1, self._refused)
        if self.file is None:
            raise ParkFileError(1, "the park file opens with the spider; nothing can be parked before")
        return self.file

    def _serialize(self, request: Request) -> dict[str, Any] | None:
        try:
            raw = request.to_dict(spider=self.crawler.spider)
            raw["meta"] = {key: value for key, value in raw["meta"].items() if key not in _TRANSIENT_META}
            return encode_value(raw)
        except (TypeError, ValueError) as error:
            self._url_only(request, f"the request cannot be serialized ({error})")
            return None

    def _url_only(self, request: Request, why: str) -> None:
        self.stats.inc_value("retry_after/parked_url_only")
        logger.warning(
            "Parking %(url)s as its URL only: %(why)s",
            {"url": request.url, "why": why},
            extra={"spider": self.crawler.spider},
        )

    def _request_scheduled(self, request: Request, **kwargs: Any) -> None:
        if request.meta.get(_PARKED):
            raise IgnoreRequest("parked")
        record_id = request.meta.get(PARK_ID)
        if record_id:
            self._live[record_id] += 1

    # -- following loaded requests --------------------------------------------------------

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

    # -- opening and loading --------------------------------------------------------------

    def _spider_opened(self, spider: Spider | None = None, **kwargs: Any) -> None:
        spider = spider if spider is not None else self.crawler.spider
        name = getattr(spider, "name", None)
        refused = _name_refused(name)
        if refused is not None:
            self._refuse(f"{refused}; nothing can be parked (give the spider a name)")
            return
        self.spider_name = name  # type: ignore[assignment]
        self.file = ParkFile(park_file_path(self.config.park_file, self.jobdir, self.spider_name))
        try:
            self.file.check()
        except ParkFileError as error:
            self._refuse(f"{error}; nothing can be parked")
            return
        self._to_loop = call_from_thread()
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="retry_after_park")
        # No file, nothing to load: no read in the worker, so no DontCloseSpider
        # (and no extra spider_idle round for the spider's own handlers) while it runs.
        if os.path.lexists(self.file.path):
            self._loading = True
            self._in_worker(self._claim, self._loaded, time.time())
        self._flusher = looping_call(self._flush)
        self._flusher.start(_FLUSH_INTERVAL, now=False)

    def _refuse(self, why: str) -> None:
        self._refused = why
        logger.error("Park file: %(why)s", {"why": why}, extra={"spider": self.crawler.spider})

    def _in_worker(self, work: Any, then: Any, *args: Any) -> concurrent.futures.Future[Any]:
        """Run ``work(*args)`` in the worker; ``then(result, error)`` back on the crawl's loop.

        Where no loop can be reached from another thread, both run here and now.
        """
        assert self._worker is not None
        if self._to_loop is None:
            self._to_loop = call_from_thread()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._to_loop is not None:
            try:
                future = self._worker.submit(work, *args)
            except RuntimeError:  # shut down: the crawl has closed
                future.set_exception(ParkFileError(1, "the park file is closed"))
        else:
            try:
                future.set_result(work(*args))
            except Exception as error:  # noqa: BLE001 - handed to ``then`` as the worker would
                future.set_exception(error)
        to_loop = self._to_loop

        def done(future: concurrent.futures.Future[Any]) -> None:
            failure = future.exception()
            result = None if failure is not None else future.result()
            if to_loop is None:
                then(result, failure)
            else:
                to_loop(functools.partial(then, result, failure))

        future.add_done_callback(done)
        return future

    def _claim(self, now: float) -> Claimed:
        assert self.file is not None
        name = self.spider_name

        def take(entry: Entry) -> bool | None:
            if entry.spider and entry.spider != name:
                return False
            if entry.not_before - now > self.config.policy_for(entry.slot).max_delay:
                return None
            return True

        claimed = self.file.claim(take)
        self._claimed_in_worker.update(record.id for record in claimed.records)
        return claimed

    def _loaded(self, claimed: Claimed | None, error: BaseException | None) -> None:
        if error is not None or claimed is None:
            self._loading = False
            logger.error(
                "Park file %(path)s could not be read (%(error)s): nothing was loaded from it",
                {"path": self.path, "error": error}, extra={"spider": self.crawler.spider},
            )
            return
        for bad in claimed.bad[:_WARNINGS]:
            self._set_aside_warning(bad.id, bad.url, bad.why)
        self._warned = min(len(claimed.bad), _WARNINGS)
        if len(claimed.bad) > _WARNINGS:
            self.stats.inc_value("retry_after/park_file_set_aside", len(claimed.bad) - _WARNINGS)
            logger.warning(
                "Park file %(path)s: %(count)d more unreadable line(s) set aside in %(torn)s",
                {"path": self.path, "count": len(claimed.bad) - _WARNINGS, "torn": self.path.name + ".torn"},
                extra={"spider": self.crawler.spider},
            )
        self._schedule(claimed, 0, [], 0)

    def _schedule(self, claimed: Claimed, start: int, refused: list[Bad], loaded: int) -> None:
        """Rebuild and schedule the claimed requests, a batch per loop turn (the reactor stays free)."""
        now = time.time()
        batch = claimed.records[start:start + _LOAD_BATCH]
        claimed.records[start:start + len(batch)] = [None] * len(batch)  # type: ignore[list-item]  # freed batch by batch
        for record in batch:
            if self._closed:
                break
            try:
                request = self._request(record)
            except ValueError as error:
                if self._warned < _WARNINGS:
                    self._warned += 1
                    self._set_aside_warning(record.id, record.url, str(error))
                else:
                    self.stats.inc_value("retry_after/park_file_set_aside")
                refused.append(Bad(record.to_line().encode("ascii"), str(error), record.id, record.url))
                continue
            if not self._tracking:
                self._track()
            loaded += 1
            wait = record.not_before - now
            if wait <= 0:
                self._crawl(record.id, request)
            else:
                self._pending[record.id] = call_later(wait, functools.partial(self._crawl, record.id, request))
        if start + _LOAD_BATCH < len(claimed.records) and not self._closed:
            call_later(0, functools.partial(self._schedule, claimed, start + _LOAD_BATCH, refused, loaded))
            return
        self._loading = False
        if (refused or claimed.bad) and not self._closed:
            self._in_worker(self._set_aside, self._worker_failed, refused)
        if loaded or claimed.later:
            self.stats.inc_value("retry_after/unparked", loaded)
            logger.info(
                "Park file %(path)s: %(loaded)d request(s) due within their max delay rescheduled, "
                "%(later)d due later left in the file",
                {"path": self.path, "loaded": loaded, "later": claimed.later},
                extra={"spider": self.crawler.spider},
            )
        if self._closed:
            return
        engine = self._engine()
        if engine is not None and not loaded:
            # The engine may have gone idle while the file was read: let it look again.
            slot = getattr(engine, "_slot", None)
            if getattr(slot, "nextcall", None) is not None:
                slot.nextcall.schedule()  # type: ignore[union-attr]

    def _set_aside(self, refused: list[Bad]) -> None:
        assert self.file is not None
        self.file.set_aside(refused)
        self.file.compact()

    def _set_aside_warning(self, record_id: str | None, url: str | None, why: str) -> None:
        self.stats.inc_value("retry_after/park_file_set_aside")
        logger.warning(
            "Park file %(path)s: record %(id)s for %(url)s set aside in %(torn)s: %(why)s",
            {
                "path": self.path, "id": record_id or "(no id)", "url": _escape(url or "(no URL)"),
                "torn": self.path.name + ".torn", "why": _escape(why),
            },
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

    def _request(self, record: ParkRecord) -> Request:
        """The record's request; ValueError when anything in it is refused."""
        spider = self.crawler.spider
        if record.request is None:
            request = Request(record.url, dont_filter=True)
        else:
            raw = record.request
            cls = raw.get("_class")
            if cls is not None:
                _request_class(cls)  # before request_from_dict imports anything
            for key in ("callback", "errback"):
                if raw.get(key) is not None:
                    _spider_method(spider, raw[key], key)
            try:
                raw = decode_value(raw)
                for key in ("meta", "cb_kwargs"):
                    if isinstance(raw.get(key), dict) and not all(isinstance(k, str) for k in raw[key]):
                        raise TypeError(f"{key} has a key that is not a string")
                if isinstance(raw.get("meta"), dict):
                    raw["meta"] = {k: v for k, v in raw["meta"].items() if k not in _TRANSIENT_META and k != PARK_ID}
                request = request_from_dict(raw, spider=spider)
                # Seen once already (and remembered by a resumed JOBDIR's dupefilter).
                request = request.replace(dont_filter=True)
            except Exception as error:  # noqa: BLE001 - a hostile record must not stop the crawl
                raise ValueError(f"the request cannot be rebuilt ({type(error).__name__}: {error})") from None
            if request.url.split(":", 1)[0].lower() not in ("http", "https"):
                raise ValueError("the rebuilt request is not http or https")
        request.meta[PARK_ID] = record.id
        return request

    def _crawl(self, record_id: str, request: Request) -> None:
        self._pending.pop(record_id, None)
        engine = self._engine()
        if engine is None or self._closed:
            return
        engine.crawl(request)

    def _engine(self) -> Any:
        try:
            return self.crawler.engine
        except (AttributeError, RuntimeError):  # not crawling (yet, or any more)
            return None

    def _spider_idle(self, **kwargs: Any) -> None:
        if self._loading:
            raise DontCloseSpider("the park file is being read")
        if self._pending:
            raise DontCloseSpider(f"{len(self._pending)} parked request(s) wait for their not_before")

    # -- removing and closing -------------------------------------------------------------

    def _flush(self) -> None:
        """Mark handled records done, in the worker: the reactor only swaps a set."""
        if not self._done or self._flushing is not None or self.file is None:
            return
        done, self._done = self._done, set()
        self._flushing = self._in_worker(self._mark_done, functools.partial(self._flushed, done), done)

    def _mark_done(self, done: set[str]) -> None:
        assert self.file is not None
        self.file.done(done)  # unsorted: one long C call would hold the GIL (and the reactor)
        if self.file.tombstones >= _COMPACT_AFTER:
            self.file.compact()

    def _flushed(self, done: set[str], result: Any, error: BaseException | None) -> None:
        self._flushing = None
        if error is not None:
            self._done |= done  # tried again at the next flush, and at close
            self._worker_failed(None, error)

    def _worker_failed(self, result: Any, error: BaseException | None) -> None:
        if error is not None:
            logger.error(
                "Park file %(path)s could not be updated (%(error)s): handled records stay and may be "
                "fetched again by a later run",
                {"path": self.path, "error": error}, extra={"spider": self.crawler.spider},
            )

    def _spider_closed(self, **kwargs: Any) -> Any:
        """Park what is held now (other close handlers run right after, expecting it done);
        the file's last work runs in the worker, and the returned coroutine waits for it
        (Scrapy 2.19 deprecates a Deferred here). When the run touched no file, None: a
        synchronous send_catch_log, which drops a coroutine unawaited, then loses nothing."""
        self._closed = True
        if self._flusher is not None and self._flusher.running:
            self._flusher.stop()
        for timer in self._pending.values():
            timer.cancel()
        self._pending.clear()
        self._park_held()
        if self.file is None or self._worker is None:
            return None
        if self.jobdir:
            # Loaded requests still queued are saved with the job and come back on resume.
            self._done.update(key for key, live in self._live.items() if live > 0 and key not in self._reparked)
        done, self._done = self._done, set()
        untouched = not (done or self._reparked or self._claimed_in_worker or os.path.lexists(self.file.path))
        future = self._worker.submit(self._close_file, done, set(self._reparked))
        self._worker.shutdown(wait=False)
        if untouched:
            # Nothing of this run is in any file: only the handle closes, nothing to wait for
            # (and a synchronous spider_closed send drops no coroutine).
            return None
        return self._closing(future)

    async def _closing(self, future: concurrent.futures.Future[Any]) -> None:
        try:
            await _finished(future, self._to_loop)
        except Exception as error:  # noqa: BLE001 - logged; the crawl closes anyway
            self._worker_failed(None, error)

    def _close_file(self, done: set[str], reparked: set[str]) -> None:
        """Last work of the run: its removals, its claims given back, the log compacted."""
        assert self.file is not None
        release = [key for key in self._claimed_in_worker if key not in done and key not in reparked]
        try:
            if done:
                self.file.done(done)
            if release:
                self.file.release(release)
            self.file.compact(release_own=True)
        finally:
            self.file.close()

    def _park_held(self) -> None:
        """Park what was held when the crawl closed, in one write; where it fails, one ERROR names them."""
        held = []
        for request, slot, wait, why in self.held_at_close():
            held.append((request, slot, "held_at_close", why, int(request.meta.get("retry_after_throttles", 0)), wait))
        if not held:
            return
        try:
            self.park_many(held)
        except OSError as error:
            self.stats.inc_value("retry_after/park_failed", len(held))
            logger.error(
                "Could not park %(count)d request(s) held when the crawl closed (%(error)s); "
                "they are not in %(path)s: %(urls)s",
                {"count": len(held), "error": error, "path": self.path, "urls": [r.url for r, *_ in held]},
                extra={"spider": self.crawler.spider},
            )
            return
        for request, slot, _, why, _, wait in held:
            logger.warning(
                "Parked %(request)s on %(slot)s: the crawl closed while %(why)s; not before %(when)s",
                {"request": request, "slot": slot, "why": why, "when": iso(time.time() + wait)},
                extra={"spider": self.crawler.spider},
            )


async def _finished(future: concurrent.futures.Future[Any], to_loop: Any) -> Any:
    """Wait for a worker's future on whichever loop runs this coroutine (asyncio, or a plain reactor)."""
    try:
        in_asyncio_task = asyncio.current_task() is not None
    except RuntimeError:
        in_asyncio_task = False
    if not in_asyncio_task:
        from twisted.internet.defer import Deferred

        deferred: Deferred[Any] = Deferred()

        def back(future: concurrent.futures.Future[Any]) -> None:
            error = future.exception()
            fire = functools.partial(deferred.errback, error) if error else functools.partial(deferred.callback, future.result())
            to_loop(fire) if to_loop is not None else fire()

        future.add_done_callback(back)
        return await deferred
    return await asyncio.wrap_future(future)


def _request_class(path: str) -> type[Request]:
    """A Request subclass named by a record, found among the modules already imported, never imported."""
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name)
    cls = getattr(module, name, None) if module is not None else None
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        why = "a module this crawl has not imported" if module is None else "no scrapy.Request subclass"
        raise ValueError(f"_class {path!r} names {why}; refused")
    return cls


def _spider_method(spider: Any, name: str, key: str) -> None:
    """A callback must be a method the spider's own classes define (or Spider.parse).

    Scrapy's Spider methods (``_set_crawler``, ``start``, ``close`` ...) are
    no callbacks: a record naming one would call it with a response.
    """
    from scrapy import Spider

    owner = next((cls for cls in type(spider).__mro__ if name in vars(cls)), None)
    method = vars(owner).get(name) if owner is not None else None
    if not inspect.isfunction(method) or (owner in (Spider, object) and name != "parse"):
        raise ValueError(f"{key} {name!r} is not a method of the spider; refused")
