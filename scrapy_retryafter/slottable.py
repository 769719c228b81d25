"""Where the board keeps its per-slot state, and when it lets a slot go.

Every map the board keeps per download slot lives here: the slot states, the
success meters, the connection-failure streaks, the quota windows and the host pauses. This
part decides when a slot has nothing left to remember (then it is dropped and
``forgot`` tells whoever keeps anything beside the board), what a paused crawl
must keep (``snapshot``/``restore``), and counts what is kept. The board
(board.py) builds its decisions on it. Pure: no Scrapy, no Twisted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from .breaker import CLOSED
from .failures import ConsecutiveFailures
from .hostpause import HostPauses
from .meter import Meter
from .quota import QuotaWindows
from .rate import RateController, usable
from .ratememory import learned_pace, remember_pace
from .slot_state import SlotState, restored_state, saved_state

__all__ = ["SlotTable"]


class SlotTable:
    """The board's per-slot maps and their lifetime: a slot is kept only while something about it matters."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, pace_memory: float = 600.0) -> None:
        self.clock = clock
        self.pace_memory = pace_memory
        """Seconds a learned rate outlives the slot's last request."""
        self._slots: dict[str, SlotState] = {}
        self.holds: Callable[[str], bool] = self._slots.__contains__
        """``slot in board`` without a Python call: the queue asks it per slot per pop."""
        self._meters: dict[str, Meter] = {}
        self.streaks = ConsecutiveFailures()
        """Connection failures in a row per slot (host-down rule), pruned in ``sweep``."""
        self.quota_windows = QuotaWindows()
        """Windows learnt from successive quota resets, pruned in ``sweep``."""
        self.pauses = HostPauses()
        """Hosts paused by an outage, probed one request per interval (hostpause.py)."""

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, slot: str) -> bool:
        return slot in self._slots

    def holds_none(self) -> bool:
        """``slot in board`` is False for every slot: one check instead of computing a request's slot
        (the middleware asks it per request). A fleet board may learn of a slot when asked: never True there."""
        return not self._slots

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._slots))

    def connection_failed(self, slot: str) -> int:
        """Count a failed connection to ``slot``; return how many in a row."""
        return self.streaks.failed(slot, self.clock())

    def quota_window(
        self,
        slot: str,
        reset_at: float,
        remaining: float | None = None,
        quota: float | None = None,
        sent_at: float | None = None,
    ) -> float | None:
        """The window of ``slot``'s quota, learnt from how far its reset epoch moves on."""
        return self.quota_windows.window(slot, reset_at, self.clock(), remaining, quota, sent_at)

    def _done(self, state: SlotState, now: float) -> bool:
        if now < state.wake_end or now < state.refuse_until or now < state.cooldown_until:
            return False
        if state.breaker is not None and state.breaker.state != CLOSED:
            return False
        # A spent budget, a learned pace and a throttle streak are remembered alike.
        if state.tokens >= 0 or (state.breaker is not None and state.breaker.consecutive):
            return now - state.last_seen > self.pace_memory
        return state.pace is None or now - state.last_seen > self.pace_memory

    def _forget_if_done(self, slot: str, state: SlotState, now: float) -> None:
        if self._done(state, now) and slot not in self.pauses:
            del self._slots[slot]
            self.forgot(slot)

    def forgot(self, slot: str) -> None:
        """Called once a slot's state is dropped: whoever keeps anything per slot
        beside the board (a fleet backend, a tally) drops it here, so nothing per
        slot outlives the board's own memory of it."""

    def kept(self) -> dict[str, int]:
        """How many slots each per-slot map of the board holds (memory checks, the bench)."""
        return {
            "slots": len(self._slots),
            "meters": len(self._meters),
            "streaks": len(self.streaks),
            "quota_windows": len(self.quota_windows),
            "pauses": len(self.pauses),
        }

    def kept_slots(self) -> set[str]:
        """Every slot anything on the board is kept for."""
        return {*self._slots, *self._meters, *self.streaks, *self.quota_windows, *self.pauses}

    def sweep(self) -> int:
        """Drop every slot with nothing left to remember; return how many."""
        now = self.clock()
        done = [slot for slot, state in self._slots.items() if self._done(state, now) and slot not in self.pauses]
        for slot in done:
            del self._slots[slot]
            self.forgot(slot)
        idle = [slot for slot, meter in self._meters.items() if meter.idle(now, 10.0)]
        for slot in idle:
            del self._meters[slot]
        self.streaks.prune(now - self.pace_memory)
        self.quota_windows.prune(now - self.pace_memory)
        self.pauses.prune(now - self.pace_memory)
        return len(done)

    def snapshot(self) -> dict[str, dict[str, float | str]]:
        """What a paused crawl must not forget, per slot, in seconds from now.

        A resumed crawl (JOBDIR) restores it, so it does not hit a host that
        is still cooling or whose circuit is still open.
        """
        now = self.clock()
        saved = {slot: saved_state(state, now) for slot, state in self._slots.items()}
        return {slot: entry for slot, entry in saved.items() if entry}

    def learned_paces(self) -> dict[str, float]:
        """The pace each throttled slot was learned to take (for the per-host memory); none for the others."""
        paces = {}
        for slot, state in self._slots.items():
            learned = learned_pace(state.pace) if state.pace is not None else None
            if learned is not None:
                paces[slot] = learned
        return paces

    def remember_paces(self, paces: dict[str, float]) -> int:
        """Start each slot at a pace a past run learned (ratememory.remember_pace); how many."""
        now = self.clock()
        count = 0
        for slot, rate in paces.items():
            if not usable(rate):
                continue  # a pace of 0 divided the next send's interval by zero
            count += 1
            state = self._slots.get(slot)
            if state is None:
                state = self._slots[slot] = SlotState()
            state.pace = RateController()
            remember_pace(state.pace, rate, now)
            state.last_seen = now
        return count

    def restore(self, saved: dict[str, dict[str, float | str]], elapsed: float = 0.0) -> int:
        """Load a snapshot taken ``elapsed`` seconds ago; return how many slots it restored."""
        now = self.clock()
        for slot, entry in saved.items():
            self._slots[slot] = restored_state(self._slots.get(slot) or SlotState(), entry, now, elapsed)
        return len(saved)
