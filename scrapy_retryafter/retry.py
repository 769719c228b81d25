"""Scrapy's RetryMiddleware, minus the responses RetryAfterMiddleware owns.

Stock RetryMiddleware lists 429 and 503 in RETRY_HTTP_CODES, so after our
middleware gives a request up it would retry it twice more, at once. The
add-on swaps in this subclass; everything else it does (other codes,
exceptions, RETRY_TIMES, the retry/* stats) is Scrapy's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetryMiddleware

from .extension import RetryAfterExtension

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from typing_extensions import Self

__all__ = ["RetryMiddleware", "owned_by_retry_after"]


def owned_by_retry_after(extension: RetryAfterExtension, request: Request, status: int) -> bool:
    if not extension.config.enabled or status not in extension.codes:
        return False
    slot = extension.crawler.engine.downloader.get_slot_key(request)  # type: ignore[union-attr]
    return status in extension.config.policy_for(slot).http_codes


class RetryMiddleware(ScrapyRetryMiddleware):
    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        middleware = super().from_crawler(crawler)
        middleware._retry_after = RetryAfterExtension.of(crawler)  # type: ignore[attr-defined]
        return middleware

    def process_response(  # type: ignore[override]
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if owned_by_retry_after(self._retry_after, request, response.status):  # type: ignore[attr-defined]
            return response
        if spider is None:
            return super().process_response(request, response)
        return super().process_response(request, response, spider)
