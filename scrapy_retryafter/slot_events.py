"""What the throttle middleware tells the log, the stats and the signals about a slot.

Kept apart from the middleware, which decides and carries out: this only
reports, one line per event with the slot and what it means for its requests.
Which responses make one event, and when its line is written, is decided in
:mod:`.eventlog`: a burst of throttles answering the requests already on the
wire is one line with its count; a pace cut follows its throttle line, a
rise is written at most once per slot per minute.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetryMiddleware

from . import scrapy_compat
from . import signals as retry_after_signals
from .eventlog import EventLog, Line, RiseGate, printable
from .timers import call_later

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from .extension import RetryAfterExtension
    from .policy import SlotPolicy

__all__ = ["SlotEvents"]

logger = logging.getLogger(__name__)

THROTTLE_LINE = (
    "Throttled %(slot)s: %(status)d on %(request)s, attempt %(attempt)d, "
    "Retry-After %(header)r, cooling %(wait).2fs (%(reason)s)%(outcome)s; %(count)d response(s) in this burst"
)
QUOTA_LINE = "Quota of %(slot)s used up: cooling %(wait).2fs until its reset (RateLimit headers); %(count)d response(s) said so"


class SlotEvents:
    def __init__(self, crawler: Crawler, extension: RetryAfterExtension) -> None:
        self.crawler = crawler
        self.extension = extension
        self.config = extension.config
        self.board = extension.board
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.lines = EventLog(self.board.clock)
        self.rises = RiseGate(self.board.clock)
        self._timer: Any = None
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    def throttled(self, slot: str, sent_at: float, fields: dict[str, Any], on_the_wire: int) -> None:
        """A throttle response: the first of a burst opens its line, the others add to its count."""
        line: Line = (THROTTLE_LINE, {**fields, "slot": printable(slot)})
        new, due = self.lines.event(slot, sent_at, line, on_the_wire)
        self._write(due)
        if not new:
            logger.debug("Throttled %s again in the same burst: %s", printable(slot), fields.get("request"))
        self._tick_later()

    def quota_used(self, slot: str, sent_at: float, wait: float, on_the_wire: int) -> None:
        """A response said the quota is spent and the slot cools until its reset: one line per burst."""
        self._write(self.lines.event((slot, "quota"), sent_at, (QUOTA_LINE, {"slot": printable(slot), "wait": wait}), on_the_wire)[1])
        self._tick_later()

    def answered(self, slot: str, sent_at: float) -> None:
        """A response that is no throttle: it may close the slot's open burst."""
        self._write(self.lines.answered(slot, sent_at))

    def _write(self, lines: list[Line]) -> None:
        for message, args in lines:
            logger.info(message, args, extra={"spider": self.crawler.spider})

    def _tick_later(self) -> None:
        if self._timer is None:
            self._timer = call_later(self.lines.grace, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._write(self.lines.due())
        if self.lines:
            self._tick_later()

    def _spider_closed(self, **kwargs: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._write(self.lines.due(everything=True))

    def check_neighbours(self, **kwargs: Any) -> None:
        """Stop stock RetryMiddleware from retrying our codes a second time."""
        codes = self.config.default.http_codes
        stock_retries = False
        for middleware in scrapy_compat.downloader_middlewares(self.crawler):
            if type(middleware) is ScrapyRetryMiddleware and codes & middleware.retry_http_codes:
                middleware.retry_http_codes -= codes
                stock_retries = True
        self._say_mode(sorted(codes) if stock_retries else None)
        if self.crawler.settings.getbool("HTTPCACHE_ENABLED"):
            ignored = {int(code) for code in self.crawler.settings.getlist("HTTPCACHE_IGNORE_HTTP_CODES")}
            if not codes <= ignored:
                logger.warning(
                    "HTTPCACHE_ENABLED caches throttling responses %s: add them to "
                    "HTTPCACHE_IGNORE_HTTP_CODES, or use the add-on, which does",
                    sorted(codes - ignored),
                )

    def _say_mode(self, stock_codes: list[int] | None) -> None:
        """One INFO line: what differs from the add-on in this crawl, if anything."""
        alone = not self.extension.queue_holds_slots
        if not alone and stock_codes is None:
            return
        parts = []
        if alone:
            parts.append(
                "a held slot's requests wait in the middleware's waiting room, out of the scheduler "
                "and the downloader (parked at close, also with JOBDIR)"
            )
        if stock_codes is not None:
            parts.append(f"Scrapy's RetryMiddleware will not retry {stock_codes}: RetryAfterMiddleware owns them")
        adds = []
        if alone:
            adds.append("keeps held requests in the scheduler's queue (JOBDIR saves them with the job)")
        if not self.extension.all_retries_installed:
            adds.append("makes every other retry with backoff and the deadline (RETRY_AFTER_ALL_RETRIES)")
        message = "Without the add-on: " + "; ".join(parts)
        if adds:
            message += ". ADDONS = {'scrapy_retryafter.Addon': 500} " + " and ".join(adds)
        logger.info(message, extra={"spider": self.crawler.spider})

    def check_all_retries(self, **kwargs: Any) -> None:
        """RETRY_AFTER_ALL_RETRIES is carried out by our RetryMiddleware: say so if it is missing."""
        if not self.config.all_retries or not self.crawler.settings.getbool("RETRY_ENABLED"):
            return
        if not self.extension.all_retries_installed:
            logger.warning(
                "RETRY_AFTER_ALL_RETRIES is on but scrapy_retryafter.RetryMiddleware is not installed in "
                "place of Scrapy's RetryMiddleware, so Scrapy's own retries stay in effect "
                "(ADDONS = {'scrapy_retryafter.Addon': 500} installs it)"
            )

    def circuit_opened(self, slot: str, policy: SlotPolicy) -> None:
        self._write(self.lines.flush(slot))  # the throttles that opened it come first
        held = self.extension.held(slot)
        self.stats.inc_value("retry_after/circuit_opened")
        self.extension.tally.circuit_opened(slot)
        logger.warning(
            "Circuit opened for %(slot)s after %(threshold)d consecutive throttles: holding its "
            "%(held)d request(s) for %(seconds)gs, then one probe",
            {"slot": printable(slot), "threshold": policy.circuit_threshold, "held": held, "seconds": policy.circuit_open_seconds},
            extra={"spider": self.crawler.spider},
        )
        self.crawler.signals.send_catch_log(
            retry_after_signals.circuit_opened,
            slot=slot,
            until=self.board.clock() + policy.circuit_open_seconds,
            held=held,
        )

    def circuit_closed(self, slot: str) -> None:
        self.stats.inc_value("retry_after/circuit_closed")
        logger.warning(
            "Circuit closed for %(slot)s: a request succeeded, %(held)d request(s) flow again",
            {"slot": printable(slot), "held": self.extension.held(slot)},
            extra={"spider": self.crawler.spider},
        )
        self.crawler.signals.send_catch_log(retry_after_signals.circuit_closed, slot=slot)

    def pace_cut(self, slot: str, before: float | None, after: float) -> None:
        """A throttle cut the slot's learned pace: every cut is logged, after the throttle line."""
        if before is None:
            self.stats.inc_value("retry_after/paced_slots")
        line: Line = (
            "Pacing %(slot)s at %(rate).2f requests/s (was %(before)s)",
            {"slot": printable(slot), "rate": after, "before": "unpaced" if before is None else f"{before:.2f}/s"},
        )
        self.rises.noted(slot)
        self._write(self.lines.follow(slot, line))

    def pace_rose(self, slot: str, rate: float | None) -> None:
        """The pace rose after successes: one line per slot per minute at most."""
        if rate is None or not self.rises.allows(slot):
            return
        logger.info(
            "Pacing %(slot)s at %(rate).2f requests/s (rising; at most one such line per slot per minute)",
            {"slot": printable(slot), "rate": rate},
            extra={"spider": self.crawler.spider},
        )
