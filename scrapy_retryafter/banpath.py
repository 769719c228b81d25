"""A ban page (RETRY_AFTER_BAN_RULES, or BanDetected from a callback) takes the throttle path.

Its page never reaches the callback as a success: the slot cools as for a
429 (the server's Retry-After, or backoff) and the request is retried, or
given up through the one give-up path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from scrapy.exceptions import IgnoreRequest

from .banrules import load_ban_rules
from .failures import PREVIOUS_WAIT
from .holding import THROTTLES

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from .board import CooldownBoard
    from .extension import RetryAfterExtension
    from .policy import Decision

__all__ = ["BanPath"]

logger = logging.getLogger(__name__)


class ThrottlePath(Protocol):
    """What the ban path needs of the throttle middleware (middleware.py)."""

    stats: Any
    extension: RetryAfterExtension
    board: CooldownBoard

    def throttle(
        self, request: Request, response: Response, ban: str | None = None, ban_wait: float | None = None
    ) -> Decision | None: ...

    def forget_decision(self, request: Request) -> None: ...

    def deadline_passed(self, request: Request, slot: str) -> str | None: ...

    def give_up(
        self, request: Request, slot: str, status: int | None, reason: str, outcome: str, wait: float
    ) -> Request | None: ...


class BanPath:
    """The throttle middleware's handling of responses that its ban rules (or the spider) flag."""

    def __init__(self, crawler: Crawler, middleware: ThrottlePath) -> None:
        self.crawler = crawler
        self.middleware = middleware
        self.rules = load_ban_rules(crawler.settings.get)  # validated by load_config already

    def of(self, response: Response) -> str | None:
        """The name of the RETRY_AFTER_BAN_RULES rule the (decompressed) response matches."""
        rules = self.rules
        if not rules.rules or (rules.statuses is not None and response.status not in rules.statuses):
            return None
        return rules.match(response.status, response.headers, response.body if rules.reads_body else b"")

    def retry(self, request: Request, response: Response, ban: str, wait: float | None) -> Request:
        """The retry of a banned request, or its give-up (parked, or IgnoreRequest)."""
        middleware = self.middleware
        stats = middleware.stats
        stats.inc_value(f"retry_after/ban/{ban}")
        decision = middleware.throttle(request, response, ban=ban, ban_wait=wait)
        middleware.forget_decision(request)
        assert decision is not None
        slot = middleware.extension.slot_of(request)
        if decision.retry and not request.meta.get("dont_retry", False):
            late = middleware.deadline_passed(request, slot)
            if late is None:
                stats.inc_value("retry_after/retried")
                retry = throttle_retry(request, decision.cooldown, spent=True)
                retry.meta["dont_cache"] = True  # the cache must not serve the ban page back
                return retry
            stats.inc_value("retry_after/deadline")
            reason, outcome = late, "deadline"
        else:
            reason, outcome = decision.reason, decision.outcome
        wait_left = decision.refuse or middleware.board.remaining(slot)
        parked = middleware.give_up(request, slot, response.status, f"ban {ban!r}: {reason}", outcome, wait_left)
        if parked is not None:
            return parked
        raise IgnoreRequest(f"{slot}: ban {ban!r} on {request.url}, given up ({reason})")

    def spider_ban(self, response: Response, reason: str, wait: float | None) -> list[Request]:
        """BanDetected from a callback: the same path as a matched rule."""
        request = response.request
        if request is None:
            return []
        try:
            return [self.retry(request, response, reason, wait)]
        except IgnoreRequest as error:
            logger.info("%s", error, extra={"spider": self.crawler.spider})
            return []


def throttle_retry(request: Request, cooldown: float, *, spent: bool) -> Request:
    """The copy of a throttled request that goes back to the scheduler: one more throttle
    counted (unless ``spent`` is False: the host's outage, not the request's), the last wait
    for decorrelated jitter, past the dupefilter."""
    retry = request.copy()
    retry.meta[THROTTLES] = request.meta.get(THROTTLES, 0) + spent
    retry.meta[PREVIOUS_WAIT] = cooldown  # decorrelated jitter grows from the last wait
    retry.dont_filter = True
    return retry
