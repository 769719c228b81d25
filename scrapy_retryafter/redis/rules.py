"""The fleet's rules: how a process folds the fleet's facts into its board, and what it tells the fleet.

Each process keeps its own CooldownBoard and decides from it alone, so no
request ever waits on a network round trip. These rules say what becomes of
a fact read from Redis (a cooldown, a circuit, a rate, a granted send time)
and which of the board's events are the fleet's business. They know no
Redis: RedisBoard (board.py) carries the events and the replies, and the
tests drive these rules with replies they write themselves.

Nothing read from the fleet is obeyed beyond this process's own rules: a
cooldown longer than the slot's cap is a refusal here, as an over-cap
Retry-After would be, and a circuit is held open no longer than the slot's
open time. The learned rate is a budget for the whole fleet: a cut is
published, every process adopts it, and each paces at send times Redis
grants one fleet interval apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..board import SlotState, Throttle
from ..breaker import HALF_OPEN
from ..rate import MARGIN, STEADY_SCALE, RateController
from .facts import MET_MEMORY, FleetFacts
from .ratewire import rate_value
from .script import MAX_RATE

__all__ = ["FleetRules"]


class FleetRules(FleetFacts):
    """The fleet's facts (facts.py), and the board's events marked for the fleet."""

    batching = False
    """A throttle's events are being written: one exchange carries them all, after the last."""
    batched = False
    """News came while batching: exchange once the batch is written."""

    def forgot(self, slot: str) -> None:
        """Nothing kept per slot beside the board outlives it."""
        for kept in (self._active, self._shares, self._opened_at, self._published, self._grown, self._met,
                     self._probes):
            kept.pop(slot, None)
        self._probe_won.discard(slot)
        self.leases.forget(slot)

    def __contains__(self, slot: str) -> bool:
        return self._holds(slot)

    def holds_none(self) -> bool:
        return False  # a slot met for the first time is asked about (``_holds``)

    def _holds(self, slot: str) -> bool:
        """``slot in board``; a slot met for the first time is asked about: the fleet may know its pace.

        Only the slots met are asked about, so a Redis holding the rates of a
        hundred thousand hosts costs this process the few it crawls.
        """
        if slot in self._slots:
            return True
        if not self.lost and self._contact_holds(slot):
            self._slots[slot] = SlotState()  # dropped by the board meanwhile: still held
            return True
        if slot not in self._met:
            self._met[slot] = None
            if len(self._met) > MET_MEMORY:
                self._met.popitem(last=False)
            self._asks[slot] = None
            elsewhere = self._elsewhere.pop(slot, None)
            if elsewhere is not None:
                now = self.clock()
                if elsewhere[0] > now:
                    self._remote_cooldown(slot, elsewhere[0] - now)
                self._remote_circuit(slot, elsewhere[1], now)
                return slot in self._slots
            if not self.lost and self.contact.meet(slot, self.clock()):
                self._slots[slot] = SlotState()  # held until the fleet grants first-contact sends
                self._news()
                return True
        return False

    def sweep(self) -> int:
        """The board's sweep; the fleet's cooldowns and circuits that ended are dropped too."""
        now = self.clock()
        for slot in [slot for slot, (cool, circuit) in self._elsewhere.items() if max(cool, circuit) <= now]:
            del self._elsewhere[slot]
        self._seen(self.contact.sweep(now))
        return super().sweep()

    # -- the board's events, published ---------------------------------------

    def throttle(self, slot: str, sent_at: float, cooldown: float, **how: Any) -> Throttle:
        """The board's throttle, told the fleet in one exchange: the cut, the circuit and the cooldown.

        Sent one by one, the first exchange told the fleet it had heard from
        the host and of the cut, but not of the cooldown: another process
        opened to the host in between sent into it.
        """
        self.batching = True
        try:
            return super().throttle(slot, sent_at, cooldown, **how)
        finally:
            self.batching = False
            if self.batched:
                self.batched = False
                self._news()

    def cool(self, slot: str, seconds: float, wake_jitter: float = 0.0) -> float:
        added = super().cool(slot, seconds, wake_jitter)
        if added:
            self._pace_after_cooldown(slot)
            self._write("cool", slot, self._slots[slot].cooldown_until - self.clock())
            self._news()
        return added

    def breaker_throttled(self, slot: str, sent_at: float, threshold: int, open_seconds: float) -> bool:
        self._heard_from(slot, throttle=True)
        opened = super().breaker_throttled(slot, sent_at, threshold, open_seconds)
        if opened:
            self._opened_at[slot] = self.clock()
            self._write("open", slot, open_seconds)
            self._news()
        return opened

    def _contact_holds(self, slot: str) -> bool:
        """First contact holds the slot; a success that waited its time opens it and tells the fleet."""
        now = self.clock()
        if self.contact.settled(slot, now):
            self._seen([slot])
        return self.contact.holds(slot, now)

    def reached(self, slot: str) -> float | None:
        """A request reached the downloader: counted if first contact holds its slot (the mark for ``left``)."""
        return self.contact.reached(slot)

    def left(self, slot: str, mark: float) -> None:
        """A request ``reached`` counted left the downloader, answered or failed: the last one a
        success waited for opens the slot, here and in the fleet."""
        now = self.clock()
        if self.contact.left(slot, mark, now):
            self._seen([slot])
            self.on_sooner(slot)
            self.on_wake(now)

    def _seen(self, slots: list[str]) -> None:
        for slot in slots:
            self._write("seen", slot, "1")
        if slots:
            self._news()

    def success(self, slot: str, token_ratio: float, max_tokens: float) -> bool:
        self._heard_from(slot)  # also where the slot's policy does not adapt its pace (no ``succeeded``)
        closed = super().success(slot, token_ratio, max_tokens)
        if closed:
            self._opened_at.pop(slot, None)
            self._write("close", slot, "0")
            self._news()
        return closed

    def released(self, slot: str) -> float | None:
        state = self._slots.get(slot)
        probing = state is not None and state.breaker is not None and state.breaker.probing
        mark = super().released(slot)
        now = self.clock()
        self._active[slot] = now
        self.contact.sent(slot)
        if state is not None and state.pace is not None:
            if self.lost:
                self.leases.drop(slot)  # paced on this process's share alone
            else:
                self._next_granted(slot, state, self.leases.used(slot, now), now)
        if state is not None and state.breaker is not None and state.breaker.probing and not probing:
            # This process sends the probe: the rest of the fleet holds meanwhile.
            self._probe_won.discard(slot)
            self._probes.pop(slot, None)
            self._opened_at[slot] = now
            self._write("open", slot, state.breaker.opened_until - now)
            self._news()
        return mark

    def ready_at(self, slot: str, held: int = 1) -> float:
        state = self._slots.get(slot)
        if not self.lost and self._contact_holds(slot):
            self._active[slot] = now = self.clock()
            if state is None:
                self._slots[slot] = SlotState()
            # a first contact the fleet has not granted, or a success waiting for the other sends
            return min(now + self.leases.horizon, self.contact.opens_at(slot))
        if state is not None:
            now = self.clock()
            self._active[slot] = now
            if state.pace is not None:
                self.leases.want(slot, held, now)
                self._skip_late_leases(slot, state, now)
        when = super().ready_at(slot, held)
        if state is None or state.breaker is None or self.lost or when > self.clock():
            return when
        breaker = state.breaker
        if breaker.state == HALF_OPEN and not breaker.probing and slot not in self._probe_won:
            # The fleet sends one probe: this process only once Redis gave it the claim.
            now = self.clock()
            if slot not in self._probes:
                self._probes[slot] = now
                self._news()
            return now + self.leases.horizon
        return when

    def _skip_late_leases(self, slot: str, state: SlotState, now: float) -> None:
        """Give up granted send times this process is too late for (its loop stalled).

        The fleet's times are one fleet interval apart: a send later than the
        pace's margin under the limit, beyond the lateness every process's loop
        has, comes too close to the next process's, which a limiter with no
        burst answers with a 429 and a cooldown for the whole fleet. Skipping
        costs one interval, and never two in a row (Leases.skip_late).
        """
        if self.lost or state.pace is None:
            return
        # The times are spaced at the fleet's pace, which may be slower than this process's own.
        pace = min(state.pace.rate, self.leases.pace(slot) or state.pace.rate)
        if self.leases.skip_late(slot, now, (1 - MARGIN) / pace, 1 / pace):
            self.on_late_lease(slot)
            self._next_granted(slot, state, self.leases.next(slot), now)

    def _next_granted(self, slot: str, state: SlotState, granted: float | None, now: float) -> None:
        """The slot's next send: its next granted time, or a fallback if none comes by then."""
        assert state.pace is not None
        wait = max(self.share(slot) / state.pace.rate, self.grant_wait)  # no send without the fleet's grant
        state.next_paced = granted if granted is not None else now + wait

    def _heard_from(self, slot: str, throttle: bool = False) -> None:
        """A response from the slot: if the fleet was waiting for one, it hears of it now."""
        state = self._slots.get(slot)
        paced = throttle or (state is not None and state.pace is not None)
        tell, held = self.contact.answered(slot, self.clock(), paced)
        if tell:
            self._write("seen", slot, "1")
        if held:
            self._news()

    def _sent_pace(self, slot: str, state: SlotState, sent_at: float) -> None:
        """Slow start outruns the grants: what was refused is the fleet's pace (its senders' slowest), its grant says."""
        fleet, pace = self.leases.pace(slot), state.pace
        if pace is None or not fleet or self.lost:
            return super()._sent_pace(slot, state, sent_at)
        pace.rate = min(pace.rate, fleet)
        sending = (self.leases.sending(slot) or 0.0) * self.share(slot)
        pace.ran_ahead(*(self.leases.spaced(slot, sent_at) or (sending, 0.0)))

    def throttled(self, slot: str, sent_at: float, beta: float = 0.7) -> float | None:
        self._heard_from(slot, throttle=True)
        rate = super().throttled(slot, sent_at, beta)
        self._grown.pop(slot, None)
        if rate is not None:
            self._active[slot] = self.clock()
            self._published[slot] = rate
            pace = self._slots[slot].pace  # the plateau goes too: the fleet regrows as this process does
            self._write("rate", slot, rate_value(rate, "pin" if pace and pace.scale == STEADY_SCALE else "cut", max(
                rate, min(pace.peak if pace else rate, MAX_RATE)), pace.passed if pace else 0.0))
            self._news()
        return rate

    def succeeded(self, slot: str, left: Callable[[], int | None] | None = None) -> bool:
        self._heard_from(slot)  # the middleware may have called ``success`` for it too: counted once
        before = self.rate(slot) or 0.0
        sooner = super().succeeded(slot, left)
        state = self._slots.get(slot)
        if state is not None and state.pace is not None:
            _follow_fleet(state.pace, before, None if self.lost else self.leases.pace(slot), self._grown.get(slot))
        rate = self.rate(slot)
        if rate is not None and abs(rate - self._published.get(slot, 0.0)) > 0.01 * rate:
            self._published[slot] = rate
            self._write("rate", slot, rate_value(rate, "grow"))  # sent with the next refresh
        return sooner

    def _sooner(self, slot: str, state: SlotState, before: float, after: float, now: float) -> bool:
        return False  # the fleet's send times are granted by Redis, one fleet interval apart

    def share(self, slot: str) -> float:
        return float(self._shares.get(slot, 1))


def _follow_fleet(pace: RateController, before: float, fleet: float | None, grown: float | None) -> None:
    """The pace is no lower than the fleet's growth since the last cut (``grown``), not this process's
    share of it. Slow start steps per success, but the fleet sends at its slowest claim: paces of 36-81/s were
    claimed while the fleet sent 2/s, their lone claims' grants came 30 ms apart, and each refusal cut
    from the 2/s that was sent. A step goes no further than double the fleet's grant pace, as growth
    out of slow start (RateController.succeeded); a pace adopted from the fleet's growth stays."""
    if grown is not None and pace.rate < grown:
        pace.rate = grown
    if fleet and pace.starting:
        pace.rate = min(pace.rate, max(2.0 * fleet, pace.min_rate, before, grown or 0.0))
