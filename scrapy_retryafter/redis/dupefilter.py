"""scrapy-redis's RFPDupeFilter, made to outlive a lost Redis.

scrapy-redis asks Redis (SADD) whether each new request was seen. With
Redis down that call raises inside the engine's scheduling, and the request
is dropped with no more than an asyncio traceback. This one answers
locally instead: a fingerprint this process has not met during the outage
is let through (it may be a page another process already fetched: a
duplicate, never a loss) and is added to Redis's set when it is back.
"""

from __future__ import annotations

import itertools
from typing import Any

from scrapy_redis.dupefilter import RFPDupeFilter

from .link import FrontierLink, FrontierUnreachable

__all__ = ["OutageTolerantDupeFilter"]

_BATCH = 500


class OutageTolerantDupeFilter(RFPDupeFilter):
    """DUPEFILTER_CLASS for scrapy-redis's scheduler (the add-on sets it in place of RFPDupeFilter)."""

    link: FrontierLink | None = None

    def __init__(self, server: Any, key: str, debug: bool = False) -> None:
        super().__init__(server, key, debug)
        self._unchecked: dict[str, None] = {}
        """Fingerprints let through while Redis was unreachable, not yet in its set (in order)."""

    @classmethod
    def from_spider(cls, spider: Any) -> OutageTolerantDupeFilter:
        instance = super().from_spider(spider)
        instance.attach(FrontierLink.of(spider.crawler, instance.server))
        return instance

    @classmethod
    def from_crawler(cls, crawler: Any) -> OutageTolerantDupeFilter:
        instance = super().from_crawler(crawler)
        instance.attach(FrontierLink.of(crawler, instance.server))
        return instance

    def attach(self, link: FrontierLink) -> None:
        """Ask Redis through ``link`` (the crawl's, shared with the queue): one outage for both."""
        self.link = link
        link.flushers.append(self._flush_unchecked)

    def request_seen(self, request: Any) -> bool:
        link = self.link
        if link is None:
            return bool(super().request_seen(request))
        fingerprint = self.request_fingerprint(request)
        try:
            return link.call(lambda: link.client.sadd(self.key, fingerprint)) == 0
        except FrontierUnreachable:
            if fingerprint in self._unchecked:
                return True
            self._unchecked[fingerprint] = None
            link.count("retry_after/redis/dupefilter_unchecked")
            return False

    def _flush_unchecked(self) -> tuple[int, int]:
        assert self.link is not None
        added = 0
        while self._unchecked:
            batch = list(itertools.islice(self._unchecked, _BATCH))
            self.link.client.sadd(self.key, *batch)
            for fingerprint in batch:
                del self._unchecked[fingerprint]
            added += len(batch)
        return 0, added
