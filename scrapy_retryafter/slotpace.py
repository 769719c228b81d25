"""The learned and announced pace of each slot, part of the board.

A success feeds the slot's meter and may raise its pace; a throttle cuts it
once per event; a server's stated quota sets it. The board (board.py) adds
cooldowns, the breaker and the budget on top. Pure: no Scrapy, no Twisted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .meter import Meter
from .rate import RateController, usable
from .slot_state import SlotState
from .slottable import SlotTable
from .startsteps import sent_pace, stepped

__all__ = ["SlotPaces"]


class SlotPaces(SlotTable):
    """The pace part of the board: the per-slot maps are SlotTable's."""

    def succeeded(self, slot: str, left: Callable[[], int | None] | None = None) -> bool:
        """A response that was not a throttle: feeds the meter and the pace.

        ``left``: the slot's requests still to send here, at most (None: unknown).
        True when the pace rose while the slot's next request waited for it:
        at a slow pace that request would otherwise wait out the old, longer
        interval (a second at 1 request/s), which makes slow start crawl.
        """
        now = self.clock()
        meter = self._meters.get(slot)
        if meter is None:
            meter = self._meters[slot] = Meter(now)
        measured = meter.tick(now)
        state = self._slots.get(slot)
        if state is None or state.pace is None:
            return False
        share = self.share(slot)
        measured *= share
        before, restarting = state.pace.rate, not state.pace.starting
        after = state.pace.succeeded(measured, now, left if left is None or share == 1.0 else _times(left, share))
        state.last_seen = now
        if not state.pace.starting or state.pace.ceiling < math.inf:  # a stated quota takes no steps
            state.steps = None
        elif restarting or after != before or state.steps is None:
            # A restart takes none of an earlier slow start's steps (a fleet's adopted cut leaves them).
            state.steps = stepped(None if restarting else state.steps, now, after)
        if after > before and state.next_paced > now:
            return self._sooner(slot, state, before, after, now)
        return False

    def _sooner(self, slot: str, state: SlotState, before: float, after: float, now: float) -> bool:
        """Move the waiting release to where the new pace puts it after the last one."""
        share = self.share(slot)
        state.next_paced = max(now, state.next_paced - share / before + share / after)
        return True

    def throttled(self, slot: str, sent_at: float, beta: float = 0.7) -> float | None:
        """Cut the slot's pace once per throttle event; return the new rate.

        A throttle of a request sent before the last cut, or arriving while the
        slot still cools down from it, belongs to the event that caused that
        cut (one penalty answering every in-flight request).
        """
        now = self.clock()
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        state.last_seen = now
        meter = self._meters.get(slot)
        measured = meter.current(now) * self.share(slot) if meter is not None else 0.0
        if state.pace is None:
            state.pace = RateController(beta=beta)
        elif sent_at < state.pace.last_cut or now < state.cooldown_until:
            return None
        else:
            self._sent_pace(slot, state, sent_at)
        rate = state.pace.throttled(measured, now)
        state.steps = stepped(None, now, rate) if state.pace.starting else None
        return rate

    def _sent_pace(self, slot: str, state: SlotState, sent_at: float) -> None:
        """Cut from the pace the refused request was sent at: slow start stepped past it during the round trip."""
        pace = state.pace
        sent = sent_pace(state.steps, sent_at) if pace is not None and pace.starting and state.steps else None
        if pace is not None and sent is not None and sent[0] < pace.rate:
            pace.ran_ahead(*sent)

    def announce(self, slot: str, rate: float) -> None:
        """Pace ``slot`` at a rate its server announced (RateLimit-Policy)."""
        if not usable(rate):
            return
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        if state.pace is None:
            state.pace = RateController()
        state.pace.announced(rate)
        state.last_seen = self.clock()

    def free_quota(self, slot: str) -> bool:
        """What is left of the stated quota covers what ``slot`` wants: drop the pace it set (True if it had one)."""
        state = self._slots.get(slot)
        if state is None or state.pace is None or state.pace.ceiling == math.inf:
            return False
        state.pace = state.pace.unannounced()
        state.next_paced = min(state.next_paced, self.clock())
        return True

    def share(self, slot: str) -> float:
        """How many senders split the slot's pace: one here; a fleet board counts its processes."""
        return 1.0

    def rate(self, slot: str) -> float | None:
        state = self._slots.get(slot)
        return state.pace.rate if state is not None and state.pace is not None else None


def _times(left: Callable[[], int | None], share: float) -> Callable[[], float | None]:
    """What is left fleet-wide: each of ``share`` processes has about as much as this one."""

    def count() -> float | None:
        here = left()
        return None if here is None else here * share

    return count
