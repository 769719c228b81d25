"""What the throttle middleware tells the log, the stats and the signals about a slot.

Kept apart from the middleware, which decides and carries out: this only
reports, one line per event with the slot and what it means for its requests.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetryMiddleware

from . import scrapy_compat
from . import signals as retry_after_signals

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from .extension import RetryAfterExtension
    from .policy import SlotPolicy

__all__ = ["SlotEvents"]

logger = logging.getLogger(__name__)


class SlotEvents:
    def __init__(self, crawler: Crawler, extension: RetryAfterExtension) -> None:
        self.crawler = crawler
        self.extension = extension
        self.config = extension.config
        self.board = extension.board
        assert crawler.stats is not None
        self.stats = crawler.stats

    def check_neighbours(self, **kwargs: Any) -> None:
        """Stop stock RetryMiddleware from retrying our codes a second time."""
        codes = self.config.default.http_codes
        for middleware in scrapy_compat.downloader_middlewares(self.crawler):
            if type(middleware) is ScrapyRetryMiddleware and codes & middleware.retry_http_codes:
                middleware.retry_http_codes -= codes
                logger.info(
                    "Scrapy's RetryMiddleware will not retry %s: RetryAfterMiddleware owns them "
                    "(ADDONS = {'scrapy_retryafter.Addon': 500} installs a RetryMiddleware that knows it)",
                    sorted(codes),
                )
        if self.crawler.settings.getbool("HTTPCACHE_ENABLED"):
            ignored = {int(code) for code in self.crawler.settings.getlist("HTTPCACHE_IGNORE_HTTP_CODES")}
            if not codes <= ignored:
                logger.warning(
                    "HTTPCACHE_ENABLED caches throttling responses %s: add them to "
                    "HTTPCACHE_IGNORE_HTTP_CODES, or use the add-on, which does",
                    sorted(codes - ignored),
                )

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
        held = self.extension.held(slot)
        self.stats.inc_value("retry_after/circuit_opened")
        self.extension.tally.circuit_opened(slot)
        logger.warning(
            "Circuit opened for %(slot)s after %(threshold)d consecutive throttles: holding its "
            "%(held)d request(s) for %(seconds)gs, then one probe",
            {"slot": slot, "threshold": policy.circuit_threshold, "held": held, "seconds": policy.circuit_open_seconds},
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
            {"slot": slot, "held": self.extension.held(slot)},
            extra={"spider": self.crawler.spider},
        )
        self.crawler.signals.send_catch_log(retry_after_signals.circuit_closed, slot=slot)

    def pace_cut(self, slot: str, before: float | None, after: float) -> None:
        """A throttle cut the slot's learned pace: the first time, and any big change, is logged."""
        if before is None:
            self.stats.inc_value("retry_after/paced_slots")
        if before is None or abs(after - before) > 0.2 * before:
            logger.info(
                "Pacing %(slot)s at %(rate).2f requests/s (was %(before)s)",
                {"slot": slot, "rate": after, "before": "unpaced" if before is None else f"{before:.2f}/s"},
                extra={"spider": self.crawler.spider},
            )
