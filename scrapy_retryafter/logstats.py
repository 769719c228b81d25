"""The live view: which slots are held back, and why, while the crawl runs.

Scrapy's LogStats says pages/min for the whole crawl; a throttled crawl that
seems stuck needs the per-host answer ("cooling down 40 s more, 300 requests
waiting"). Every RETRY_AFTER_LOGSTATS_INTERVAL seconds this logs one line per
held slot, and at close one table of every slot that was throttled. Each line
gives what the slot really sent over the last interval apart from what its
pace allows: the two part ways in slow start or under a generous quota.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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

__all__ = ["RetryAfterLogStats", "sent_rates"]

logger = logging.getLogger(__name__)


def sent_rates(
    before: Mapping[str, int], now: Mapping[str, int], seconds: float
) -> dict[str, float]:
    """Answers per second between two counts, for the slots counted both times.

    A slot first counted now has no rate yet: its count covers the whole
    crawl, not the interval.
    """
    if seconds <= 0:
        return {}
    return {slot: max(0, count - before[slot]) / seconds for slot, count in now.items() if slot in before}


class RetryAfterLogStats:
    def __init__(self, crawler: Crawler, interval: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self._task: Any = None
        self._counted: dict[str, int] = {}
        """Answers per held slot at the last view: only the board's slots, so it stays as small as the board."""
        self._counted_at = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = load_config(crawler.settings)
        if not config.enabled:
            raise NotConfigured("RETRY_AFTER_ENABLED is False")
        logstats = cls(crawler, config.logstats_interval)
        crawler.signals.connect(logstats._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(logstats._spider_closed, signal=signals.spider_closed)
        return logstats

    @classmethod
    def running_in(cls, crawler: Crawler) -> RetryAfterLogStats:
        """The crawl's instance: the one in EXTENSIONS (the add-on's), else one made here, so that the
        middleware alone has the live view and the closing table too."""
        extensions = getattr(crawler, "extensions", None)
        for component in getattr(extensions, "middlewares", ()):
            if isinstance(component, cls):
                return component
        made: RetryAfterLogStats | None = getattr(crawler, "_retry_after_logstats", None)
        if made is None:
            made = cls.from_crawler(crawler)
            crawler._retry_after_logstats = made  # type: ignore[attr-defined]
        return made

    @property
    def extension(self) -> RetryAfterExtension:
        return RetryAfterExtension.of(self.crawler)

    def _parked(self) -> dict[str, int]:
        return dict(self.extension.parked_by_slot)

    def views(self) -> list[SlotView]:
        """Every slot the board remembers, as it stands now, with what it sent since the last view."""
        extension = self.extension
        board = extension.board
        parked = self._parked()
        now = board.clock()
        slots = list(board)
        counts = {slot: extension.tally.responses.get(slot, 0) for slot in slots}
        over = now - self._counted_at
        sent = sent_rates(self._counted, counts, over)
        self._counted, self._counted_at = counts, now
        return [
            SlotView(
                slot=slot,
                cooling=board.remaining(slot),
                circuit=board.breaker_state(slot),
                rate=board.rate(slot),
                held=extension.held(slot),
                parked=parked.get(slot, 0),
                sent=sent.get(slot),
                over=over,
                refused_until=extension.refusals.until(slot),
            )
            for slot in slots
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
        refused = {slot: until for slot in slots if (until := self.extension.refusals.until(slot)) is not None}
        return summary_table(summary_rows(tally, slots, rates, parked, refused))

    def _spider_opened(self, **kwargs: Any) -> None:
        self._counted_at = self.extension.board.clock()
        if self.interval > 0:
            self._task = looping_call(self.log_views)
            self._task.start(self.interval, now=False)

    def _spider_closed(self, **kwargs: Any) -> None:
        if self._task is not None and self._task.running:
            self._task.stop()
        table = self.summary()
        if table is not None:
            logger.info("Rate-limited slots, this run:\n%s", table, extra={"spider": self.crawler.spider})
