"""The waiting room: with the middleware alone, a cooling slot's requests wait outside the downloader.

Without CooldownAwarePriorityQueue the scheduler hands out requests of held
slots; waiting for them in the downloader would hold download places that
other hosts need. Instead a request of a held slot is taken out at
``request_scheduled`` (raising IgnoreRequest there drops it from the
scheduler, before the dupefilter) and kept here; the middleware bounces
back to the engine a scheduled request that reaches it while its slot is
held. When the board lets the slot send, the request goes back through the
engine, marked so that the room lets it pass, with ``dont_filter`` since its
fingerprint was recorded the first time. Requests that never went through
the scheduler (robots.txt, ``engine.download``) carry no mark: the
middleware holds those in place (DownloaderHold).

Nothing is kept per waiting request beyond the request itself. The room keeps
the spider open; at close its requests are handed to parking.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Any, Literal

from scrapy import signals
from scrapy.exceptions import DontCloseSpider, IgnoreRequest

from . import scrapy_compat
from .breaker import OPEN
from .holding import THROTTLES
from .hostpause import PROBE, SENT
from .parkrebuild import PARKED
from .timers import call_later

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from .extension import RetryAfterExtension
    from .holding import GiveUp

__all__ = ["RELEASED", "SCHEDULED", "WaitingRoom"]

logger = logging.getLogger(__name__)

SCHEDULED = "retry_after_scheduled"
"""Meta: the request went through the scheduler, so the middleware may bounce it back."""
RELEASED = "retry_after_released"
"""Meta: the room put the request back with the board's leave; it passes the room and the slot once."""
LOOK = 0.5
"""Seconds at most between looks at the room's slots: a pace rise or a fleet's release is seen this soon."""


