"""Slots refused until a set time: their requests parked in one sweep, the refusal kept for the next run.

A Retry-After over the cap (or a quota slower than ``max_delay``, or a host
paused longer than ``max_delay``) refuses the slot until then. Releasing its
queued requests at the slot's pace only to park each one costs an hour for a
few thousand requests; here the queue gives them all up at once and they are
parked as one batch (one locked write, one fsync), with one WARNING per
refusal. The refusal is saved in the per-host state file (hoststate.py)
beside the park file, so the next run sends nothing to that host before then
and parks its requests for it unsent. Without CooldownAwarePriorityQueue
there is no queue to sweep: requests are parked as they reach the downloader.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import signals
from scrapy.exceptions import IgnoreRequest

from .eventlog import printable
from .hostpaces import learned_records, seeded_paces
from .hostrecord import MAX_REFUSAL, HostRecord, Refusal
from .hoststate import HostMemory, HostMemoryError
from .parkrecord import iso
from .timers import call_later

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy import Request
    from scrapy.crawler import Crawler

    from .board import CooldownBoard
    from .holding import GiveUp
    from .parking import Parking
    from .settings import Config


class _Queue(Protocol):
    def take_slot(self, slot: str) -> list[Request]: ...

    def push(self, request: Request) -> None: ...


class _Crawl(Protocol):
    """What of the extension a refusal needs (the extension owns this object: no import back)."""

    board: CooldownBoard
    config: Config
    parking: Parking | None
    queue_holds_slots: bool

    @property
    def queues(self) -> Sequence[_Queue]: ...

    def nudge_engine(self) -> None: ...

__all__ = ["HOST_STATE_NAME", "Refusals", "host_state_path"]

logger = logging.getLogger(__name__)

HOST_STATE_NAME = "retry_after.hosts.json"
_SWEEP_DELAY = 0.05
"""Seconds a sweep waits after the push that asked for it: the pushes of one burst share one batch."""


def host_state_path(configured: str | None, park_file: Path) -> Path:
    return Path(configured) if configured else park_file.with_name(HOST_STATE_NAME)


class Refusals:
    """The refused slots of one crawl: why and until when (wall clock), their sweeps and their memory."""

    def __init__(self, crawler: Crawler, extension: _Crawl) -> None:
        self.crawler = crawler
        self.extension = extension
        self.board = extension.board
        self.stats = crawler.stats
        self.why: dict[str, tuple[str, float]] = {}
        """Slot -> (reason, refused until in epoch seconds)."""
        self._warned: dict[str, float] = {}
        """Slot -> the refusal end its WARNING named: a later sweep of the same refusal is quiet."""
        self._timer: Any = None
        self.memory: HostMemory | None = None
        self._broken = False
        self._scan_all = False
        self._asked: set[str] = set()
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    # -- refusing ----------------------------------------------------------------------------

    def refuse(self, slot: str, seconds: float, reason: str) -> None:
        """Refuse ``slot`` for ``seconds`` (bounded by the caller) and sweep its queued requests soon."""
        if not seconds > 0:
            return
        self.board.refuse(slot, seconds)
        until = time.time() + self.board.refused(slot)
        previous = self.why.get(slot)
        if previous is None or until > previous[1] + 1.0:
            self.why[slot] = (reason, until)
            self._remember(slot, reason, until)
        self.soon(slot)

    def until(self, slot: str) -> float | None:
        """Epoch seconds the slot is refused until, None when it is not refused."""
        if not self.board.refused(slot):
            self.why.pop(slot, None)
            return None
        kept = self.why.get(slot)
        return kept[1] if kept is not None else time.time() + self.board.refused(slot)

    def reason(self, slot: str) -> str:
        kept = self.why.get(slot)
        return kept[0] if kept is not None else "over_cap"

    def refused_elsewhere(self) -> None:
        """The fleet refused a slot: the next sweep looks at every queued slot once."""
        self._scan_all = True
        self.soon()

    def soon(self, slot: str | None = None) -> None:
        """Sweep ``slot`` (None: only the fleet's scan) in a moment: the pushes of one burst share a batch."""
        if self._broken or self.extension.parking is None or not self.extension.parking.usable:
            return  # nothing to park into: the give-up path takes them one by one
        if slot is not None:
            self._asked.add(slot)
        if self._timer is None:
            self._timer = call_later(_SWEEP_DELAY, self.sweep)

    # -- parking -----------------------------------------------------------------------------

    def sweep(self) -> int:
        """Park the queued requests of the refused slots asked about, one batch per slot; how many were parked."""
        self._timer = None
        parked = 0
        slots = dict.fromkeys(self._asked)  # not every refused slot: a file may hold thousands
        self._asked = set()
        if self._scan_all:  # refused elsewhere (the fleet's board): which queued slots, once
            self._scan_all = False
            for queue in self.extension.queues:
                slots.update(dict.fromkeys(slot for slot in getattr(queue, "pqueues", ()) if self.board.refused(slot)))
        for slot in slots:
            if self.until(slot) is None:
                continue
            taken = [(queue, queue.take_slot(slot)) for queue in self.extension.queues]
            requests = [request for _, some in taken for request in some]
            if not requests:
                continue
            done = self._park(slot, requests)
            if done is None:  # back where each came from: they meet the give-up path one by one
                for queue, some in taken:
                    for request in some:
                        queue.push(request)
                continue
            parked += len(done)
        if parked:
            self.extension.nudge_engine()  # the queue may be empty now: let the engine see it before its heartbeat
        return parked

    def arriving(self, request: Request, slot: str, give_up: GiveUp) -> Request:
        """A request of a refused slot that reached the downloader: parked unsent, one WARNING per
        refusal; where that fails, the give-up path's (parked alone, or IgnoreRequest to the errback)."""
        parked = self._park(slot, [request])
        if parked:
            return parked[0]
        refused = self.board.refused(slot)
        reason = f"slot refuses requests for {refused:.0f}s more (Retry-After over the cap)"
        given_up = give_up(request, slot, None, reason, self.reason(slot), refused)
        if given_up is not None:
            return given_up
        raise IgnoreRequest(f"{slot} asked for a wait over RETRY_AFTER_MAX_DELAY")

    def rejoin(self, request: Request, slot: str) -> Request | None:
        """An answer over the cap, with the queue: the request goes back to the scheduler, where the
        sweep parks it in its slot's batch (one WARNING for all, not one per request in flight)."""
        parking = self.extension.parking
        if not self.extension.queue_holds_slots or self._broken or parking is None or not parking.usable:
            return None
        if not self.board.refused(slot):
            return None
        assert self.stats is not None
        self.stats.inc_value("retry_after/gave_up")
        return request.replace(dont_filter=True)

    def _park(self, slot: str, requests: list[Request]) -> list[Request] | None:
        """Park ``requests`` of refused ``slot`` in one write; None when parking is off or failed.

        When the batch cannot be written, the slots are no longer held for
        their refusal: the sweep puts the batch back in its queues, and its
        requests meet the give-up path one by one, which hands them to the errback.
        """
        parking = self.extension.parking
        if parking is None or not parking.usable or self._broken or not requests:
            return None
        now = time.time()
        until = self.until(slot) or now
        reason = self.reason(slot)
        detail = _DETAIL.get(reason, "the slot is refused") + f" until {iso(until)}"
        items = [(r, slot, reason, detail, int(r.meta.get("retry_after_throttles", 0)), until - now) for r in requests]
        try:
            parked = parking.park_many(items)
        except OSError as error:
            self._broken = True
            self.board.hold_refused = False
            assert self.stats is not None
            self.stats.inc_value("retry_after/refusal_park_failed", len(requests))
            logger.error(
                "Could not park the %(count)d request(s) of refused slot %(slot)s in %(path)s (%(error)s): "
                "they go to the errback as they reach the downloader",
                {"count": len(requests), "slot": printable(slot), "path": parking.path, "error": error},
                extra={"spider": self.crawler.spider},
            )
            self.extension.nudge_engine()
            return None
        assert self.stats is not None
        self.stats.inc_value("retry_after/refused_parked", len(parked))
        # One WARNING per refusal; later sweeps of the same refusal (late arrivals) are DEBUG.
        quiet = abs(self._warned.get(slot, -1.0) - until) < 1.0
        self._warned[slot] = until
        logger.log(
            logging.DEBUG if quiet else logging.WARNING,
            "Refused %(slot)s until %(until)s (%(reason)s): parked %(count)d request(s) in one batch in %(path)s; "
            "nothing is sent to it before then",
            {"slot": printable(slot), "until": iso(until), "reason": reason, "count": len(parked), "path": parking.path},
            extra={"spider": self.crawler.spider},
        )
        return parked

    # -- the per-host state file ---------------------------------------------------------------

    def _spider_opened(self, **kwargs: Any) -> None:
        """Load the refusals still in force: their hosts are refused from the first request on."""
        parking = self.extension.parking
        config = self.extension.config
        if parking is None or parking.file is None or not config.host_state:
            return
        memory = HostMemory(host_state_path(config.host_state_file, parking.path), max_age=config.memory_age,
                            lock_timeout=_LOCK_TIMEOUT)
        try:
            records = memory.load()
        except HostMemoryError as error:
            self._state_failed("read", error)
            return
        self.memory = memory
        if memory.set_aside:
            logger.warning(
                "Per-host state file %(path)s: %(count)d unusable record(s) set aside in %(bad)s",
                {"path": memory.path, "count": memory.set_aside, "bad": memory.bad_path},
                extra={"spider": self.crawler.spider},
            )
        now = time.time()
        loaded = 0
        for host, record in records.items():
            refusal = record.refusal
            if refusal is None or not refusal.until > now:
                continue
            seconds = min(refusal.until - now, MAX_REFUSAL)
            self.board.refuse(host, seconds)
            # A reason from the file is logged and parked: only the ones written here are taken.
            self.why[host] = (refusal.reason if refusal.reason in _DETAIL else "over_cap", now + seconds)
            loaded += 1
        if loaded:
            assert self.stats is not None
            self.stats.set_value("retry_after/refusals_loaded", loaded)
            logger.info(
                "Per-host state file %(path)s: %(count)d host(s) still refused; nothing is sent to them before "
                "their time, and their requests are parked unsent",
                {"path": memory.path, "count": loaded},
                extra={"spider": self.crawler.spider},
            )
        paced = seeded_paces(self.board, records)
        if paced:
            assert self.stats is not None
            self.stats.set_value("retry_after/paces_loaded", paced)
            logger.info(
                "Per-host state file %(path)s: %(count)d host(s) start at the pace learned last time",
                {"path": memory.path, "count": paced},
                extra={"spider": self.crawler.spider},
            )

    def _spider_closed(self, **kwargs: Any) -> None:
        """Merge the paces this run learned into the file (nothing is written when none was learned)."""
        if self.memory is None:
            return
        learned = learned_records(self.board, time.time())
        if not learned:
            return
        try:
            self.memory.save(learned)
        except HostMemoryError as error:
            self._state_failed("write", error)
            return
        assert self.stats is not None
        self.stats.set_value("retry_after/paces_saved", len(learned))

    def _remember(self, slot: str, reason: str, until: float) -> None:
        """Save the refusal at once (a crash keeps it); the file merges it with other processes' own."""
        if self.memory is None:
            return
        record = HostRecord(refusal=Refusal(until=until, reason=reason, at=time.time()))
        try:
            self.memory.save({slot: record})
        except HostMemoryError as error:
            self._state_failed("write", error)
            self.memory = None

    def _state_failed(self, what: str, error: BaseException) -> None:
        assert self.stats is not None
        self.stats.inc_value("retry_after/host_state_failed")
        logger.error(
            "Per-host state file: cannot %(what)s it (%(error)s); refusals and paces are not kept for the next run",
            {"what": what, "error": error},
            extra={"spider": self.crawler.spider},
        )


_DETAIL = {
    "over_cap": "Retry-After over RETRY_AFTER_MAX_DELAY: the slot is refused",
    "quota": "a quota slower than RETRY_AFTER_MAX_DELAY: the slot is refused",
    "host_down": "the host stayed down longer than RETRY_AFTER_MAX_DELAY: the slot is refused",
}
_LOCK_TIMEOUT = 2.0
"""Seconds a save waits for another process's save (each holds the lock for one small write)."""
