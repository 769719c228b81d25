"""The downloader middleware: a throttling response cools its whole slot.

It sits at 560, before Scrapy's RetryMiddleware (550) sees the response. It
reads Retry-After, asks the policy, writes the cooldown on the board and
returns a copy of the request to the scheduler, where the queue holds it
until the slot reopens.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
import weakref
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from . import scrapy_compat
from .banflag import register_ban_handler
from .banpath import BanPath, throttle_retry
from .extension import RetryAfterExtension, SlotCoolingDown
from .failures import PREVIOUS_WAIT, past_deadline, sent_at, stamp_first_attempt
from .headers import parse_retry_after
from .holding import THROTTLES
from .hostpause import OUTAGE_STATUSES, OWN_PRIORITY, PROBE, SENT
from .logstats import RetryAfterLogStats
from .pausing import Pausing, rank_for_probe
from .policy import Decision, decide
from .quotawatch import QuotaWatch, announced_wait
from .ratelimit import speaks_ratelimit
from .retry_reporting import add_seconds, count_retry
from .slot_events import SlotEvents
from .slotfloors import SlotFloors
from .waitroom import WaitingRoom

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from .policy import SlotPolicy

__all__ = ["RetryAfterMiddleware"]

logger = logging.getLogger(__name__)

MAX_RETRIES = "retry_after_max_retries"


class RetryAfterMiddleware:
    def __init__(self, crawler: Crawler, extension: RetryAfterExtension) -> None:
        self.crawler = crawler
        self.extension = extension
        self.config = extension.config
        self.board = extension.board
        self.stats = crawler.stats
        self.rng = random.Random()
        self._all_codes = self.config.all_codes
        self._slot_policies, self._default_policy = self.config.slots, self.config.default  # policy_for, without a call
        self._scope_bases, self._scoped = self.config.scope_bases, extension.scopes.active  # slot_of scopes: per request
        self.give_up = extension.give_up
        self.events = SlotEvents(crawler, extension)
        self._watch_responses = any(
            p.adaptive or p.ratelimit_headers for p in (self.config.default, *self.config.slots.values())
        )
        # Keyed by request: a middleware between us and the downloader may replace the response.
        self._decided: weakref.WeakKeyDictionary[Request, Decision] = weakref.WeakKeyDictionary()
        self._deadlines = any(
            not math.isinf(p.deadline) for p in (self.config.default, *self.config.slots.values())
        )
        self.bans = BanPath(crawler, self)
        self.floors: SlotFloors | None = None
        self.quotas = QuotaWatch(crawler, extension, self.events, self._on_the_wire)
        self._pausing = Pausing(crawler, extension, self.rng)
        self._free: weakref.WeakSet[Request] = weakref.WeakSet()
        """Throttled while their host was paused: the retry spends none of their throttles."""
        self._spent_probes: weakref.WeakSet[Request] = weakref.WeakSet()
        """Probes throttled on their last throttle, held once: they wait at their own priority."""
        self.room = WaitingRoom(crawler, extension)  # without the add-on's queue

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        extension = RetryAfterExtension.of(crawler)
        if not extension.config.enabled:
            raise NotConfigured("RETRY_AFTER_ENABLED is False")
        middleware = cls(crawler, extension)
        extension.throttles_installed = True
        extension.board.pauses.tracks_departures = True
        middleware.floors = SlotFloors.running_in(crawler)
        register_ban_handler(crawler, middleware.bans.spider_ban)
        crawler.signals.connect(middleware.events.check_neighbours, signal=signals.spider_opened)
        crawler.signals.connect(middleware.events.check_all_retries, signal=signals.spider_opened)
        crawler.signals.connect(middleware._response_downloaded, signal=signals.response_downloaded)
        RetryAfterLogStats.running_in(crawler)  # the live view and closing table without the add-on too
        return middleware

    def process_request(
        self, request: Request, spider: Spider | None = None
    ) -> Coroutine[Any, Any, Request | None] | Request | None:
        stamp_first_attempt(request.meta, time.time, self._deadlines)
        if self.board.holds_none() and not self._scoped and "throttling_scopes" not in request.meta:  # no scope to write
            return None
        slot = self.extension.slot_of(request)
        if slot not in self.board:
            return None
        if self.board.refused(slot):
            return self.extension.refusals.arriving(request, slot, self.give_up)
        if self.extension.queue_holds_slots:
            if self.board.remaining(slot):
                # Left the scheduler before the throttle, reached us after it.
                self.extension.probe_withdrawn(slot, request)
                raise SlotCoolingDown(slot)
            way = "go"
        else:
            way = self.room.admit(request, slot)
        if way == "hold":  # it bypassed the scheduler (robots.txt, engine.download)
            return self.room.hold_in_place(slot, request, self.give_up)
        if way == "go":
            request.meta[SENT] = self.board.clock()  # a pause tells its probe by this
            self.board.pauses.left(slot, request.meta.get(PROBE))
            return None
        return self.room.bounced(request)

    def _response_downloaded(self, response: Response, request: Request, **kwargs: Any) -> None:
        # Fired before the downloader frees the transfer place and sends the
        # next queued request: cooling here keeps that request off the wire.
        if response.status in self._all_codes:
            if self.throttle(request, response) is None:
                self.extension.tally.responded(self.extension.slot_of(request))
            return
        slot = request.meta.get("download_slot")  # written by the downloader before this signal
        if slot.__class__ is not str:  # unset, or a user's non-string key: slot_of names it as every other path does
            slot = self.extension.slot_of(request)
        self.extension.tally.responded(slot)
        if self.events.lines.kept:  # a burst is open somewhere: this answer may close it
            self.events.answered(slot, sent_at(request.meta, self.board.clock()))
        if response.status not in OUTAGE_STATUSES:
            self._pausing.answered(slot)
        policy = self._slot_policies.get(slot) or (self.config.policy_for(slot) if self._scope_bases else self._default_policy)
        board = self.board
        if slot in board and board.success(slot, policy.budget_token_ratio, policy.budget_max_tokens):
            self.events.circuit_closed(slot)
        if not self._watch_responses:
            return
        if policy.adaptive:
            before = board.rate(slot)
            if board.succeeded(slot, None if before is None else functools.partial(self.extension.left_at_most, slot)):
                self.extension.sooner(slot)
            if before is not None:  # without a pace before, no rise to tell of
                after = board.rate(slot)
                if after is not None and after > before:
                    self.events.pace_rose(slot, after)
        if policy.ratelimit_headers and speaks_ratelimit(response.headers):
            self.quotas.read(slot, policy, response, request)

    def throttle(
        self, request: Request, response: Response, ban: str | None = None, ban_wait: float | None = None
    ) -> Decision | None:
        """Cool the slot for a throttling response (or a ban, of any status); remember what to do with it."""
        slot = self.extension.slot_of(request)
        policy = self.config.policy_for(slot)
        if ban is None and response.status not in policy.http_codes:
            return None
        header = response.headers.getlist(b"Retry-After")
        retry_after = parse_retry_after(header, date=response.headers.get(b"Date"))
        if retry_after is None and ban_wait is not None:
            retry_after = ban_wait
        if header and retry_after is None:
            self.stats.inc_value("retry_after/header_invalid")
        if retry_after is None and policy.ratelimit_headers:
            retry_after = announced_wait(response)
        throttles = request.meta.get(THROTTLES, 0) + 1
        blind = retry_after is None or retry_after <= 0
        if not blind:
            self._pausing.answered(slot)
        elif slot in self.board.pauses:
            exhausted = throttles > _throttle_limit(request, policy)
            free, spent = self._pausing.paused_failure(request, slot, policy, str(response.status), exhausted)
            if spent:
                self._spent_probes.add(request)
            if free:
                self._free.add(request)
                self.stats.inc_value("retry_after/paused_retries")
                throttles -= 1
        elif self._pausing.failed(request, slot, policy, str(response.status)).started:
            pass  # blind failures of one kind in a row: the host is down, paused like a gateway outage
        elif not self.board.spend_blind_retry(slot, policy.budget_max_tokens):
            # Budget spent: the host is held and probed until it answers, not its requests parked.
            self.stats.inc_value("retry_after/budget_spent")
            why = f"{response.status} without Retry-After and the retry budget spent"
            self._pausing.pause(request, slot, policy, str(response.status), why)
        decision = decide(
            policy,
            status=429 if ban is not None else response.status,  # a ban is a "too many requests"
            method=request.method,
            has_idempotency_key=b"Idempotency-Key" in request.headers,
            throttles=max(1, throttles),
            retry_after=retry_after,
            max_retries=request.meta.get(MAX_RETRIES),
            rng=self.rng,
            previous_wait=_number_or_none(request.meta.get(PREVIOUS_WAIT)),
        )
        sent = sent_at(request.meta, self.board.clock())
        event = self.board.throttle(
            slot,
            sent,
            decision.cooldown,
            learn=policy.adaptive and not decision.refuse,  # a refusal teaches no pace: nothing is sent
            wake_jitter=policy.wake_jitter,
            circuit_threshold=policy.circuit_threshold,
            circuit_open_seconds=policy.circuit_open_seconds,
            refuse=decision.refuse,
        )
        if decision.refuse:
            self.extension.refusals.refuse(slot, decision.refuse, "over_cap")
        added = event.added
        self.stats.inc_value("retry_after/throttled")
        self.stats.inc_value(f"retry_after/throttled/{response.status}")
        if added:
            add_seconds(self.stats, "retry_after/cooldown_seconds", added)
        self.extension.tally.throttled(slot, response.status, added)
        self.extension.send_back(slot)
        retrying = decision.retry and not request.meta.get("dont_retry", False)
        self.events.throttled(
            slot,
            sent,
            {
                "status": response.status,
                "request": request,
                "attempt": throttles,
                "header": b", ".join(header).decode("latin-1")[:120] if header else None,
                "wait": self.board.remaining(slot),
                "reason": decision.reason if ban is None else f"ban {ban!r}: {decision.reason}",
                "outcome": "" if retrying else ", not retried",
            },
            self._on_the_wire(slot),
        )
        if event.rate_after is not None:  # after the throttle line: a cut follows what caused it
            self.events.pace_cut(slot, event.rate_before, event.rate_after)
        if event.opened:
            self.events.circuit_opened(slot, policy)
        self._decided[request] = decision
        return decision

    def _on_the_wire(self, slot: str) -> int:
        """Requests of ``slot`` sent besides this one: they spend the quota left too."""
        return max(0, scrapy_compat.transferring(self.crawler, slot) - 1)

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if response.status not in self._all_codes:
            ban = self.bans.of(response)
            return response if ban is None else self.bans.retry(request, response, ban, None)
        decision = self._decided.pop(request, None) or self.throttle(request, response)
        if decision is None:
            return response
        if not decision.retry or request.meta.get("dont_retry", False):
            if not request.meta.get("dont_retry", False):
                slot = self.extension.slot_of(request)
                if decision.outcome == "over_cap" and (back := self.extension.refusals.rejoin(request, slot)):
                    return back
                wait = decision.refuse or self.board.remaining(slot)
                parked = self.give_up(request, slot, response.status, decision.reason, decision.outcome, wait)
                if parked is not None:
                    return parked
            return response
        slot = self.extension.slot_of(request)
        late = self.deadline_passed(request, slot)
        if late is not None:
            self.stats.inc_value("retry_after/deadline")
            parked = self.give_up(request, slot, response.status, late, "deadline", self.board.remaining(slot))
            return response if parked is None else parked
        self.stats.inc_value("retry_after/retried")
        count_retry(self.stats, response.status)  # Scrapy's retry/count and retry/reason_count/<status>
        retry = throttle_retry(request, decision.cooldown, spent=request not in self._free)
        paused = slot in self.board.pauses
        if paused or OWN_PRIORITY in request.meta:
            # Blind failures of a paused host: its probe must be a request that failed before.
            rank_for_probe(request, retry, paused, request in self._spent_probes)
        return retry

    def forget_decision(self, request: Request) -> None:
        """The decision made for ``request`` at download time is used up (the ban path)."""
        self._decided.pop(request, None)

    def deadline_passed(self, request: Request, slot: str) -> str | None:
        """A throttled request whose slot reopens past its deadline gives up now."""
        policy = self.config.policy_for(slot)
        return past_deadline(request.meta, policy.deadline, time.time(), self.board.remaining(slot))

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | None:
        if isinstance(exception, SlotCoolingDown):
            back = request.copy()
            back.dont_filter = True
            return back
        return None

def _number_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _throttle_limit(request: Request, policy: SlotPolicy) -> int:
    limit = request.meta.get(MAX_RETRIES)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else policy.max_retries
