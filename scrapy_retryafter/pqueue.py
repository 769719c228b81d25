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
O(log slots). That choice is SlotChoice's (slotchoice.py, pure); this module
is the Scrapy shell around it: the per-slot queues, retries waiting out their
backoff, and the spare queues of emptied slots.
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
from .hostpause import PROBE
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
from .slotchoice import SlotChoice, forget_slot

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler


__all__ = ["CooldownAwarePriorityQueue"]

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
        self._extension.queue_holds_slots = self._extension.queue_counts_slots = True
        self._extension.held_counters.append(self._held)
        self._extension.queues.append(self)
        self._board = self._extension.board
        self._downloader_slots = downloader_slots(crawler)
        self._slot_key = self._extension.slot_of  # the scope, when the request has one
        self._spares: dict[str, Any] = {}
        """Slot -> its emptied queue (memory queues only). A slot whose requests come one at a
        time empties at every pop; building its queue anew per request costs more than the pop."""
        set_last_selected(self, None)
        for slot, queue in list(self.pqueues.items()):
            if not len(queue):
                queue.close()
                del self.pqueues[slot]
        self._choice = SlotChoice(
            self._board,
            self.pqueues,
            queued=self.pqueues,
            downloader_slots=self._downloader_slots,
            load=slot_load,
            round_robin=ROUND_ROBIN,
            last_selected=lambda: last_selected(self),
            set_last_selected=lambda slot: set_last_selected(self, slot),
            next_slot=lambda stats, update_state: next_slot(self, stats, update_state=update_state),
            wake_at=self._extension.wake_at,
        )
        """Which slot may send next: every slot in pqueues is listed there or held until a time."""
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

    def look_again(self, slot: str, **kwargs: Any) -> None:
        """The time the slot was held for changed (a circuit closed or opened again, the pace rose)."""
        self._choice.look_again(slot)

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
        self._choice.add(slot)
        if self._board.refused(slot):
            self._extension.refusals.soon(slot)  # a refused slot's request waits here for the next sweep only

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
        if PROBE in request.meta:  # released as its paused host's probe, it waits again: the host is free
            self._extension.probe_withdrawn(self._extension.slot_of(request), request)
            del request.meta[PROBE]
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
        slot = self._choice.select(update_state=True)
        if slot is None:
            return None
        queue = self.pqueues[slot]
        request = queue.pop()
        if self._board.holds(slot):
            mark = self._board.released(slot)
            if mark is not None and request is not None:
                request.meta[PROBE] = mark
        if len(queue):
            self._choice.add(slot)
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
        slot = self._choice.select(update_state=False)
        if slot is None:
            return None
        return self.pqueues[slot].peek()

    def take_slot(self, slot: str) -> list[Request]:
        """Take every request this queue holds for ``slot`` (a refused slot: they are parked in one batch)."""
        taken: list[Request] = []
        queue = self.pqueues.pop(slot, None)
        if queue is not None:
            forget_slot(self._choice, slot)
            while (request := queue.pop()) is not None:
                taken.append(request)
            queue.close()
            if self.key:
                with suppress(OSError):
                    Path(self.key, path_safe(slot)).rmdir()
        if self._waiting:
            kept = [entry for entry in self._waiting if self._slot_key(entry[2]) != slot]
            if len(kept) != len(self._waiting):
                taken.extend(entry[2] for entry in self._waiting if self._slot_key(entry[2]) == slot)
                heapify(kept)
                self._waiting = kept
        return taken

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
        self._choice.clear()
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
