"""The spider middleware that turns a callback's `BanDetected` into a throttle.

Only the spider knows some pages are bans: a login wall, an empty result
that should not be empty, a CAPTCHA form the rules did not catch. It raises
`BanDetected` from its callback; this middleware catches it and hands the
response to the crawl's ban handler (the package's throttle path), which
cools the response's scopes and answers the requests to schedule: the retry,
or nothing when the request was parked or given up.

Without a handler (the package disabled) the exception goes on as any
callback error does, after one warning that says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from .banrules import BanDetected

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

__all__ = ["BanHandler", "BanSpiderMiddleware", "register_ban_handler"]

logger = logging.getLogger(__name__)

BanHandler = Callable[["Response", str, "float | None"], "Iterable[Request]"]
"""(response, reason, retry_after seconds or None) -> the requests to schedule."""

_handlers: WeakKeyDictionary[Any, BanHandler] = WeakKeyDictionary()


def register_ban_handler(crawler: Crawler, handler: BanHandler) -> None:
    """Called once by whoever owns the throttle path of this crawl."""
    _handlers[crawler] = handler


class BanSpiderMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._warned = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_spider_exception(
        self, response: Response, exception: BaseException, spider: Spider | None = None
    ) -> Iterable[Request] | None:
        if not isinstance(exception, BanDetected):
            return None
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("retry_after/ban/spider")
        handler = _handlers.get(self.crawler)
        if handler is None:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "BanDetected raised for %(response)s (%(reason)s) but no throttle path takes it "
                    "(is RetryAfterMiddleware enabled?): it is handled as any callback error",
                    {"response": response, "reason": exception.reason},
                    extra={"spider": self.crawler.spider},
                )
            return None
        return list(handler(response, exception.reason, exception.retry_after))
