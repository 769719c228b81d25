"""Keep each download slot's gap at or above its floor: robots.txt Crawl-delay, and any floor added.

Scrapy (2.18+) parses robots.txt and sends ``robots_parsed`` with the
parser, yet does not act on ``Crawl-delay``. This extension reads it for the
crawl's user agent and, each time a request reaches the downloader, lifts
its slot's delay so that no jitter draws a gap below the floor (`floors.py`).
Setting the slot each time also undoes AutoThrottle lowering it, and covers
a slot Scrapy dropped when idle and made again.

Other parts add floors with `add_floor_source` (for example the pace the
board keeps for a slot, so the wire never sees it beaten either).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import signals

from .floors import (
    CrawlDelaySettings,
    crawl_delay_floor,
    floored_delay,
    load_crawl_delay_settings,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = ["SlotFloors"]

logger = logging.getLogger(__name__)

FloorSource = Callable[[str], float]
"""Slot key -> a floor in seconds (0 for none)."""

CRAWL_DELAY_MARGIN = 0.02
"""Seconds added to a Crawl-delay. The downloader times a gap from when it hands a
request over; a request that first opens a connection reaches the server later by the
connection's set-up, so the server would see the next gap that much shorter. On
loopback under load that was up to 11 ms; 20 ms costs 4 % of the rate at Crawl-delay 0.5."""


class SlotFloors:
    def __init__(self, crawler: Crawler, settings: CrawlDelaySettings, read_robots: bool) -> None:
        self.crawler = crawler
        self.settings = settings
        self.crawl_delays: dict[str, float] = {}
        """netloc -> its robots.txt Crawl-delay (capped), one per host the crawl asked robots.txt of."""
        self._sources: list[FloorSource] = []
        self._watching = False
        if read_robots:
            crawler.signals.connect(self._robots_parsed, signal=signals.robots_parsed)
            self._watch()
        agent = crawler.settings.get("ROBOTSTXT_USER_AGENT")
        self._robots_agent: str | None = agent or None
        self._default_agent: str = crawler.settings.get("USER_AGENT") or "Scrapy"

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = load_crawl_delay_settings(crawler.settings.get)
        read_robots = settings.obey and crawler.settings.getbool("ROBOTSTXT_OBEY")
        if read_robots and not hasattr(signals, "robots_parsed"):
            import scrapy

            logger.info(
                "robots.txt Crawl-delay is not read: Scrapy %s has no robots_parsed signal (Scrapy 2.18 and later)",
                scrapy.__version__,
            )
            read_robots = False
        return cls(crawler, settings, read_robots)

    @classmethod
    def running_in(cls, crawler: Crawler) -> SlotFloors:
        """The crawl's instance: the one in EXTENSIONS, else one made here.

        With the middleware alone in DOWNLOADER_MIDDLEWARES (no add-on, no
        EXTENSIONS entry), Crawl-delay must still hold; extensions are built
        before downloader middlewares, so the lookup sees an enabled one.
        """
        extensions = getattr(crawler, "extensions", None)
        for component in getattr(extensions, "middlewares", ()):
            if isinstance(component, cls):
                return component
        made = getattr(crawler, "_retry_after_slot_floors", None)
        if made is None:
            made = cls.from_crawler(crawler)
            crawler._retry_after_slot_floors = made  # type: ignore[attr-defined]
        return made

    def add_floor_source(self, source: FloorSource) -> None:
        self._sources.append(source)
        self._watch()

    def _watch(self) -> None:
        """Look at requests only when there can be a floor: a crawl without one pays nothing per request."""
        if not self._watching:
            self._watching = True
            self.crawler.signals.connect(self._request_reached_downloader, signal=signals.request_reached_downloader)

    def floor_for(self, slot: str, netloc: str) -> float:
        crawl_delay = 0.0 if slot in self.settings.ignore else self.crawl_delays.get(netloc, 0.0)
        floor = crawl_delay + CRAWL_DELAY_MARGIN if crawl_delay > 0 else 0.0
        for source in self._sources:
            floor = max(floor, source(slot))
        return floor

    def _robots_parsed(self, robotparser: Any, request: Request, **kwargs: Any) -> None:
        agent: str | bytes = (
            self._robots_agent or request.headers.get(b"User-Agent") or self._default_agent
        )
        try:
            raw = robotparser.crawl_delay(agent)
        except Exception as error:  # noqa: BLE001  a custom ROBOTSTXT_PARSER may not have it, or fail
            logger.warning("Could not read robots.txt Crawl-delay for %s: %r", request.url, error)
            return
        floor, capped = crawl_delay_floor(raw, self.settings.max_delay)
        if floor is None:
            return
        netloc = _netloc(request.url)
        self.crawl_delays[netloc] = floor
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("retry_after/crawl_delay/hosts")
            if capped:
                stats.inc_value("retry_after/crawl_delay/capped")
        logger.info(
            "robots.txt of %(host)s asks Crawl-delay %(raw)s: no two of its requests closer than %(floor).2fs%(capped)s",
            {"host": netloc, "raw": raw, "floor": floor,
             "capped": f" (capped by {'RETRY_AFTER_ROBOTSTXT_MAX_DELAY'})" if capped else ""},
            extra={"spider": self.crawler.spider},
        )

    def _request_reached_downloader(self, request: Request, **kwargs: Any) -> None:
        engine = self.crawler.engine
        if engine is None:
            return
        key = request.meta.get("download_slot")
        slot = engine.downloader.slots.get(key) if key is not None else None
        if slot is None:
            return
        floor = self.floor_for(str(key), _netloc(request.url))
        if floor <= 0:
            return
        jitter = getattr(slot, "jitter", None)
        if jitter is None:  # Scrapy before 2.19: randomize_delay means ±50 %
            old = 0.5 if slot.randomize_delay else 0.0
            delay, spread = floored_delay(slot.delay, old, floor)
            if spread != old:
                slot.randomize_delay, delay = False, max(delay, floor)
            slot.delay = delay
            return
        slot.delay, slot.jitter = floored_delay(slot.delay, jitter, floor)


def _netloc(url: str) -> str:
    try:
        return urlsplit(url).netloc.lower()
    except ValueError:
        return ""
