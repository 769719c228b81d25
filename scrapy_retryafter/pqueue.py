"""The scheduler priority queue that keeps a cooling slot's requests at home.

Requests of a throttled slot wait here, in the scheduler (on disk with
JOBDIR), instead of in the downloader where they would hold
CONCURRENT_REQUESTS and stall a Ctrl-C. Every other slot keeps flowing, in
the same order DownloaderAwarePriorityQueue would give.

DownloaderAwarePriorityQueue looks at every slot on every pop, which a broad
crawl with 100,000 hosts in the scheduler pays per request. Here a slot that
may not send waits in a heap keyed by the time it may, and the slots that may
send sit in heaps keyed by name: the choice only looks at the few slots with
downloads in flight (at most CONCURRENT_REQUESTS of them), so a pop costs
O(log slots).
"""

from __future__ import annotations

import itertools
import pickle
import time
from contextlib import suppress
from heapq import heapify, heappop, heappush
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.pqueues import DownloaderAwarePriorityQueue

from .extension import RetryAfterExtension
from .failures import NOT_BEFORE
from .scrapy_compat import (
    ROUND_ROBIN,
    downloader_slots,
    last_selected,
    next_slot,
    path_safe,
    set_last_selected,
    slot_load,
)
from .signals import circuit_closed, circuit_opened

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler

    from .board import CooldownBoard

__all__ = ["CooldownAwarePriorityQueue"]

_FEW = 24
"""Up to this many slots that may send, looking at each costs less than keeping heaps."""
_SPARES = 32
"""Emptied in-memory slot queues kept for the slot's next push."""


