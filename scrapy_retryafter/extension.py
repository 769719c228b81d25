"""The Scrapy extension that owns the cooldown board for one crawl.

Middleware and queue reach the same instance through ``RetryAfterExtension.of``,
so there is one board per crawl whether or not the extension is listed in
EXTENSIONS. It also does what only the engine side can: wake the engine when a
held slot reopens, and take back requests that reached the downloader before
their slot was throttled.
"""

from __future__ import annotations

import collections
import logging
import math
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import signals
from twisted.python.failure import Failure

from . import scrapy_compat
from .board import CooldownBoard
from .breaker import OPEN
from .holding import DownloaderHold, GiveUp
from .hostpause import PROBE
from .jobstate import STATE_FILE, load_board, save_board
from .parking import Parking
from .refusals import Refusals
from .retry_reporting import check_give_up_log_level
from .scopeslots import ScopeSlots
from .settings import Config, load_config
from .settingsguard import warn_unknown_settings, warn_unused_slot_keys
from .tally import SlotTally
from .timers import call_from_thread, call_later, looping_call

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = ["RetryAfterExtension", "SlotCoolingDown"]

logger = logging.getLogger(__name__)

class HeldRequests(Protocol):
    """A source of requests held outside the scheduler: each call hands over what it holds now, as
    (request, slot), or (request, slot, why) when the slot's state does not say why."""

    def __call__(self) -> Iterable[tuple[Request, str] | tuple[Request, str, str]]: ...


class SlotHoldingQueue(Protocol):
    """A scheduler queue that keeps a cooling slot's requests (CooldownAwarePriorityQueue)."""

    key: str
    pqueues: dict[str, Any]

    def take_waiting(self) -> Iterator[tuple[Request, str, float]]: ...

    def take_slot(self, slot: str) -> list[Request]: ...

    def push(self, request: Request) -> None: ...

    def look_again(self, slot: str, **kwargs: Any) -> None: ...


class FleetBoard(Protocol):
    """What the extension runs of a board shared by a fleet (the Redis board) besides CooldownBoard's hooks."""

    def start(self, call_soon: Callable[[Callable[[], None]], Any] | None = None) -> None: ...

    def sync(self, timeout: float = 2.0) -> bool: ...

    def tick(self) -> None: ...

    def stop(self) -> None: ...


_SWEEP_INTERVAL = 30.0
_instances: weakref.WeakKeyDictionary[Any, RetryAfterExtension] = weakref.WeakKeyDictionary()


class SlotCoolingDown(Exception):
    """A request waited in the downloader for a slot that got throttled meanwhile."""

    def __init__(self, slot: str) -> None:
        super().__init__(f"download slot {slot!r} is cooling down")
        self.slot = slot


