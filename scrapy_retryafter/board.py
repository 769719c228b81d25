"""The one shared state per download slot: when it may send again.

The middleware writes it (a throttle cools the slot), the queue reads it (a
cooling slot's requests stay in the scheduler) and the logs report it. It is
pure, with the clock and the random source injected, and it forgets a slot
as soon as nothing about it is left to remember, so a crawl over a million
hosts keeps only the few that are cooling.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from .breaker import CLOSED, Breaker
from .slot_state import Random, SlotState, next_release
from .slotpace import SlotPaces

__all__ = ["CooldownBoard", "Random", "SlotState", "Throttle", "next_release"]

LATE_CREDIT = 0.1
"""Share of a paced interval by which a late release may bring the next one forward."""
LAG_DRIFT = 0.0001
"""Seconds per release by which a learned pace's lag estimate may rise (see ``_lag_credit``)."""


@dataclass(frozen=True)
class Throttle:
    """What one throttle did to its slot."""

    rate_before: float | None
    rate_after: float | None
    """The pace after a cut; None when this throttle did not cut it."""
    opened: bool
    """The throttle opened the slot's circuit."""
    added: float
    """Seconds the cooldown grew by."""


class CooldownBoard(SlotPaces):
    """Per-slot cooldowns: the largest wait wins; a success never clears one.

    The pace is SlotPaces' (slotpace.py); the per-slot maps, sweeping and snapshots are
    SlotTable's (slottable.py).
    """

    hold_refused = False
    """Hold a refused slot's requests for its sweep (refusals.py): set by the extension where
    they can be parked; otherwise a refused slot's requests reach the middleware, which gives them up."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        rng: Random = random,
        pace_memory: float = 600.0,
    ) -> None:
        super().__init__(clock, pace_memory)
        self.rng = rng

    def cool(self, slot: str, seconds: float, wake_jitter: float = 0.0) -> float:
        """Hold ``slot`` for ``seconds`` from now; return how much later it now reopens."""
        now = self.clock()
        until = now + max(0.0, seconds)
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        if until <= state.cooldown_until:
            return 0.0
        added = until - max(state.cooldown_until, now)
        state.cooldown_until = until
        if state.pace is not None:
            state.pace.paused(until, now)
        # A paced slot releases one request per interval: no herd to spread.
        state.wake_end = until + (0.0 if state.pace is not None else max(0.0, wake_jitter))
        state.wake_left = -1
        return added

    def throttle(
        self,
        slot: str,
        sent_at: float,
        cooldown: float,
        *,
        learn: bool,
        wake_jitter: float,
        circuit_threshold: int,
        circuit_open_seconds: float,
        refuse: float = 0.0,
    ) -> Throttle:
        """A throttle happened: cut the pace (``learn``), count it for the breaker, then cool.

        In that order: both ask whether the throttle came in during a cooldown
        (then it belongs to the event that caused it), which cooling first
        would make every throttle seem to.
        """
        self.quota_windows.throttled(slot, sent_at)  # the learnt window of its quota may be too short
        before = self.rate(slot)
        after = self.throttled(slot, sent_at) if learn else None
        opened = self.breaker_throttled(slot, sent_at, circuit_threshold, circuit_open_seconds)
        added = self.cool(slot, cooldown, wake_jitter)
        if refuse:
            self.refuse(slot, refuse)
        return Throttle(before, after, opened, added)

    def refuse(self, slot: str, seconds: float) -> None:
        """Give up the slot's requests unsent for ``seconds`` (over-cap Retry-After)."""
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        state.refuse_until = max(state.refuse_until, self.clock() + seconds)

    def refused(self, slot: str) -> float:
        """Seconds the slot is still refused for (0.0: not refused)."""
        state = self._slots.get(slot)
        if state is None:
            return 0.0
        return max(0.0, state.refuse_until - self.clock())

    def remaining(self, slot: str) -> float:
        """Seconds until the slot's cooldown ends (wake jitter not included)."""
        state = self._slots.get(slot)
        if state is None:
            return 0.0
        return max(0.0, state.cooldown_until - self.clock())

    def ready_at(self, slot: str, held: int = 1) -> float:
        """When the slot's next request may leave; 0.0 when it may leave now.

        ``held`` is how many requests wait for the slot: the first call after
        the cooldown ends spreads that many releases over the wake window.
        """
        state = self._slots.get(slot)
        if state is None:
            return 0.0
        now = self.clock()
        if state.refuse_until > now and self.hold_refused:
            return state.refuse_until  # refused: its queued requests are parked, never released
        if self.pauses:
            paused_until = self.pauses.ready_at(slot, now)
            if paused_until > now:
                return paused_until
        if state.breaker is not None and state.breaker.state != CLOSED:
            held_until = state.breaker.ready_at(now)
            if held_until > now:
                return held_until
        if now < state.cooldown_until:
            return max(state.cooldown_until, state.next_paced)
        paced = state.next_paced if state.next_paced > now else 0.0
        if now >= state.wake_end or state.wake_left == 0:
            if not paced:
                self._forget_if_done(slot, state, now)
            return paced
        if state.wake_left < 0:
            state.wake_left = max(1, held)
            state.next_release = next_release(
                state.cooldown_until, state.wake_end, state.wake_left, self.rng.random()
            )
        woken = state.next_release if state.next_release > now else 0.0
        return max(woken, paced)

    def released(self, slot: str) -> float | None:
        """Record that one held request of ``slot`` left during its wake window; return its
        probe mark when it is its paused host's probe (hostpause.PROBE)."""
        state = self._slots.get(slot)
        if state is None:
            return None
        now = self.clock()
        state.last_seen = now
        mark = self.pauses.released(slot, now) if self.pauses else None
        if state.breaker is not None:
            state.breaker.released(now)
        if state.pace is not None:
            interval = self.share(slot) / state.pace.rate
            late = now - state.next_paced
            if state.pace.ceiling < math.inf:
                # A stated quota counts requests per window, not gaps: the
                # engine's lateness (timer, loop) may be made up, capped so
                # that no run of releases ever bunches by more than the cap.
                credit = min(max(late, 0.0), LATE_CREDIT * interval)
            else:
                credit = _lag_credit(state, late, interval)
            state.next_paced = now + interval - credit
        if state.wake_left <= 0:
            return mark
        state.wake_left -= 1
        if state.wake_left:
            state.next_release = next_release(
                max(state.next_release, state.cooldown_until),
                state.wake_end,
                state.wake_left,
                self.rng.random(),
            )
        return mark

    def breaker_throttled(self, slot: str, sent_at: float, threshold: int, open_seconds: float) -> bool:
        """Count a throttle for the slot's breaker (call before cooling); True if it opened."""
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        if state.breaker is None:
            state.breaker = Breaker()
        # Sent after the last cooldown ended: the slot was open to traffic, so it counts.
        counts = sent_at >= state.cooldown_until
        now = state.last_seen = self.clock()
        return state.breaker.throttled(now, counts, threshold, open_seconds)

    def spend_blind_retry(self, slot: str, max_tokens: float) -> bool:
        """A retry the server gave no time for costs a token; False when the budget is spent.

        Retries stop while the bucket is at most half full, so an outage does
        not multiply the load on a host that is already failing.
        """
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        tokens = max_tokens if state.tokens < 0 else state.tokens
        state.tokens = max(0.0, tokens - 1.0)
        state.last_seen = self.clock()
        return state.tokens > max_tokens / 2

    def success(self, slot: str, token_ratio: float, max_tokens: float) -> bool:
        """A response that was not a throttle; True if it closed an open circuit."""
        state = self._slots.get(slot)
        if state is None:
            return False
        if 0 <= state.tokens < max_tokens:
            state.tokens = min(max_tokens, state.tokens + token_ratio)
        return state.breaker is not None and state.breaker.succeeded()

    def breaker_state(self, slot: str) -> str:
        state = self._slots.get(slot)
        return state.breaker.state if state is not None and state.breaker is not None else CLOSED


def _lag_credit(state: SlotState, late: float, interval: float) -> float:
    """What of a learned pace's lateness the next release may make up.

    A limiter without burst refuses one short gap, so only the lag every
    release pays (the wake timer's margin, the engine's loop: 2-3 ms, 4 % at
    20 requests/s) is made up: its lower envelope, which rises by LAG_DRIFT per
    release and falls to any smaller lag at once. A gap comes short of the
    interval only where the lag shrinks (after the first release, or when a
    release is on time after late ones), by at most the credit it had, a
    tenth of the interval; no run of releases outpaces the pace by more.
    """
    if not 0.0 <= late < interval:  # the first release, a slot that sat idle, NaN
        return 0.0
    lag = late if state.lag < 0.0 else min(late, state.lag + LAG_DRIFT)
    state.lag = lag
    return min(lag, LATE_CREDIT * interval)
