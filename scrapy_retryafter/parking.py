"""The Scrapy side of the park file: postpone a request instead of failing it.

A parked request is written to the park file and handed back to the engine
marked as parked; the tracker's ``request_scheduled`` handler drops it there.
That way the spider's errback is not called (the request is postponed, not
failed), which raising IgnoreRequest from a middleware would do. When the
record cannot be made durable, ``park`` raises ParkFileError (an OSError) and
the request is not marked: the give-up path hands it to the spider instead.

The file is opened at ``spider_opened`` under the spider's own name and
nothing is created until something is parked. The next run *claims* the
records that are due (``parkload``), so processes sharing the file never take
the same one, and marks a record done once its request has been handled
(``parktrack``). Until then the record stays claimed, and a claim of a process
that died goes back to the pool: a crash costs a repeat, never a loss.
Everything but ``park`` itself (claims, removals, compaction) runs in the
park worker (``parkworker``), off the reactor; compaction runs in a child
process, so it does not even share the interpreter lock with the crawl.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import hashlib
import logging
import os
import stat
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.conf import closest_scrapy_cfg
from scrapy.utils.project import data_path

from . import parklock
from .eventlog import printable
from .parkfile import ParkFile, ParkFileError
from .parkfold import MAX_LINE
from .parkload import ParkLoader, update_failed
from .parkrebuild import PARK_ID, serialize
from .parkrecord import ParkRecord, iso
from .parktrack import ParkTracker
from .parkworker import ParkWorker
from .settings import RetryAfterSettingError
from .timers import looping_call

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from .settings import Config

__all__ = ["PARK_ID", "Parking", "park_file_path", "record_key"]

logger = logging.getLogger(__name__)

_FLUSH_INTERVAL = 5.0
_COMPACT_AFTER = 10_000
"""Records marked done by this run since its last compaction that start one."""


def park_file_path(configured: str | None, jobdir: str | None, spider_name: str) -> Path:
    if configured:
        return Path(configured)
    if jobdir:
        return Path(jobdir, "retry_after.parked.jsonl")
    return Path(data_path(f"retry_after/{spider_name}.parked.jsonl", createdir=False))


def project_owner(park_file: Path, configured: bool) -> int | None:
    """As root, the uid owning the project root (the directory holding scrapy.cfg), else None.

    A container's root over a bind-mounted project: that user can already
    change the code root runs, so refusing their directories protects nothing.
    The project is found as Scrapy finds it (from the working directory), or
    from the park file's directory when RETRY_AFTER_PARK_FILE names it. A
    scrapy.cfg that is a symlink, or owned by someone else than its directory,
    gives no trust.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    found = closest_scrapy_cfg()
    if not found and configured:
        found = closest_scrapy_cfg(os.path.dirname(os.path.abspath(park_file)))
    if not found:
        return None
    try:
        root, cfg = os.lstat(os.path.dirname(found)), os.lstat(found)
    except OSError:
        return None
    if not stat.S_ISDIR(root.st_mode) or not stat.S_ISREG(cfg.st_mode) or cfg.st_uid != root.st_uid:
        return None
    return root.st_uid or None


def _park_file(path: Path, config: Config) -> ParkFile:
    return ParkFile(path, trusted_uid=project_owner(path, bool(config.park_file)))


def record_key(crawler: Crawler, request: Request, spider_name: str) -> str:
    """One record per request however often it is parked: the fold keeps the last line of an id.

    The request fingerprint and the callback name: the same URL for two
    callbacks is two requests; the same one parked by two runs is one.
    """
    fingerprinter = getattr(crawler, "request_fingerprinter", None)
    if fingerprinter is None:
        return uuid.uuid4().hex
    callback = request.callback
    name = getattr(callback, "__name__", "") if callback is not None else "parse"
    digest = hashlib.sha256(fingerprinter.fingerprint(request))
    digest.update(b"\0" + name.encode("utf-8", "replace") + b"\0" + spider_name.encode("utf-8", "replace"))
    return "r" + digest.hexdigest()[:40]


