"""The scheduler priority queue that keeps a cooling slot's requests at home.

Requests of a throttled slot wait here, in the scheduler (on disk with
JOBDIR), instead of in the downloader where they would hold
CONCURRENT_REQUESTS and stall a Ctrl-C. Every other slot keeps flowing, in
the same order DownloaderAwarePriorityQueue would give.
"""

from __future__ import annotations

import heapq
import itertools
import pickle
import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.pqueues import DownloaderAwarePriorityQueue, _path_safe

from .extension import RetryAfterExtension
from .failures import NOT_BEFORE

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler

__all__ = ["CooldownAwarePriorityQueue"]


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
        self._downloader_slots = crawler.engine.downloader.slots  # type: ignore[union-attr]
        self._wall = time.time
        self._waiting: list[tuple[float, int, Request]] = []
        """Retries waiting out their own backoff: (not-before, order, request).
        Kept out of their slot's queue so they hold neither the slot nor a download place."""
        self._order = itertools.count()

    def _held(self, slot: str) -> int:
        queue = self.pqueues.get(slot)
        return len(queue) if queue is not None else 0

    def _ready(self) -> list[tuple[int, str]]:
        """(active downloads, slot) of every slot that may send now."""
        board = self._board
        downloader_slots = self._downloader_slots
        now = board.clock()
        wake = float("inf")
        ready: list[tuple[int, str]] = []
        for slot, queue in self.pqueues.items():
            if slot in board:
                when = board.ready_at(slot, len(queue))
                if when > now:
                    wake = min(wake, when)
                    continue
            downloader_slot = downloader_slots.get(slot)
            if downloader_slot is None:
                ready.append((0, slot))
                continue
            active = len(downloader_slot.active)
            if active < downloader_slot.concurrency:
                ready.append((active, slot))
        if wake != float("inf"):
            self._extension.wake_at(wake)
        return ready

    def _choose(self, ready: list[tuple[int, str]], *, update_state: bool) -> str:
        next_slot = getattr(self, "_next_slot", None)
        if next_slot is not None:
            return next_slot(ready, update_state=update_state)  # type: ignore[no-any-return]
        return min(ready)[1]

    def push(self, request: Request) -> None:
        if NOT_BEFORE in request.meta and self._wait(request):
            return
        super().push(request)

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
        heapq.heappush(self._waiting, (not_before, next(self._order), request))
        return True

    def _release_due(self) -> None:
        waiting = self._waiting
        now = self._wall()
        while waiting and waiting[0][0] <= now:
            super().push(heapq.heappop(waiting)[2])
        if waiting:
            self._extension.wake_at(self._board.clock() + waiting[0][0] - now)

    def pop(self) -> Request | None:
        if self._waiting:
            self._release_due()
        while True:
            request = self._pop_ready()
            # A retry read back from disk (JOBDIR resumed) may still owe its wait.
            if request is None or NOT_BEFORE not in request.meta or not self._wait(request):
                return request

    def _pop_ready(self) -> Request | None:
        ready = self._ready()
        if not ready:
            return None
        slot = self._choose(ready, update_state=True)
        queue = self.pqueues[slot]
        request = queue.pop()
        if slot in self._board:
            self._board.released(slot)
        if len(queue) == 0:
            del self.pqueues[slot]
            queue.close()
            if self.key:
                with suppress(OSError):
                    Path(self.key, _path_safe(slot)).rmdir()
        return request

    def peek(self) -> Request | None:
        if self._waiting:
            self._release_due()
        ready = self._ready()
        if not ready:
            return None
        return self.pqueues[self._choose(ready, update_state=False)].peek()

    def take_waiting(self) -> Iterator[tuple[Request, str, float]]:
        """Hand over the retries still waiting out their backoff, with their slot and wait left."""
        now = self._wall()
        while self._waiting:
            not_before, _, request = heapq.heappop(self._waiting)
            yield request, self._downloader_interface.get_slot_key(request), max(0.0, not_before - now)

    def close(self) -> dict[str, list[int]]:
        # Waiting retries go back to their slots' queues (on disk with JOBDIR);
        # their not-before travels in meta and is honoured again on resume.
        while self._waiting:
            super().push(heapq.heappop(self._waiting)[2])
        return super().close()

    def __len__(self) -> int:
        return super().__len__() + len(self._waiting)


def _check_serializable(request: Request, crawler: Crawler) -> None:
    """Raise ValueError as the disk queue would, so the scheduler keeps the request in memory."""
    try:
        pickle.dumps(request.to_dict(spider=crawler.spider), protocol=4)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise ValueError(str(error)) from error