class WaitingRoom:
    """Requests of held slots, by slot and priority, out of the scheduler and the downloader."""

    def __init__(self, crawler: Crawler, extension: RetryAfterExtension) -> None:
        self.crawler = crawler
        self.extension = extension
        self.board = extension.board
        self.active = False
        """True in middleware-only mode, from spider_opened on."""
        self._rooms: dict[str, dict[int, collections.deque[Request]]] = {}
        self._count: collections.Counter[str] = collections.Counter()
        self._holding: collections.Counter[str] = collections.Counter()
        """Requests held in place per slot (hold_in_place); a slot leaves it with its last one."""
        self._timer: Any = None
        self._timer_at = float("inf")
        crawler.signals.connect(self.open, signal=signals.spider_opened)

    def open(self, **kwargs: Any) -> None:
        """Start taking requests: the scheduler's queue does not hold slots (set before spider_opened)."""
        if self.active or self.extension.queue_holds_slots:
            return
        self.active = True
        connect = self.crawler.signals.connect
        connect(self._request_scheduled, signal=signals.request_scheduled)
        connect(self._spider_idle, signal=signals.spider_idle)
        connect(self._spider_closed, signal=signals.spider_closed)
        self.extension.held_requests.append(self.take)
        self.extension.held_counters.append(self.waiting)

    def __len__(self) -> int:
        return sum(self._count.values())

    def waiting(self, slot: str) -> int:
        return self._count.get(slot, 0)

    def held(self, slot: str) -> bool:
        """The slot may not send now (cooling, circuit open, host paused, paced, waking)."""
        if slot not in self.board or self.board.refused(slot):
            return False  # a refusing slot's requests are given up by the middleware
        return self.board.ready_at(slot, self.waiting(slot) + 1) > self.board.clock()

    def admit(self, request: Request, slot: str) -> Literal["go", "bounce", "hold"]:
        """At the middleware, for a slot on the board: send now ("go", the board's release taken),
        hand back to the engine ("bounce", it came through the scheduler), or wait in place ("hold")."""
        meta, board = request.meta, self.board
        scheduled = meta.pop(SCHEDULED, False)
        if meta.pop(RELEASED, False) and not self._cooled_again(slot):
            return "go"  # the room released it on the board already
        if board.ready_at(slot, self._holding[slot] + self.waiting(slot) + 1) <= board.clock():
            mark = board.released(slot)
            if mark is not None:
                meta[PROBE] = mark
            return "go"
        return "bounce" if scheduled and self.active else "hold"

    async def hold_in_place(self, slot: str, request: Request, give_up: GiveUp) -> Request | None:
        """A request that bypassed the scheduler waits here for the board's release (it holds a download place).

        The same board decides as for the queue: cooldown, wake spread, pace, breaker.
        """
        board = self.board
        self._holding[slot] += 1
        try:
            if not await self.extension.downloader_hold.wait(
                request, slot,
                lambda: 0.0 if board.refused(slot) else board.ready_at(slot, self._holding[slot]) - board.clock(),
            ):
                wait = max(0.0, board.ready_at(slot, 1) - board.clock())
                detail = "the crawl closed while it was held"
                return give_up.at_close(request, slot, detail, request.meta.get(THROTTLES, 0), wait)
            if board.refused(slot):
                return self.extension.refusals.arriving(request, slot, give_up)
            mark = board.released(slot)
            request.meta[SENT] = board.clock()
            if mark is not None:
                request.meta[PROBE] = mark
            board.pauses.left(slot, mark)
            return None
        finally:
            self._holding[slot] -= 1
            if not self._holding[slot]:
                del self._holding[slot]

    def _cooled_again(self, slot: str) -> bool:
        """Throttled again (or its circuit opened) since the room released the request."""
        return self.board.remaining(slot) > 0 or self.board.breaker_state(slot) == OPEN

    def bounced(self, request: Request) -> Request:
        """A scheduled request that reached the middleware while its slot is held: back to the engine."""
        self.extension.probe_withdrawn(self.extension.slot_of(request), request)  # cooled on its way
        self.extension.stats.inc_value("retry_after/waiting_room/bounced")
        self._rescheduled(request)
        back = request.copy()
        back.dont_filter = True  # should the slot reopen before the room sees it, the dupefilter knows it
        return back

    def _request_scheduled(self, request: Request, **kwargs: Any) -> None:
        meta = request.meta
        if meta.get(PARKED):
            return  # the park tracker drops it
        slot = self.extension.slot_of(request)
        if meta.get(RELEASED) or not self.held(slot):
            meta[SCHEDULED] = True
            return
        # Nothing written to a waiting request: a mark could grow its meta dict.
        by_priority = self._rooms.setdefault(slot, {})
        by_priority.setdefault(request.priority, collections.deque()).append(request)
        self._count[slot] += 1
        self.extension.stats.inc_value("retry_after/waiting_room/taken")
        self._look_at(self.board.ready_at(slot, self.waiting(slot)))
        raise IgnoreRequest(f"waiting for {slot}")

    def _look_at(self, when: float) -> None:
        when = min(when, self.board.clock() + LOOK)
        if when >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = call_later(max(0.0, when - self.board.clock()) + 0.001, self._look)

    def _look(self) -> None:
        """Put back every request whose slot may send now, one board release each."""
        self._timer = None
        self._timer_at = float("inf")
        if scrapy_compat.is_closing(self.crawler):
            return  # what waits now is parked at close
        board, now, soonest = self.board, self.board.clock(), float("inf")
        for slot in list(self._rooms):
            if board.refused(slot):
                while self._count[slot]:  # the middleware parks them at once (Refusals.arriving)
                    self._release(self._pop(slot))
                continue
            while self._count[slot]:
                when = board.ready_at(slot, self._count[slot])
                if when > now:
                    soonest = min(soonest, when)
                    break
                mark = board.released(slot)
                request = self._pop(slot)
                if mark is not None:
                    request.meta[PROBE] = mark
                self._release(request)
        if self._rooms:
            self._look_at(soonest)

    def _pop(self, slot: str) -> Request:
        by_priority = self._rooms[slot]
        priority = max(by_priority)
        requests = by_priority[priority]
        request = requests.popleft()
        if not requests:
            del by_priority[priority]
        self._count[slot] -= 1
        if not self._count[slot]:
            del self._count[slot], self._rooms[slot]
        return request

    def _release(self, request: Request) -> None:
        request.meta[RELEASED] = True
        request.dont_filter = True  # its fingerprint was recorded when it was first scheduled
        self._rescheduled(request)
        self.extension.stats.inc_value("retry_after/waiting_room/released")
        engine = scrapy_compat.engine_of(self.crawler)
        assert engine is not None
        engine.crawl(request)

    def _rescheduled(self, request: Request) -> None:
        """The request is scheduled again without leaving the crawl: the park tracker counts it once."""
        parking = self.extension.parking
        if parking is not None:
            parking.tracker.rescheduled(request)

    def take(self) -> list[tuple[Request, str]]:
        """Hand over every waiting request (the crawl closes): each is handed over once."""
        taken = []
        for slot in list(self._rooms):
            while self._count[slot]:
                taken.append((self._pop(slot), slot))
        return taken

    def _spider_idle(self, **kwargs: Any) -> None:
        if self._count:
            self._look()
            raise DontCloseSpider(f"{len(self)} request(s) wait for their slot")

    def _spider_closed(self, **kwargs: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = float("inf")
        left = self.take()  # parking took its share first (its spider_closed runs before, when it is on)
        if left:
            self.extension.stats.inc_value("retry_after/waiting_room/lost_at_close", len(left))
            logger.warning(
                "%(count)d request(s) waiting for their slot were dropped when the crawl closed "
                "(RETRY_AFTER_PARKING is off): %(urls)s",
                {"count": len(left), "urls": [request.url for request, _ in left[:20]]},
                extra={"spider": self.crawler.spider},
            )
