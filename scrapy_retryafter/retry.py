"""Scrapy's RetryMiddleware, with every retry made safely (RETRY_AFTER_ALL_RETRIES).

Stock RetryMiddleware lists 429 and 503 in RETRY_HTTP_CODES, so after our
middleware gives a request up it would retry it twice more, at once. The
add-on swaps in this subclass, which leaves those codes to RetryAfterMiddleware.

With RETRY_AFTER_ALL_RETRIES (on with the add-on) it also takes over the
decision for the rest of RETRY_HTTP_CODES and RETRY_EXCEPTIONS: which
failure may be repeated for which method (failures.py), a jittered backoff
waited out in the scheduler, a deadline per request, and a whole-slot pause
when a host refuses connection after connection. Scrapy's own knobs
(RETRY_TIMES, max_retry_times, dont_retry, RETRY_PRIORITY_ADJUST) and its
retry/* stats keep their meaning.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetryMiddleware
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.response import response_status_message

from .eventlog import printable
from .extension import RetryAfterExtension
from .failures import (
    DEADLINE,
    NOT_BEFORE,
    PREVIOUS_WAIT,
    FailureDecision,
    Rule,
    classify_exception,
    classify_status,
    decide_failure,
    past_deadline,
    qualified_names,
    stamp_first_attempt,
)
from .hostpause import OUTAGE_STATUSES, exception_kind
from .pausing import Pausing
from .retry_reporting import add_seconds

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

__all__ = ["RetryMiddleware", "owned_by_retry_after"]

logger = logging.getLogger(__name__)


def owned_by_retry_after(extension: RetryAfterExtension, request: Request, status: int) -> bool:
    if not extension.config.enabled or status not in extension.codes:
        return False
    return status in extension.config.policy_for(extension.slot_of(request)).http_codes


class RetryMiddleware(ScrapyRetryMiddleware):
    _retry_after: RetryAfterExtension

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        middleware = super().from_crawler(crawler)
        middleware.crawler = crawler  # Scrapy 2.13's RetryMiddleware does not keep it
        middleware._retry_after = RetryAfterExtension.of(crawler)
        middleware._retry_after.all_retries_installed = True
        middleware._setup_all_retries(crawler)
        crawler.signals.connect(middleware._check_throttles_handled, signal=signals.spider_opened)
        return middleware

    def _check_throttles_handled(self, **kwargs: Any) -> None:
        """Without RetryAfterMiddleware nobody retries the throttle codes this middleware leaves to it: say so once."""
        extension = self._retry_after
        if extension.throttles_installed or not extension.config.enabled or not self.crawler.settings.getbool("RETRY_ENABLED"):
            return
        left = sorted(code for code in self.retry_http_codes if code in extension.codes)
        if left:
            logger.warning(
                "scrapy_retryafter.RetryMiddleware is installed without scrapy_retryafter.RetryAfterMiddleware: "
                "responses with %(codes)s go unretried (they are left to it); add it to DOWNLOADER_MIDDLEWARES at 560 "
                "or use ADDONS = {'scrapy_retryafter.Addon': 500}",
                {"codes": left},
            )

    # -- RETRY_AFTER_ALL_RETRIES ------------------------------------------------

    def _setup_all_retries(self, crawler: Crawler) -> None:
        extension = self._retry_after
        config = extension.config
        self._all = config.enabled and config.all_retries
        self._board = extension.board
        assert crawler.stats is not None
        self._stats = crawler.stats
        self._rng = random.Random()
        self._wall = time.time
        self._deadlines = any(
            not math.isinf(policy.deadline) for policy in (config.default, *config.slots.values())
        )
        self._give_up = extension.give_up
        self._pausing = Pausing(crawler, extension, self._rng)
        if not self._all:
            return
        never = sorted(code for code in self.retry_http_codes if classify_status(code) is Rule.NEVER)
        if never:
            logger.info(
                "RETRY_HTTP_CODES lists %s, which RETRY_AFTER_ALL_RETRIES never retries: "
                "the same request fails again",
                never,
            )

    def process_request(
        self, request: Request, spider: Spider | None = None
    ) -> Coroutine[Any, Any, Request | None] | Request | None:
        if not self._all:
            return None
        meta = request.meta
        stamp_first_attempt(meta, self._wall, self._deadlines)
        if (NOT_BEFORE in meta or meta.get("retry_times")) and (self._deadlines or DEADLINE in meta):
            late = self._held_past_deadline(request)
            if late is not None:
                return late
        not_before = meta.get(NOT_BEFORE)
        if not_before is None or self._retry_after.queue_holds_slots:
            return None
        if not isinstance(not_before, (int, float)) or not_before <= self._wall():
            return None
        return self._wait_in_downloader(request, float(not_before))

    def _held_past_deadline(self, request: Request) -> Request | None:
        """A retry held past its deadline is not sent: parked, or IgnoreRequest to its errback (None: in time)."""
        slot = self._retry_after.slot_of(request)
        policy = self._retry_after.config.policy_for(slot)
        late = past_deadline(request.meta, policy.deadline, self._wall(), 0.0)
        if late is None:
            return None
        self._stats.inc_value("retry_after/deadline")
        self._retry_after.probe_withdrawn(slot, request)  # released, never sent
        attempts = request.meta.get("retry_times", 0) + 1
        parked = self._give_up(request, slot, None, f"held past its deadline: {late}", "deadline", 0.0, attempts=attempts)
        if parked is not None:
            return parked
        raise IgnoreRequest(f"{request} on {slot} was held past its deadline: {late}")

    async def _wait_in_downloader(self, request: Request, not_before: float) -> Request | None:
        """Without CooldownAwarePriorityQueue a backoff can only be waited out here,
        holding a download place (the README says what that costs); a probe waiting here frees its host."""
        self._retry_after.probe_withdrawn(slot := self._retry_after.slot_of(request), request)
        if await self._retry_after.downloader_hold.wait(request, slot, lambda: not_before - self._wall()):
            return None
        detail = "the crawl closed while its retry waited out its backoff"
        wait = max(0.0, not_before - self._wall())
        return self._give_up.at_close(request, slot, detail, request.meta.get("retry_times", 0), wait)

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if self._all:
            return self._retry_response(request, response, spider)
        if owned_by_retry_after(self._retry_after, request, response.status):
            return response
        if spider is None:
            return super().process_response(request, response)
        return super().process_response(request, response, spider)

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | Response | None:
        if self._all:
            return self._retry_exception(request, exception, spider)
        if spider is None:
            return super().process_exception(request, exception)
        return super().process_exception(request, exception, spider)

    def _retry_response(self, request: Request, response: Response, spider: Spider | None) -> Request | Response:
        status = response.status
        slot = self._retry_after.slot_of(request)
        if self._board.streaks:
            self._board.streaks.reached(slot)
        if status in self._retry_after.codes and owned_by_retry_after(self._retry_after, request, status):
            return response  # a throttle: RetryAfterMiddleware decides whether the host answered
        outage = status in OUTAGE_STATUSES and status in self.retry_http_codes
        if not outage:
            self._pausing.answered(slot)
        if status not in self.retry_http_codes or request.meta.get("dont_retry", False):
            return response
        reason = response_status_message(status)
        kind = str(status) if outage else None
        return self._retry_failure(request, classify_status(status), reason, status, spider, kind) or response

    def _retry_exception(self, request: Request, exception: Exception, spider: Spider | None) -> Request | None:
        if not isinstance(exception, self.exceptions_to_retry) or request.meta.get("dont_retry", False):
            return None
        names = qualified_names(exception)
        rule = classify_exception(names)
        if rule is Rule.ANY_METHOD:
            self._pausing.connection_failed(request, exception)
            return self._retry_failure(request, rule, exception, None, spider)
        return self._retry_failure(request, rule, exception, None, spider, exception_kind(names))

    def _retry_failure(
        self,
        request: Request,
        rule: Rule,
        reason: str | Exception,
        status: int | None,
        spider: Spider | None,
        kind: str | None = None,
    ) -> Request | None:
        """``kind`` names a failure that says the host may be down (hostpause.py): it counts toward
        the host's pause, and a request failing while its host is paused spends no retry."""
        slot = self._retry_after.slot_of(request)
        policy = self._retry_after.config.policy_for(slot)
        meta = request.meta
        attempt = meta.get("retry_times", 0) + 1
        max_retries = meta.get("max_retry_times")
        if max_retries is None:
            max_retries = self.max_retry_times
        paused, spent_probe = self._pausing.outage_failure(request, slot, policy, kind, attempt > max_retries)
        label = reason if isinstance(reason, str) else type(reason).__name__
        previous = meta.get(PREVIOUS_WAIT)
        now = self._wall()
        decision = decide_failure(
            rule,
            method=request.method,
            has_idempotency_key=b"Idempotency-Key" in request.headers,
            server_error_methods=policy.server_error_methods,
            attempt=attempt,
            max_retries=max_retries,
            backoff=policy.backoff,
            previous_wait=previous if isinstance(previous, (int, float)) else None,
            meta=meta,
            deadline=policy.deadline,
            now=now,
            rng=self._rng,
            host_paused=paused,
        )
        if not decision.retry:
            exhausted = paused is None and attempt > max_retries
            return self._not_retried(
                request, slot, status, label, attempt, decision, exhausted, policy.backoff.wait(attempt, rng=self._rng)
            )
        # Scrapy 2.13 passes the spider and may leave crawler.spider unset (a middleware used by hand).
        spider = self.crawler.spider or spider
        assert spider is not None
        retry = get_retry_request(
            request,
            reason=reason,
            spider=spider,
            # A failure while the host is paused spends no retry: no bound to hit, no count to raise.
            max_retry_times=max_retries if paused is None else attempt,
            priority_adjust=meta.get("priority_adjust", self.priority_adjust),
        )
        if retry is None:  # pragma: no cover - the bound was checked above
            return None
        if kind is None:
            retry.meta[NOT_BEFORE] = now + decision.wait
        else:
            self._pausing.queue_retry(request, retry, slot, now, decision.wait, spent_probe)
        if paused is not None:
            retry.meta["retry_times"] = attempt - 1
            self._stats.inc_value("retry_after/paused_retries")
            return retry
        retry.meta[PREVIOUS_WAIT] = decision.wait
        self._stats.inc_value("retry_after/backoff_retried")
        add_seconds(self._stats, "retry_after/backoff_seconds", decision.wait)
        logger.info(
            "Retrying %(request)s on %(slot)s after %(failure)s, attempt %(attempt)d of %(max)d, "
            "waiting %(wait).2fs in the scheduler (%(reason)s)",
            {
                "request": request,
                "slot": printable(slot),
                "failure": label,
                "attempt": attempt,
                "max": max_retries,
                "wait": decision.wait,
                "reason": decision.reason,
            },
            extra={"spider": self.crawler.spider},
        )
        return retry

    def _not_retried(
        self,
        request: Request,
        slot: str,
        status: int | None,
        label: str,
        attempt: int,
        decision: FailureDecision,
        exhausted: bool,
        wait: float,
    ) -> Request | None:
        """Returns the parked request for the engine to drop, or None: the failure reaches the spider."""
        if not decision.gave_up:
            # A permanent refusal (method, 4xx): nothing to park, the answer is final.
            self._stats.inc_value("retry_after/not_retried")
            logger.info(
                "Not retrying %(request)s on %(slot)s after %(failure)s: %(reason)s",
                {"request": request, "slot": printable(slot), "failure": label, "reason": decision.reason},
                extra={"spider": self.crawler.spider},
            )
            return None
        self._stats.inc_value("retry/max_reached" if exhausted else "retry_after/deadline")
        # Retries exhausted: the failure is the answer, and the spider gets the real one.
        # A deadline only says "not now": parked, where parking is on.
        reason = f"{label}: {decision.reason}"
        return self._give_up(request, slot, status, reason, "deadline", wait, attempts=attempt, park=not exhausted)