def _name_refused(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return "the spider has no name, and parked requests are kept per spider name"
    if name in (".", "..") or "\0" in name or "/" in name or (os.altsep and os.altsep in name) or os.sep in name:
        return f"the spider name {name!r} cannot be part of a file name"
    return None


class Parking:
    """One crawl's park file: parking, opening with the spider, flushing removals, closing."""

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
            probe = ParkFile(config.park_file, trusted_uid=project_owner(Path(config.park_file), True))
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
        self.tracker = ParkTracker(crawler)
        self.loader: ParkLoader | None = None
        self._worker: ParkWorker | None = None
        self._flusher: Any = None
        self._flushing: concurrent.futures.Future[Any] | None = None
        self._closed = False
        self._disk_full_told = [False]
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    @property
    def usable(self) -> bool:
        return self.file is not None and self._refused is None

    @property
    def path(self) -> Path:
        if self.file is not None:
            return self.file.path
        return park_file_path(self.config.park_file, self.jobdir, self.spider_name or "<spider>")

    # -- parking ------------------------------------------------------------------------

    def park(self, request: Request, slot: str, reason: str, detail: str, attempts: int, wait: float) -> Request:
        """Write ``request`` to the park file; return it marked for the engine to drop. ParkFileError
        (an OSError) when the record is not durable: the request is then untouched."""
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
            record.id = record_id if isinstance(record_id, str) and record_id else record_key(self.crawler, request, self.spider_name)
            if record.request is not None and len(record.to_line()) > MAX_LINE:
                self._url_only(request, f"its record would be over {MAX_LINE} bytes")
                record.request = None
            records.append(record)
        file.add_many(records)
        for (request, slot, reason, *_), record in zip(items, records):
            self.tracker.parked(request, record.id)
            self.by_slot[slot] += 1
            self.stats.inc_value("retry_after/parked")
            self.stats.inc_value(f"retry_after/parked/{reason}")
        if items:
            self.tracker.drop_parked()
        return [request for request, *_ in items]

    def _writable(self) -> ParkFile:
        if self._refused is not None:
            # Said in full once, at open: not again on every request's ERROR line.
            raise ParkFileError(1, "parking was refused when the spider opened (see that ERROR)")
        if self.file is None:
            raise ParkFileError(1, "the park file opens with the spider; nothing can be parked before")
        return self.file

    def _serialize(self, request: Request) -> dict[str, Any] | None:
        try:
            return serialize(request, self.crawler.spider)
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

    # -- opening --------------------------------------------------------------------------

    def _spider_opened(self, spider: Spider | None = None, **kwargs: Any) -> None:
        spider = spider if spider is not None else self.crawler.spider
        name = getattr(spider, "name", None)
        refused = _name_refused(name)
        if refused is not None:
            self._refuse(f"{refused}; nothing can be parked (give the spider a name)")
            return
        self.spider_name = name  # type: ignore[assignment]  # a str: checked by _name_refused
        self.file = _park_file(park_file_path(self.config.park_file, self.jobdir, self.spider_name), self.config)
        try:
            self.file.check()
        except ParkFileError as error:
            self._refuse(f"{error}; nothing can be parked")
            return
        self._worker = ParkWorker()
        self.loader = ParkLoader(self.crawler, self.config, self.file, self.spider_name, self.tracker, self._worker,
                                 self._disk_full_told)
        # No file, nothing to load: no read in the worker, so no DontCloseSpider
        # (and no extra spider_idle round for the spider's own handlers) while it runs.
        if os.path.lexists(self.file.path):
            self.loader.start()
        self._flusher = looping_call(self._flush)
        self._flusher.start(_FLUSH_INTERVAL, now=False)

    def _refuse(self, why: str) -> None:
        self._refused = why
        logger.error("Park file: %(why)s", {"why": why}, extra={"spider": self.crawler.spider})

    def _spider_idle(self, **kwargs: Any) -> None:
        why = self.loader.keeps_open() if self.loader is not None else None
        if why is not None:
            raise DontCloseSpider(why)

    # -- removing and closing -------------------------------------------------------------

    def _flush(self) -> None:
        """Mark handled records done, in the worker: the reactor only swaps a set."""
        if self.loader is not None:
            self.loader.refill()
        if not self.tracker.done or self._flushing is not None or self._worker is None:
            return
        done = self.tracker.take_done()
        self._flushing = self._worker.run(self._mark_done, functools.partial(self._flushed, done), done)

    def _mark_done(self, done: set[str]) -> OSError | None:
        """The removals, then a compaction if due; a failed compaction is returned (the removals stand)."""
        assert self.file is not None
        self.file.done(done)  # unsorted: one long C call would hold the GIL (and the reactor)
        if self.file.tombstones >= _COMPACT_AFTER:
            try:
                self.file.compact_apart()
            except OSError as error:
                return error
        return None

    def _flushed(self, done: set[str], result: OSError | None, error: BaseException | None) -> None:
        self._flushing = None
        if error is not None:
            self.tracker.done |= done  # tried again at the next flush, and at close
            self._worker_failed(error)
        elif result is not None:
            self._worker_failed(result, compaction=True)

    def _worker_failed(self, error: BaseException, compaction: bool = False) -> None:
        update_failed(self.path, error, self.crawler.spider, self._disk_full_told, compaction)

    def _spider_closed(self, **kwargs: Any) -> Any:
        """Park what is held now (other close handlers run right after, expecting it done);
        the file's last work runs in the worker, and the returned coroutine waits for it
        (Scrapy 2.19 deprecates a Deferred here). When the run touched no file, None: a
        synchronous send_catch_log, which drops a coroutine unawaited, then loses nothing."""
        self._closed = True
        if self._flusher is not None and self._flusher.running:
            self._flusher.stop()
        if self.loader is not None:
            self.loader.close()
        self._park_held()
        if self.file is None or self._worker is None or self.loader is None:
            return None
        if self.jobdir:
            # Loaded requests still queued are saved with the job and come back on resume.
            self.tracker.done.update(self.tracker.still_queued())
        done = self.tracker.take_done()
        reparked = set(self.tracker.reparked)
        untouched = not (done or reparked or self.loader.claimed_in_worker or os.path.lexists(self.file.path))
        future = self._worker.submit(self._close_file, done, reparked)
        self._worker.shutdown()
        if untouched:
            # Nothing of this run is in any file: only the handle closes, nothing to wait for
            # (and a synchronous spider_closed send drops no coroutine).
            return None
        return self._closing(self._worker, future)

    async def _closing(self, worker: ParkWorker, future: concurrent.futures.Future[Any]) -> None:
        try:
            await worker.wait(future)
        except Exception as error:  # noqa: BLE001 - logged; the crawl closes anyway
            self._worker_failed(error)

    def _close_file(self, done: set[str], reparked: set[str]) -> None:
        """Last work of the run: its removals, its claims given back, the log compacted."""
        assert self.file is not None and self.loader is not None
        release = [key for key in self.loader.claimed_in_worker if key not in done and key not in reparked]
        try:
            if done:
                self.file.done(done)
            if release:
                self.file.release(release)
            try:
                self.file.compact(release_own=True)
            except OSError as error:
                self._worker_failed(error, compaction=True)  # the file stands; a later run compacts it
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
                {"request": request, "slot": printable(slot), "why": why, "when": iso(time.time() + wait)},
                extra={"spider": self.crawler.spider},
            )
