"""Which slot the priority queue serves next: the per-slot ready and held bookkeeping.

The choice is DownloaderAwarePriorityQueue's (the least busy slot, ties by
name, round robin after the last chosen on Scrapy 2.19), made among only the
slots that may send now. A slot that may not send waits in a heap keyed by the
time it may; the slots that may send sit in heaps keyed by name, so a choice
looks only at the few slots with downloads in flight and costs O(log slots).
Up to ``_FEW`` slots, looking at each is cheaper than keeping heaps.

Pure: no Scrapy, no Twisted. The queue shell (pqueue.py) passes in the
downloader's slots, its per-slot queues and the round-robin state Scrapy's own
queue keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sized
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .board import CooldownBoard

__all__ = ["SlotChoice"]

_FEW = 24
"""Up to this many slots that may send, looking at each costs less than keeping heaps."""


class SlotChoice:
    """The slots with requests, each either listed (may send) or held until a time.

    Every slot with requests is in exactly one of: ``_ahead`` (may send, name
    after the last chosen), ``_behind`` (may send, name up to it), ``_due``.
    """

    def __init__(
        self,
        board: CooldownBoard,
        slots: Iterable[str],
        *,
        queued: Mapping[str, Sized],
        downloader_slots: Mapping[str, Any],
        load: Callable[[Any], tuple[Any, int]],
        round_robin: bool,
        last_selected: Callable[[], str | None],
        set_last_selected: Callable[[str | None], None],
        next_slot: Callable[[list[tuple[int, str]], bool], str],
        wake_at: Callable[[float], None],
    ) -> None:
        """``queued``: slot -> its requests; ``downloader_slots``: slot -> its downloader slot,
        whose ``load`` is (requests in flight, concurrency); ``next_slot``: Scrapy's round-robin
        choice among (active, slot); ``wake_at``: have the engine ask again at a clock time."""
        self.board = board
        self._queued = queued
        self._downloader_slots = downloader_slots
        self._load = load
        self._round_robin = round_robin
        self._last = last_selected
        self._set_last = set_last_selected
        self._next_slot = next_slot
        self._wake_at = wake_at
        self._ahead: list[str] = list(slots)
        self._behind: list[str] = []
        self._heaped = False
        """False while few slots may send: then _ahead lists them all, in no order."""
        self._cooling: list[tuple[float, str]] = []
        self._due: dict[str, float] = {}
        """Slot -> when it may send; a _cooling entry that disagrees is stale."""

    def add(self, slot: str) -> None:
        """List a slot that has requests and is not held."""
        if not self._heaped:
            if len(self._ahead) < _FEW:
                self._ahead.append(slot)
                return
            self._split(self._ahead)  # once per growth past _FEW, not per pop
        last = self._last()
        if self._round_robin and last is not None and slot <= last:
            heappush(self._behind, slot)
        else:
            heappush(self._ahead, slot)

    def _hold(self, slot: str, when: float) -> None:
        self._due[slot] = when
        heappush(self._cooling, (when, slot))

    def look_again(self, slot: str) -> None:
        """The time the slot was held for changed: list it again if it was held."""
        if self._due.pop(slot, None) is not None:
            self.add(slot)

    def clear(self) -> None:
        self._ahead, self._behind, self._cooling, self._heaped = [], [], [], False
        self._due.clear()

    def _release_due(self, now: float) -> None:
        cooling = self._cooling
        due = self._due
        while cooling and cooling[0][0] <= now:
            when, slot = heappop(cooling)
            if due.get(slot) == when:
                del due[slot]
                self.add(slot)

    def _scan(self, heap: list[str], now: float, busy: list[tuple[int, str, bool]]) -> str | None:
        """The first slot of ``heap`` that may send and has nothing in flight.

        It stays at the head; slots with downloads in flight move to ``busy``
        as (active, slot, full) and slots that may not send to the cooling heap.
        """
        board = self.board
        holds = board.holds
        downloader_slots = self._downloader_slots
        slot_load = self._load
        while heap:
            slot = heap[0]
            if holds(slot):
                when = board.ready_at(slot, len(self._queued[slot]))
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

    def select(self, *, update_state: bool) -> str | None:
        """DownloaderAwarePriorityQueue's choice among the slots that may send now.

        The least busy slot wins, ties going to the next name after the last
        chosen (Scrapy 2.19) or the smallest name (2.13). A slot with nothing
        in flight is the least busy, and finding the first one in name order
        only steps over the slots with downloads in flight.
        """
        board = self.board
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
                if self._round_robin:
                    self._set_last(slot)
                    self._relist(busy_ahead, behind)  # stepped over: now before the last chosen
                    return slot
            self._relist(busy_ahead, ahead)
            return slot
        if self._round_robin:
            slot = self._scan(behind, now, busy_behind)
            if slot is not None:
                if update_state:
                    heappop(behind)
                    self._set_last(slot)
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
        if self._round_robin:
            slot = self._next_slot(stats, update_state)
        else:
            slot = min(stats)[1]
        if not update_state:
            self._relist(busy_ahead, ahead)
            self._relist(busy_behind, behind)
            return slot
        rest = [entry for entry in busy if entry[1] != slot]
        if self._round_robin:
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
        slot_load = self._load
        listed = self._ahead + self._behind if self._heaped else self._ahead
        last = self._last() if self._round_robin else None
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
                when = board.ready_at(slot, len(self._queued[slot]))
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
            if self._round_robin:
                self._set_last(chosen)
        self._ahead, self._behind, self._heaped = listed, [], False
        if chosen is None:
            self._wake_later()
        return chosen

    def _split(self, slots: list[str]) -> None:
        """List ``slots`` anew, before or after the last chosen."""
        last = self._last()
        if self._round_robin and last is not None:
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
            self._wake_at(cooling[0][0])


def forget_slot(choice: SlotChoice, slot: str) -> None:
    """Forget a slot whose queue was taken away whole (refused: its requests parked).

    Rare (once per refusal), so a linear pass; its cooling entry, if any, goes stale.
    """
    choice._due.pop(slot, None)
    for heap in (choice._ahead, choice._behind):
        if slot in heap:
            heap.remove(slot)
            heapify(heap)  # harmless while the list is not heaped
