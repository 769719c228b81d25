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

import collections
import os
import random
import socket
import time
import uuid
from collections.abc import Callable

from ..board import CooldownBoard, Random, SlotState
from ..breaker import CLOSED, HALF_OPEN, Breaker
from ..policy import SlotPolicy
from ..rate import MARGIN, RateController
from .exchange import Reply, Writes
from .contact import FirstContact
from .leases import Leases

__all__ = ["FleetRules"]

_SAME = 0.05
"""A remote time this close to the local one is our own write coming back."""
REFUSE_AT_MOST = 7 * 86400.0
PROBE_WAIT = 180.0
"""How long a half-open circuit waits for its probe (Breaker.released): a remote hold may last that long."""
MET_MEMORY = 100_000
"""Slots met remembered, so each is asked about once (unless forgotten since)."""
_DEFAULT_POLICY = SlotPolicy()


class FleetRules(CooldownBoard):
    """A CooldownBoard that takes the fleet's facts in and marks its own events for the fleet."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        rng: Random = random,  # type: ignore[assignment]
        pace_memory: float = 600.0,
        policy: Callable[[str], SlotPolicy] = lambda slot: _DEFAULT_POLICY,
        refresh: float = 0.1,
        grant_wait: float = 1.0,
        first_contact: int = 0,
    ) -> None:
        super().__init__(clock=clock, rng=rng, pace_memory=pace_memory)
        self.policy = policy
        """The slot's local rules: what the fleet says is bounded by them (cap, circuit time, wake spread)."""
        self.process_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leases = Leases(refresh)
        self.grant_wait = grant_wait
        """How long a paced slot waits for a grant the fleet owes it before sending on its own
        (by then an exchange that does not answer has made the board lost)."""
        self._probes: dict[str, float] = {}
        """Slots whose circuit expired here, asking to send the fleet's one probe (since when)."""
        self._probe_won: set[str] = set()
        self.contact = FirstContact(first_contact)
        self._writes: Writes = {}
        """Events for the fleet, sent with the next exchange: (kind, slot) -> value."""
        self._active: dict[str, float] = {}
        self._shares: dict[str, int] = {}
        self._opened_at: dict[str, float] = {}
        self._published: dict[str, float] = {}
        """The last pace this process wrote or adopted, per slot."""
        self._asks: dict[str, None] = {}
        """Slots this process just met, to ask the fleet's rate of in the next exchange."""
        self._met: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._elsewhere: dict[str, tuple[float, float]] = {}
        """Cooldowns and open circuits (local times until) of slots this process has not met:
        applied when it meets one, dropped when they end."""
        self.holds = self._holds
        self.again = False
        """More is waiting to be read or asked: exchange again at once."""
        self.on_remote_cool: Callable[[str, float], None] = lambda slot, seconds: None
        self.on_remote_refusal: Callable[[str, float], None] = lambda slot, seconds: None
        """The fleet asked for a cooldown longer than the slot's cap here: refused instead."""
        self.on_remote_circuit: Callable[[str, bool], None] = lambda slot, opened: None
        self.on_sooner: Callable[[str], None] = lambda slot: None
        """A granted send time came before the one the slot was held for."""
        self.on_late_lease: Callable[[str], None] = lambda slot: None
        """A granted send time went by before this process could use it."""
        self.on_wake: Callable[[float], None] = lambda when: None
        """A granted send time: the queue should look again then."""
        self.on_invalid: Callable[[int], None] = lambda count: None
        """Values read from Redis that were garbage, left out."""

    @property
    def lost(self) -> bool:
        """The fleet cannot be reached: the board decides alone (RedisBoard knows)."""
        return False

    def _news(self) -> None:
        """An event the fleet should hear of now, not at the next refresh (RedisBoard sends it)."""

    def _write(self, kind: str, slot: str, value: float | str) -> None:
        key = (kind, slot)
        if kind in ("cool", "open") and key in self._writes:
            value = max(float(self._writes[key]), float(value))
        self._writes[key] = value if isinstance(value, str) else repr(float(value))
        if kind == "open":
            self._writes.pop(("close", slot), None)
        elif kind == "close":
            self._writes.pop(("open", slot), None)

    # -- the fleet's facts, folded in ----------------------------------------

    def merge(self, reply: Reply, sent: float, got: float) -> None:
        """Fold one checked reply in: ``sent``, ``got``: local times the exchange left and came back."""
        if reply.invalid:
            self.on_invalid(reply.invalid)
        if reply.more:
            self.again = True  # more changes wait: read them at once
        now = self.clock()
        slack = max(_SAME, got - sent)  # our own write read back is late by up to the round trip
        for slot, cooling in reply.cooldowns.items():
            if slot not in self._slots and slot not in self._met:
                opened = reply.circuits.get(slot)
                self._elsewhere[slot] = (got + cooling, got + opened if opened is not None else 0.0)
            elif cooling > 0:
                self._remote_cooldown(slot, got + cooling - now, slack)
        for slot, opened in reply.circuits.items():
            if slot not in self._slots and slot not in self._met:
                if slot not in reply.cooldowns and opened is not None:
                    self._elsewhere[slot] = (0.0, got + opened)
            elif opened is not None:
                self._remote_circuit(slot, got + opened, now)
            elif slot in self._slots:
                self._remote_close(slot, sent)
        for slot in reply.probes:
            self._probe_granted(slot, now)
        for slot, count in reply.first.items():
            if self.contact.granted(slot, count):
                self.on_sooner(slot)
                self.on_wake(now)
        if reply.snapshot:
            for slot in [slot for slot in self._slots if slot not in reply.circuits]:
                self._remote_close(slot, sent)
        for slot, rate, cut, who in reply.rates:
            if who != self.process_id and slot in self._slots:
                self._adopt_rate(slot, rate, now, cut)
        for slot, rate, cut, who in reply.asked:
            state = self._slots.get(slot)
            if state is None or state.pace is None:
                self._adopt_rate(slot, rate, now, cut)
        for slot, count in reply.counts.items():
            if slot in self._active:
                self._shares[slot] = count
        for slot, offsets in reply.grants.items():
            self._granted(slot, [got + offset for offset in offsets])

    def _granted(self, slot: str, times: list[float]) -> None:
        state = self._slots.get(slot)
        if state is None or state.pace is None or not times:
            return
        first = self.leases.add(slot, times, state.cooldown_until)
        if first is not None:
            sooner = first < state.next_paced
            state.next_paced = first
            if sooner:
                # The queue holds the slot until the time it last read (a fallback, or a later grant).
                self.on_sooner(slot)
            self.on_wake(first)

    def _remote_cooldown(self, slot: str, seconds: float, slack: float = _SAME) -> None:
        if seconds > self.policy(slot).max_delay:
            # Another spider's cap is not ours: refused here, as an over-cap Retry-After is.
            if self.refused(slot) < min(seconds, REFUSE_AT_MOST) - 1.0:
                self.refuse(slot, min(seconds, REFUSE_AT_MOST))
                self.on_remote_refusal(slot, seconds)
            return
        state = self._slots.get(slot)
        known = state.cooldown_until if state is not None else 0.0
        if CooldownBoard.cool(self, slot, seconds, self.policy(slot).wake_jitter):
            self._pace_after_cooldown(slot)
            if self.clock() + seconds > known + slack:  # not our own write coming back a little later
                self.on_remote_cool(slot, seconds)

    def _remote_circuit(self, slot: str, until: float, now: float) -> None:
        if until <= now:
            return  # expired: half-open
        until = min(until, now + max(self.policy(slot).circuit_open_seconds, PROBE_WAIT))
        state = self._state(slot)
        if state.breaker is None:
            state.breaker = Breaker()
        breaker = state.breaker
        if breaker.state == CLOSED or until > breaker.opened_until + _SAME:
            was_closed = breaker.force_open(until)
            self._opened_at[slot] = now
            if was_closed:
                self.on_remote_circuit(slot, True)

    def _probe_granted(self, slot: str, now: float) -> None:
        state = self._slots.get(slot)
        breaker = state.breaker if state is not None else None
        if breaker is None or breaker.state == CLOSED or breaker.probing or breaker.opened_until > now:
            return  # closed meanwhile, or another process's probe is listed now
        self._probe_won.add(slot)
        self.on_sooner(slot)
        self.on_wake(now)

    def _remote_close(self, slot: str, sent: float) -> None:
        """The fleet lists no open circuit for the slot: one open here before the exchange left closes."""
        state = self._slots[slot]
        breaker = state.breaker
        if breaker is None or breaker.state == CLOSED or breaker.opened_until <= self.clock():
            return
        if self._opened_at.get(slot, -1.0) >= sent:
            return  # opened here after the exchange left: not yet in Redis
        breaker.succeeded()  # closed by a success elsewhere
        self._opened_at.pop(slot, None)
        state.next_paced = min(state.next_paced, self.clock())
        self.on_remote_circuit(slot, False)
        self.on_sooner(slot)  # the queue held it until the circuit's time: it may send now

    def _adopt_rate(self, slot: str, rate: float, now: float, cut: bool) -> None:
        """Follow the fleet's pace: a cut restarts the cubic curve here, growth is taken as is.

        Every process grows the one fleet rate from its own successes, as one
        crawler would from all of them.
        """
        state = self._state(slot)
        if state.pace is None:
            state.pace = RateController()
        pace = state.pace
        if cut:
            pace.adopted(rate, now)
        else:
            pace.rate = max(pace.min_rate, rate)
        self._published[slot] = pace.rate
        state.last_seen = now

    def _state(self, slot: str) -> SlotState:
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        return state

    def _pace_after_cooldown(self, slot: str) -> None:
        """Drop granted sends the cooldown overtook; start the fleet's paced senders apart."""
        state = self._slots[slot]
        first = self.leases.drop_before(slot, state.cooldown_until)
        if state.pace is not None:
            if self.lost:
                spread = self.rng.random() * self.share(slot) / state.pace.rate
            else:
                spread = self.grant_wait  # the fleet's grant comes first: no send of its own
            state.next_paced = first if first is not None else state.cooldown_until + spread

    def forgot(self, slot: str) -> None:
        """Nothing kept per slot beside the board outlives it."""
        for kept in (self._active, self._shares, self._opened_at, self._published, self._met, self._probes):
            kept.pop(slot, None)
        self._probe_won.discard(slot)
        self.leases.forget(slot)

    def __contains__(self, slot: str) -> bool:
        return self._holds(slot)

    def _holds(self, slot: str) -> bool:
        """``slot in board``; a slot met for the first time is asked about: the fleet may know its pace.

        Only the slots met are asked about, so a Redis holding the rates of a
        hundred thousand hosts costs this process the few it crawls.
        """
        if slot in self._slots:
            return True
        if not self.lost and self.contact.holds(slot, self.clock()):
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
        self.contact.sweep(now)
        return super().sweep()

    # -- the board's events, published ---------------------------------------

    def cool(self, slot: str, seconds: float, wake_jitter: float = 0.0) -> float:
        added = super().cool(slot, seconds, wake_jitter)
        if added:
            self._pace_after_cooldown(slot)
            self._write("cool", slot, self._slots[slot].cooldown_until - self.clock())
            self._news()
        return added

    def breaker_throttled(self, slot: str, sent_at: float, threshold: int, open_seconds: float) -> bool:
        self._heard_from(slot)
        opened = super().breaker_throttled(slot, sent_at, threshold, open_seconds)
        if opened:
            self._opened_at[slot] = self.clock()
            self._write("open", slot, open_seconds)
            self._news()
        return opened

    def success(self, slot: str, token_ratio: float, max_tokens: float) -> bool:
        closed = super().success(slot, token_ratio, max_tokens)
        if closed:
            self._opened_at.pop(slot, None)
            self._write("close", slot, "0")
            self._news()
        return closed

    def released(self, slot: str) -> None:
        state = self._slots.get(slot)
        probing = state is not None and state.breaker is not None and state.breaker.probing
        super().released(slot)
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

    def ready_at(self, slot: str, held: int = 1) -> float:
        state = self._slots.get(slot)
        if not self.lost and self.contact.holds(slot, self.clock()):
            self._active[slot] = now = self.clock()
            if state is None:
                self._slots[slot] = SlotState()
            return now + self.leases.horizon  # a first contact the fleet has not granted
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
        pace's margin under the limit comes too close to the next process's,
        which a limiter with no burst answers with a 429 and a cooldown for
        the whole fleet. Skipping costs one interval.
        """
        if self.lost or state.pace is None:
            return
        if self.leases.skip_late(slot, now, (1 - MARGIN) / state.pace.rate):
            self.on_late_lease(slot)
            self._next_granted(slot, state, self.leases.next(slot), now)

    def _next_granted(self, slot: str, state: SlotState, granted: float | None, now: float) -> None:
        """The slot's next send: its next granted time, or a fallback if none comes by then."""
        assert state.pace is not None
        wait = max(self.share(slot) / state.pace.rate, self.grant_wait)  # no send without the fleet's grant
        state.next_paced = granted if granted is not None else now + wait

    def _heard_from(self, slot: str) -> None:
        """A response from the slot: if the fleet was waiting for one, it hears of it now."""
        if self.contact.answered(slot):
            self._write("seen", slot, "1")
            self._news()

    def throttled(self, slot: str, sent_at: float, beta: float = 0.7) -> float | None:
        self._heard_from(slot)
        rate = super().throttled(slot, sent_at, beta)
        if rate is not None:
            self._active[slot] = self.clock()
            self._published[slot] = rate
            self._write("rate", slot, f"{rate!r}:cut")
            self._news()
        return rate

    def succeeded(self, slot: str) -> bool:
        self._heard_from(slot)
        sooner = super().succeeded(slot)
        rate = self.rate(slot)
        if rate is not None and abs(rate - self._published.get(slot, 0.0)) > 0.01 * rate:
            self._published[slot] = rate
            self._write("rate", slot, f"{rate!r}:grow")  # sent with the next refresh
        return sooner

    def _sooner(self, slot: str, state: SlotState, before: float, after: float, now: float) -> bool:
        return False  # the fleet's send times are granted by Redis, one fleet interval apart

    def share(self, slot: str) -> float:
        return float(self._shares.get(slot, 1))
