"""The live view: which slots are held back, and why, while the crawl runs.

Scrapy's LogStats says pages/min for the whole crawl; a throttled crawl that
seems stuck needs the per-host answer ("cooling down 40 s more, 300 requests
waiting"). Every RETRY_AFTER_LOGSTATS_INTERVAL seconds this logs one line per
held slot, and at close one table of every slot that was throttled.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from .extension import RetryAfterExtension
from .settings import load_config
from .tally import SlotView, live_lines, summary_rows, summary_table
from .timers import looping_call

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from typing_extensions import Self

__all__ = ["RetryAfterLogStats"]

logger = logging.getLogger(__name__)


class RetryAfterLogStats:
    def __init__(self, crawler: Crawler, interval: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self._task: Any = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = load_config(crawler.settings)
        if not config.enabled:
            raise NotConfigured("RETRY_AFTER_ENABLED is False")
        logstats = cls(crawler, config.logstats_interval)
        crawler.signals.connect(logstats._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(logstats._spider_closed, signal=signals.spider_closed)
        return logstats

    @property
    def extension(self) -> RetryAfterExtension:
        return RetryAfterExtension.of(self.crawler)

    def _parked(self) -> dict[str, int]:
        return dict(self.extension.parked_by_slot)

    def views(self) -> list[SlotView]:
        """Every slot the board remembers, as it stands now."""
        extension = self.extension
        board = extension.board
        parked = self._parked()
        return [
            SlotView(
                slot=slot,
                cooling=board.remaining(slot),
                circuit=board.breaker_state(slot),
                rate=board.rate(slot),
                held=extension.held(slot),
                parked=parked.get(slot, 0),
            )
            for slot in board
        ]

    def log_views(self) -> None:
        for line in live_lines(self.views()):
            logger.info("Held back %s", line, extra={"spider": self.crawler.spider})

    def summary(self) -> str | None:
        """The closing table, or None when no slot was ever throttled, cooled or parked."""
        tally = self.extension.tally
        board = self.extension.board
        parked = self._parked()
        paced = [slot for slot in board if board.rate(slot) is not None]
        slots = tally.noteworthy(also=[*paced, *(slot for slot, count in parked.items() if count)])
        if not slots:
            return None
        rates = {slot: board.rate(slot) for slot in slots}
        return summary_table(summary_rows(tally, slots, rates, parked))

    def _spider_opened(self, **kwargs: Any) -> None:
        if self.interval > 0:
            self._task = looping_call(self.log_views)
            self._task.start(self.interval, now=False)

    def _spider_closed(self, **kwargs: Any) -> None:
        if self._task is not None and self._task.running:
            self._task.stop()
        table = self.summary()
        if table is not None:
            logger.info("Rate-limited slots, this run:\n%s", table, extra={"spider": self.crawler.spider})