class CooldownAwarePriorityQueue(DownloaderAwarePriorityQueue):
    """DownloaderAwarePriorityQueue that hands out a slot's request only when
    that slot may send it now: not cooling down, and with a free place in its
    downloader slot (so nothing queues inside the downloader)."""

    def __init__(
        self,
        crawler: Crawler,
        downstream_queue_cls: type[Any],
        key: str,
        slot_startprios: dict[str, Iterable[int]] | None = None,
        *,
        start_queue_cls: type[Any] | None = None,
    ) -> None:
        super().__init__(
            crawler,
            downstream_queue_cls,
            key,
            slot_startprios,
            start_queue_cls=start_queue_cls,
        )
        self._extension = RetryAfterExtension.of(crawler)
        self._extension.queue_holds_slots = True
        self._extension.held_counters.append(self._held)
        self._extension.queues.append(self)
        self._board = self._extension.board
        self._downloader_slots = downloader_slots(crawler)
        assert crawler.engine is not None
        self._slot_key = crawler.engine.downloader.get_slot_key
        self._spares: dict[str, Any] = {}
        """Slot -> its emptied queue (memory queues only). A slot whose requests come one at a
        time empties at every pop; building its queue anew per request costs more than the pop."""
        set_last_selected(self, None)
        # Every slot in pqueues is in exactly one of: _ahead (may send, name
        # after the last chosen), _behind (may send, name up to it), _due.
        for slot, queue in list(self.pqueues.items()):
            if not len(queue):
                queue.close()
                del self.pqueues[slot]
        self._ahead: list[str] = list(self.pqueues)
        self._behind: list[str] = []
        self._heaped = False
        """False while few slots may send: then _ahead lists them all, in no order."""
        self._cooling: list[tuple[float, str]] = []
        self._due: dict[str, float] = {}
        """Slot -> when it may send; a _cooling entry that disagrees is stale."""
        crawler.signals.connect(self.look_again, signal=circuit_closed)
        # A probe answered with a throttle reopens the circuit for less than the probe's timeout.
        crawler.signals.connect(self.look_again, signal=circuit_opened)
        self._wall = time.time
        self._waiting: list[tuple[float, int, Request]] = []
        """Retries waiting out their own backoff: (not-before, order, request).
        Kept out of their slot's queue so they hold neither the slot nor a download place."""
        self._order = itertools.count()

    def _held(self, slot: str) -> int:
        queue = self.pqueues.get(slot)
        return len(queue) if queue is not None else 0

    def _list(self, slot: str) -> None:
        if not self._heaped:
            if len(self._ahead) < _FEW:
                self._ahead.append(slot)
                return
            self._split(self._ahead)  # once per growth past _FEW, not per pop
        last = last_selected(self)
        if ROUND_ROBIN and last is not None and slot <= last:
            heappush(self._behind, slot)
        else:
            heappush(self._ahead, slot)

    def _hold(self, slot: str, when: float) -> None:
        self._due[slot] = when
        heappush(self._cooling, (when, slot))

    def look_again(self, slot: str, **kwargs: Any) -> None:
        """The time the slot was held for changed (a circuit closed or opened again, the pace rose)."""
        if self._due.pop(slot, None) is not None:
            self._list(slot)

    def _release_due(self, now: float) -> None:
        cooling = self._cooling
        due = self._due
        while cooling and cooling[0][0] <= now:
            when, slot = heappop(cooling)
            if due.get(slot) == when:
                del due[slot]
                self._list(slot)

    def _scan(self, heap: list[str], now: float, busy: list[tuple[int, str, bool]]) -> str | None:
        """The first slot of ``heap`` that may send and has nothing in flight.

        It stays at the head; slots with downloads in flight move to ``busy``
        as (active, slot, full) and slots that may not send to the cooling heap.
        """
        board = self._board
        holds = board.holds
        downloader_slots = self._downloader_slots
        while heap:
            slot = heap[0]
            if holds(slot):
                when = board.ready_at(slot, len(self.pqueues[slot]))
                if when > now:
                    heappop(heap)
                    self._hold(slot, when)
                    continue
            downloader_slot = downloader_slots.get(slot)
            if downloader_slot is None:
                return slot
            in_flight, concurrency = slot_load(downloader_slot)
            if not in_flight:
                return slot
            heappop(heap)
            active = len(in_flight)
            busy.append((active, slot, active >= concurrency))
        return None

    def _select(self, *, update_state: bool) -> str | None:
        """DownloaderAwarePriorityQueue's choice among the slots that may send now.

        The least busy slot wins, ties going to the next name after the last
        chosen (Scrapy 2.19) or the smallest name (2.13). A slot with nothing
        in flight is the least busy, and finding the first one in name order
        only steps over the slots with downloads in flight.
        """
        board = self._board
        if len(self._ahead) + len(self._behind) <= _FEW and not self._cooling:
            return self._select_among_few(board, update_state=update_state)
        now = board.clock()
        if self._cooling and self._cooling[0][0] <= now:
            self._release_due(now)
        if len(self._ahead) + len(self._behind) <= _FEW:
            return self._select_among_few(board, update_state=update_state)
        if not self._heaped:
            self._split(self._ahead + self._behind)
        ahead, behind = self._ahead, self._behind
        busy_ahead: list[tuple[int, str, bool]] = []
        busy_behind: list[tuple[int, str, bool]] = []
        slot = self._scan(ahead, now, busy_ahead)
        if slot is not None:
            if update_state:
                heappop(ahead)
                if ROUND_ROBIN:
                    set_last_selected(self, slot)
                    self._relist(busy_ahead, behind)  # stepped over: now before the last chosen
                    return slot
            self._relist(busy_ahead, ahead)
            return slot
        if ROUND_ROBIN:
            slot = self._scan(behind, now, busy_behind)
            if slot is not None:
                if update_state:
                    heappop(behind)
                    set_last_selected(self, slot)
                    # Wrapped around: what is left after it comes next.
                    self._ahead, self._behind = behind, ahead
                    ahead, behind = behind, ahead
                self._relist(busy_ahead, ahead)
                self._relist(busy_behind, behind)
                return slot
        busy = busy_ahead + busy_behind
        stats = [(active, name) for active, name, full in busy if not full]
        if not stats:
            self._relist(busy_ahead, ahead)
            self._relist(busy_behind, behind)
            self._wake_later()
            return None
        if ROUND_ROBIN:
            slot = next_slot(self, stats, update_state=update_state)
        else:
            slot = min(stats)[1]
        if not update_state:
            self._relist(busy_ahead, ahead)
            self._relist(busy_behind, behind)
            return slot
        rest = [entry for entry in busy if entry[1] != slot]
        if ROUND_ROBIN:
            self._relist([entry for entry in rest if entry[1] < slot], behind)
            self._relist([entry for entry in rest if entry[1] > slot], ahead)
        else:
            self._relist(rest, ahead)
        return slot

    def _select_among_few(self, board: CooldownBoard, *, update_state: bool) -> str | None:
        """The same choice by looking at every slot, which is cheaper than heaps for a few.

        DownloaderAwarePriorityQueue's ``_next_slot`` is done in the same pass:
        a second loop over a list of (active, slot) costs as much as the first.
        """
        holds = board.holds
        downloader_slots = self._downloader_slots
        listed = self._ahead + self._behind if self._heaped else self._ahead
        last = last_selected(self) if ROUND_ROBIN else None
        best: str | None = None
        best_after: str | None = None
        """The least busy slot with the smallest name, and with the smallest name after ``last``."""
        least = 0
        now: float | None = None
        held = False
        for slot in listed:
            if holds(slot):
                if now is None:
                    now = board.clock()
                when = board.ready_at(slot, len(self.pqueues[slot]))
                if when > now:
                    self._hold(slot, when)
                    held = True
                    continue
            downloader_slot = downloader_slots.get(slot)
            if downloader_slot is None:
                active = 0
            else:
                in_flight, concurrency = slot_load(downloader_slot)
                active = len(in_flight)
                if active >= concurrency:
                    continue
            if best is None or active < least:
                least, best = active, slot
                best_after = slot if last is not None and slot > last else None
            elif active == least:
                if slot < best:
                    best = slot
                if last is not None and slot > last and (best_after is None or slot < best_after):
                    best_after = slot
        chosen = best_after if best_after is not None else best
        if held:
            listed = [slot for slot in listed if slot not in self._due]
        if update_state and chosen is not None:
            listed.remove(chosen)  # pop lists it again if it keeps requests
            if ROUND_ROBIN:
                set_last_selected(self, chosen)
        self._ahead, self._behind, self._heaped = listed, [], False
        if chosen is None:
            self._wake_later()
        return chosen

    def _split(self, slots: list[str]) -> None:
        """List ``slots`` anew, before or after the last chosen."""
        last = last_selected(self)
        if ROUND_ROBIN and last is not None:
            self._ahead = [slot for slot in slots if slot > last]
            self._behind = [slot for slot in slots if slot <= last]
        else:
            self._ahead, self._behind = slots, []
        heapify(self._ahead)
        heapify(self._behind)
        self._heaped = True

    @staticmethod
    def _relist(entries: list[tuple[int, str, bool]], heap: list[str]) -> None:
        for entry in entries:
            heappush(heap, entry[1])

    def _wake_later(self) -> None:
        """Nothing may send now: have the engine ask again when the first held slot may."""
        cooling, due = self._cooling, self._due
        while cooling and due.get(cooling[0][1]) != cooling[0][0]:
            heappop(cooling)
        if cooling:
            self._extension.wake_at(cooling[0][0])

    def push(self, request: Request) -> None:
        if NOT_BEFORE in request.meta and self._wait(request):
            return
        self._push_now(request)

    def _push_now(self, request: Request) -> None:
        slot = self._slot_key(request)
        queue = self.pqueues.get(slot)
        if queue is not None:
            queue.push(request)
            return
        queue = self._spares.pop(slot, None)
        if queue is None:
            queue = self.pqfactory(slot)
        try:
            queue.push(request)
        except BaseException:
            queue.close()
            raise
        self.pqueues[slot] = queue
        self._list(slot)

    def _wait(self, request: Request) -> bool:
        """Hold a retry whose backoff has not ended yet; False when it may go now."""
        try:
            not_before = float(request.meta[NOT_BEFORE])
        except (TypeError, ValueError):
            return False
        if not not_before > self._wall():
            return False
        if self.key:
            _check_serializable(request, self.crawler)
        heappush(self._waiting, (not_before, next(self._order), request))
        return True

    def _release_waiting(self) -> None:
        waiting = self._waiting
        now = self._wall()
        while waiting and waiting[0][0] <= now:
            self._push_now(heappop(waiting)[2])
        if waiting:
            self._extension.wake_at(self._board.clock() + waiting[0][0] - now)

    def pop(self) -> Request | None:
        if self._waiting:
            self._release_waiting()
        while True:
            request = self._pop_ready()
            # A retry read back from disk (JOBDIR resumed) may still owe its wait.
            if request is None or NOT_BEFORE not in request.meta or not self._wait(request):
                return request

    def _pop_ready(self) -> Request | None:
        slot = self._select(update_state=True)
        if slot is None:
            return None
        queue = self.pqueues[slot]
        request = queue.pop()
        if self._board.holds(slot):
            self._board.released(slot)
        if len(queue):
            self._list(slot)
            return request
        del self.pqueues[slot]
        if not self.key:
            spares = self._spares
            spares[slot] = queue
            if len(spares) > _SPARES:
                spares.pop(next(iter(spares))).close()
            return request
        queue.close()
        with suppress(OSError):
            Path(self.key, path_safe(slot)).rmdir()
        return request

    def peek(self) -> Request | None:
        if self._waiting:
            self._release_waiting()
        slot = self._select(update_state=False)
        if slot is None:
            return None
        return self.pqueues[slot].peek()

    def take_waiting(self) -> Iterator[tuple[Request, str, float]]:
        """Hand over the retries still waiting out their backoff, with their slot and wait left."""
        now = self._wall()
        while self._waiting:
            not_before, _, request = heappop(self._waiting)
            yield request, self._slot_key(request), max(0.0, not_before - now)

    def close(self) -> dict[str, list[int]]:
        # Waiting retries go back to their slots' queues (on disk with JOBDIR);
        # their not-before travels in meta and is honoured again on resume.
        while self._waiting:
            self._push_now(heappop(self._waiting)[2])
        self._ahead, self._behind, self._cooling, self._heaped = [], [], [], False
        self._due.clear()
        for spare in self._spares.values():
            spare.close()
        self._spares.clear()
        return super().close()

    def __len__(self) -> int:
        return super().__len__() + len(self._waiting)


def _check_serializable(request: Request, crawler: Crawler) -> None:
    """Raise ValueError as the disk queue would, so the scheduler keeps the request in memory."""
    try:
        pickle.dumps(request.to_dict(spider=crawler.spider), protocol=4)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise ValueError(str(error)) from error