class RetryAfterExtension:
    def __init__(self, crawler: Crawler, config: Config, clock: Any = time.monotonic) -> None:
        check_give_up_log_level(crawler.settings)
        self.crawler = crawler
        self.config = config
        self.clock = clock
        self.stats = crawler.stats
        self._fleet: FleetBoard | None = None
        """The board again, when it is shared by a fleet: what only a fleet board does."""
        self.board = self._make_board(config, clock)
        self.tally = SlotTally()
        self.scopes = ScopeSlots(
            config.scopes, lambda request: scrapy_compat.slot_key(crawler, request),
            frozenset(config.slots) | frozenset(crawler.settings.getdict("DOWNLOAD_SLOTS")),
            lambda: scrapy_compat.per_slot_settings(crawler), self.stats, config.scope_bases,
        )
        """A scoped request's download slot is its scope (scopeslots.py)."""
        self.codes = config.all_codes
        """Every status some slot treats as a throttle (a cheap first filter)."""
        self._timer: Any = None
        self._timer_at = float("inf")
        self._sweeper: Any = None
        self._syncer: Any = None
        self.queue_holds_slots = False
        self.queue_counts_slots = False
        """The slot-holding queue counts each slot's requests (``held``): the add-on's own, not scrapy-redis's."""
        self._scheduled: tuple[float, int | None] = (-math.inf, None)
        """When the scheduler's length was last read, and what it was (``left_at_most``)."""
        """Set by CooldownAwarePriorityQueue: cooling slots wait in the scheduler."""
        self.held_counters: list[Callable[[str], int]] = []
        """len(requests held for a slot), one per CooldownAwarePriorityQueue (memory, disk)."""
        self.queues: list[SlotHoldingQueue] = []
        """Every CooldownAwarePriorityQueue of the crawl (memory, disk)."""
        self.held_requests: list[HeldRequests] = []
        """Callables yielding (request, slot) held outside the scheduler (middleware-only mode),
        or (request, slot, why) (requests Redis never took)."""
        self.jobdir: str | None = crawler.settings.get("JOBDIR") or None
        if self.jobdir and config.enabled:
            self._resume(self.jobdir)
        self.parking: Parking | None = None
        if config.enabled and config.parking:
            self.parking = Parking(crawler, config, self._held_at_close)
        self.board.hold_refused = self.parking is not None
        self.refusals = Refusals(crawler, self)
        """Refused slots: their requests parked in one sweep, the refusal kept in the per-host state file."""
        self.give_up = GiveUp(crawler, self.parking)
        """The one give-up path of both middlewares."""
        self.downloader_hold = DownloaderHold(crawler)
        """Requests waiting in the downloader (no CooldownAwarePriorityQueue), parked at close."""
        self.held_requests.append(self.downloader_hold.take)
        self.all_retries_installed = False
        self.throttles_installed = False
        """Set by RetryAfterMiddleware: the throttle codes are retried."""
        """Set by scrapy_retryafter.RetryMiddleware: RETRY_AFTER_ALL_RETRIES is carried out."""
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        warn_unknown_settings(crawler.settings)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """The crawl's one instance, whoever asks first: EXTENSIONS, the middleware or the queue.

        Two instances would mean two boards (and two handles on one park file).
        """
        existing = _instances.get(crawler)
        if isinstance(existing, cls):
            return existing
        extension = cls(crawler, load_config(crawler.settings))
        _instances[crawler] = extension
        return extension

    @classmethod
    def of(cls, crawler: Crawler) -> RetryAfterExtension:
        return cls.from_crawler(crawler)

    def _make_board(self, config: Config, clock: Any) -> CooldownBoard:
        if config.redis is None:
            return CooldownBoard(clock=clock)
        from .redis.wiring import fleet_board

        board = fleet_board(self, config, clock)
        self._fleet = board
        return board

    def slot_of(self, request: Request) -> str:
        """The request's download slot: its scope when RETRY_AFTER_SCOPES gives it one, written into
        ``download_slot`` meta so the downloader keys it so too; a user's own ``download_slot`` wins.

        Outside a crawl (no engine: a middleware called by hand) the host, as the downloader would key it."""
        return self.scopes.slot_of(request)

    def held(self, slot: str) -> int:
        return sum(count(slot) for count in self.held_counters)

    def left_at_most(self, slot: str) -> int | None:
        """Requests of ``slot`` still to send, at most; None while start requests may still come, or
        under a queue that holds slots without counting them (the scrapy-redis one).

        The add-on's queue counts each slot's own; without it the scheduler's
        whole length bounds what it holds of this slot. That length costs a
        pass over every slot's queue (DownloaderAwarePriorityQueue), so it is
        read at most once a second, as Scrapy's own pop passes over them on
        every request."""
        crawler = self.crawler
        if scrapy_compat.start_pending(crawler) or (self.queue_holds_slots and not self.queue_counts_slots):
            return None
        left = self.held(slot) + scrapy_compat.queued_in_downloader(crawler, slot)
        if self.queue_counts_slots:
            return left
        now = time.monotonic()
        if now - self._scheduled[0] >= 1.0:
            self._scheduled = (now, scrapy_compat.scheduled(crawler))
        scheduled = self._scheduled[1]
        return None if scheduled is None else left + scheduled

    @property
    def parked_by_slot(self) -> collections.Counter[str]:
        return self.parking.by_slot if self.parking is not None else collections.Counter()

    def _held_at_close(self) -> Iterator[tuple[Request, str, float, str]]:
        """Requests still held for a cooling or circuit-open slot when the crawl closes.

        Disk queues (JOBDIR) keep theirs for the resumed crawl; memory queues
        would drop them, so they are handed over for parking.
        """
        board = self.board
        now = board.clock()
        for queue in self.queues:
            if queue.key:
                continue
            for request, slot, wait in queue.take_waiting():
                yield request, slot, wait, "its retry was waiting out its backoff"
            for slot in list(queue.pqueues):
                why = self._holding(slot, now)
                if why is None:
                    continue
                slot_queue = queue.pqueues.pop(slot)
                wait = max(0.0, board.ready_at(slot, 1) - now)
                while (request := slot_queue.pop()) is not None:
                    yield request, slot, wait, why
        for held in self.held_requests:
            for request, slot, *given in held():
                wait = max(0.0, board.ready_at(slot, 1) - now)
                yield request, slot, wait, given[0] if given else self._holding(slot, now) or "held"

    def _holding(self, slot: str, now: float) -> str | None:
        if slot not in self.board:
            return None
        if self.board.refused(slot):
            return "its slot was refused"
        if self.board.breaker_state(slot) == OPEN:
            return "its circuit was open"
        if self.board.ready_at(slot, 1) > now:
            return "it was cooling down"
        return None

    def sooner(self, slot: str) -> None:
        """The slot's pace rose: queues holding it look again (the engine asks after every response)."""
        for queue in self.queues:
            queue.look_again(slot)

    def probe_withdrawn(self, slot: str, request: Request, sent_back: bool = False) -> None:
        """``request`` will not reach the host now (hostpause.HostPauses.withdrawn): if it was its
        paused host's probe, the next may leave at once."""
        if self.board.pauses.withdrawn(slot, request.meta.get(PROBE), sent_back):
            self.sooner(slot)
            self.wake_at(self.clock())

    def wake_at(self, when: float) -> None:
        """Make the engine look at the scheduler again at ``when`` (clock time)."""
        if when >= self._timer_at:
            return  # an earlier wake is set; the queue asks again then
        if self._timer is not None:
            self._timer.cancel()
        self._timer = call_later(max(0.0, when - self.clock()) + 0.001, self._wake)
        self._timer_at = when

    def _wake(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        self.nudge_engine()

    def refused_elsewhere(self, slot: str) -> None:
        """The fleet refused ``slot``: its queued requests are swept and parked as for a refusal here."""
        self.refusals.refused_elsewhere()

    def nudge_engine(self) -> None:
        scrapy_compat.nudge_engine(self.crawler)

    def send_back(self, slot: str) -> int:
        """Return to the scheduler the requests of ``slot`` not yet on the wire."""
        waiting = scrapy_compat.take_queued(self.crawler, slot)
        if not waiting:
            return 0
        for request, deferred in waiting:
            self.probe_withdrawn(slot, request, sent_back=True)  # a probe not on the wire yet
            deferred.errback(Failure(SlotCoolingDown(slot)))
        self.stats.inc_value("retry_after/sent_back", len(waiting))
        return len(waiting)

    def _spider_opened(self, **kwargs: Any) -> None:
        self._sweeper = looping_call(self.sweep)
        self._sweeper.start(_SWEEP_INTERVAL, now=False)
        if self._fleet is not None and self.config.redis is not None:
            fleet = self._fleet
            fleet.start(call_from_thread())
            fleet.sync(timeout=2 * self.config.redis.timeout)  # know the fleet's cooldowns before the first request
            self._syncer = looping_call(fleet.tick)
            self._syncer.start(self.config.redis.refresh / 2, now=True)

    def sweep(self) -> int:
        """Drop what is kept of slots with nothing left to remember: the board's, then the tally's."""
        swept = self.board.sweep()
        holds, parked = self.board.holds, self.parked_by_slot
        self.tally.prune(lambda slot: holds(slot) or slot in parked)
        return swept

    def _resume(self, jobdir: str) -> None:
        restored = load_board(self.board, jobdir)
        if restored < 0:
            logger.warning("Ignoring an unreadable %s in JOBDIR %s: starting with no cooldowns", STATE_FILE, jobdir)
        elif restored:
            logger.info("Resumed the cooldown, breaker and pace of %d slot(s) from JOBDIR %s", restored, jobdir)

    def _spider_closed(self, **kwargs: Any) -> None:
        warn_unused_slot_keys(self.config, [*self.tally.responses, *self.config.scope_bases.values()])
        if self.jobdir and self.config.enabled:
            save_board(self.board, self.jobdir)
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        if self._syncer is not None and self._syncer.running:
            self._syncer.stop()
            if self._fleet is not None:
                self._fleet.stop()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = float("inf")
