"""Where a request ends when it is not retried now, and the wait in the downloader.

Both middlewares give requests up through ``GiveUp``: parked for a later run
where parking is on and the request may be repeated, otherwise passed on to
the spider (the caller returns the response or the failure, as Scrapy would).
Without CooldownAwarePriorityQueue a scheduled request waits in the waiting
room (waitroom.py); one that bypassed the scheduler (robots.txt,
``engine.download``) cannot be handed back and waits in the downloader,
holding a download place: ``DownloaderHold`` is that one wait, and the source
the park file drains when the crawl closes mid-wait.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest

from . import scrapy_compat
from .eventlog import printable
from .parkrecord import iso
from .policy import spider_handles
from .retry_reporting import GIVE_UP_LEVEL_SETTING, give_up_log_level
from .timers import sleep

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from .parking import Parking

__all__ = ["POLL", "THROTTLES", "DownloaderHold", "GiveUp"]

logger = logging.getLogger(__name__)

THROTTLES = "retry_after_throttles"
"""Meta: throttles a request met so far."""
POLL = 0.5
"""Seconds between looks at a held request's slot: a shutdown or an earlier release is seen this soon."""


class GiveUp:
    """The one place a request stops being retried."""

    def __init__(self, crawler: Crawler, parking: Parking | None) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.parking = parking
        self._give_up_level_setting = crawler.settings.get(GIVE_UP_LEVEL_SETTING)
        # Read as HttpErrorMiddleware reads them: the spider's own status handling wins at the end.
        self._allow_all = crawler.settings.getbool("HTTPERROR_ALLOW_ALL")
        self._allowed_codes = crawler.settings.getlist("HTTPERROR_ALLOWED_CODES")

    def __call__(
        self,
        request: Request,
        slot: str,
        status: int | None,
        reason: str,
        outcome: str,
        wait: float,
        *,
        attempts: int | None = None,
        park: bool = True,
    ) -> Request | None:
        """Park ``request`` where it may be; return the parked request for the engine to drop,
        or None when the caller passes the failure on to the spider.

        ``attempts`` is given for failures other than throttles (RETRY_AFTER_ALL_RETRIES).
        Not parked: a request that repeating could apply twice (``not_repeatable``), one
        whose failure is the answer (``park=False``: its retries are exhausted), and one whose
        retries are exhausted on a status the spider asked to handle (it gets the response).
        """
        assert self.stats is not None
        self.stats.inc_value("retry_after/gave_up")
        unit = "throttle(s)" if attempts is None else "attempt(s)"
        if attempts is None:
            attempts = request.meta.get(THROTTLES, 0) + (status is not None)
        parking = self.parking
        parked: Request | None = None
        # Stock's level for a give-up (RETRY_GIVE_UP_LOG_LEVEL, give_up_log_level); a parked request is not one.
        level = give_up_log_level(request.meta, self._give_up_level_setting)
        if parking is not None and park and outcome == "retries_exhausted" and self._spider_handles(request, status):
            fate = f"; passed to the spider, which handles {status} itself"
        elif parking is None or not park or outcome == "not_repeatable":
            fate = "" if parking is None or outcome != "not_repeatable" else "; not parked: repeating it could apply it twice"
        else:
            parked = self.park(request, slot, outcome, reason, attempts, wait)
            if parked is None:
                return None
            fate = f"; parked until {iso(time.time() + wait)} in {parking.path}"
            level = logging.WARNING
        logger.log(
            level,
            "Gave up %(request)s on %(slot)s after %(attempts)d %(unit)s%(status)s: %(reason)s%(fate)s",
            {
                "request": request,
                "slot": printable(slot),
                "attempts": attempts,
                "unit": unit,
                "status": f" (last {status})" if status is not None else "",
                "reason": reason,
                "fate": fate,
            },
            extra={"spider": self.crawler.spider},
        )
        return parked

    def _spider_handles(self, request: Request, status: int | None) -> bool:
        if status is None:
            return False
        spider_codes = getattr(self.crawler.spider, "handle_httpstatus_list", None)
        return spider_handles(status, request.meta, spider_codes, allow_all=self._allow_all, allowed_codes=self._allowed_codes)

    def park(self, request: Request, slot: str, reason: str, detail: str, attempts: int, wait: float) -> Request | None:
        """``Parking.park``, or None when the record cannot be made durable: the request then
        reaches the spider, which is told once, on one ERROR line naming the file."""
        assert self.parking is not None
        try:
            return self.parking.park(request, slot, reason, detail, attempts, wait)
        except OSError as error:
            assert self.stats is not None
            self.stats.inc_value("retry_after/park_failed")
            logger.error(
                "Could not park %(request)s on %(slot)s in %(path)s (%(error)s): passed on to the spider (%(reason)s)",
                {"request": request, "slot": printable(slot), "path": self.parking.path, "error": error, "reason": detail},
                extra={"spider": self.crawler.spider},
            )
            return None

    def at_close(self, request: Request, slot: str, detail: str, attempts: int, wait: float) -> Request:
        """A request still waiting in the downloader when the crawl closes: parked, or failed."""
        if self.parking is not None:
            parked = self.park(request, slot, "held_at_close", detail, attempts, wait)
            if parked is not None:
                return parked
        raise IgnoreRequest(f"crawl stopping while {request} on {slot} was held: {detail}")


class DownloaderHold:
    """Requests waiting in the downloader for their slot or their backoff (no CooldownAwarePriorityQueue)."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._held: weakref.WeakKeyDictionary[Request, str] = weakref.WeakKeyDictionary()

    def __contains__(self, request: Request) -> bool:
        return request in self._held

    def take(self) -> list[tuple[Request, str]]:
        """Hand over every request still waiting (the crawl closes): each is handed over once."""
        taken = []
        for request, slot in list(self._held.items()):
            if self._held.pop(request, None) is not None:
                taken.append((request, slot))
        return taken

    async def wait(self, request: Request, slot: str, left: Callable[[], float]) -> bool:
        """Wait until ``left()`` (seconds) is spent: True. False when the crawl stops or its spider
        closes first (CLOSESPIDER_*, engine close, Ctrl-C: the caller parks or fails the request);
        IgnoreRequest when the closing crawl already took it."""
        self._held[request] = slot
        try:
            while True:
                if scrapy_compat.is_closing(self.crawler):
                    if self._held.pop(request, None) is None:
                        raise IgnoreRequest(f"crawl stopping while {request} was held on {slot}")
                    return False
                seconds = left()
                if seconds <= 0:
                    return True
                await sleep(min(seconds, POLL))
        finally:
            self._held.pop(request, None)
