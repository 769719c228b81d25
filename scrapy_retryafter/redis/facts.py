"""The fleet's facts folded into one process's board: what becomes of each value read from Redis.

A cooldown, a circuit, a rate, a granted send time, a probe or a first
contact: each is bounded by this process's own rules before the board takes
it (a cooldown over the slot's cap is a refusal here, a circuit is held open
no longer than the slot's open time). rules.py adds what the board tells the
fleet; board.py carries both over the wire.
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
from ..breaker import CLOSED, Breaker
from ..policy import SlotPolicy
from ..rate import RateController
from .contact import FirstContact
from .exchange import Reply, Writes
from .leases import Leases, ServerClock

__all__ = ["FleetFacts"]

_SAME = 0.05
"""A remote time this close to the local one is our own write coming back."""
REFUSE_AT_MOST = 7 * 86400.0
PROBE_WAIT = 180.0
"""How long a half-open circuit waits for its probe (Breaker.released): a remote hold may last that long."""
FIRST_BURST = 0.5
"""Seconds after this process's first cut in which a cut from the fleet answers the same first burst."""
MET_MEMORY = 100_000
"""Slots met remembered, so each is asked about once (unless forgotten since)."""
_DEFAULT_POLICY = SlotPolicy()


class FleetFacts(CooldownBoard):
    """A CooldownBoard that takes the fleet's facts in; the state it keeps per slot beside the board."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        rng: Random = random,
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
        self.server_clock = ServerClock()
        self.grant_wait = grant_wait
        """How long a paced slot waits for a grant the fleet owes it before sending alone (by then the board is lost)."""
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
        self._grown: dict[str, float] = {}
        """The highest pace the fleet grew a slot to since its last cut: this process's pace is no lower."""
        self._asks: dict[str, None] = {}
        """Slots this process just met, to ask the fleet's rate of in the next exchange."""
        self._met: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._elsewhere: dict[str, tuple[float, float]] = {}
        """Cooldowns and open circuits (local times until) of slots not met here: applied at meeting, dropped at their end."""
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

    def _holds(self, slot: str) -> bool:
        """``slot in board`` (rules.py asks the fleet about the slots it meets)."""
        return slot in self._slots

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
            if self.contact.granted(slot, count, now):
                self.on_sooner(slot)
                self.on_wake(now)
        if reply.snapshot:
            for slot in [slot for slot in self._slots if slot not in reply.circuits]:
                self._remote_close(slot, sent)
        for slot, rate, cut, who in reply.rates:
            if who != self.process_id and slot in self._slots:
                self._adopt_rate(slot, rate, now, cut, live=True, plateau=reply.plateaus.get(slot))
            elif who != self.process_id:
                self.contact.paced_elsewhere(slot)
        for slot, rate, cut, _who in reply.asked:
            state = self._slots.get(slot)
            if state is None or state.pace is None:
                self._adopt_rate(slot, rate, now, cut, plateau=reply.plateaus.get(slot))
        for slot, count in reply.counts.items():
            if slot in self._active:
                self._shares[slot] = count
        for slot, pace in reply.paces.items():
            if slot in self._slots:
                self.leases.paced(slot, pace)
        replied = self.server_clock.local(reply.server_now, sent, got)
        for slot, offsets in reply.grants.items():
            self._granted(slot, [replied + offset for offset in offsets], reply.paces.get(slot, 0.0),
                          reply.gaps.get(slot))

    def _granted(self, slot: str, times: list[float], rate: float = 0.0, gap: float | None = None) -> None:
        state = self._slots.get(slot)
        if state is None or state.pace is None or not times:
            return
        first = self.leases.add(slot, times, state.cooldown_until, rate, gap)
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

    def _adopt_rate(self, slot: str, rate: float, now: float, cut: bool, live: bool = False,
                    plateau: tuple[float, bool, float] | None = None) -> None:
        """Follow the fleet's pace: a cut is adopted with its cutter's ``plateau``, growth is taken as is.

        Every process grows the one fleet rate from its own successes, as one crawler would from
        all of them: a growth elsewhere raises the pace here, and it stays at least that high
        until the next cut (its own curve, fed by a share of the successes, lags the fleet's). A
        growth read while the slot cools was sent before its writer heard of the cut (a throttle
        cools the fleet at once): taken, it would undo the cut, and the fleet's next send would be
        refused again right after the cooldown.
        """
        state = self._state(slot)
        if not cut and state.pace is not None and state.cooldown_until > now:
            return  # grown before its writer heard of the cut that cools the slot: stale
        fresh = state.pace is None
        if state.pace is None:
            state.pace = RateController()
        pace = state.pace
        if cut:
            self._grown.pop(slot, None)
        elif not fresh:
            if rate <= pace.rate:
                return  # the fleet grows the one pace: a slower sender's is not a step back here
            self._grown[slot] = rate
        # Both this process and another were refused by the fleet's first burst (one event): their
        # cuts are two first guesses, not a pace slow start reached, so slow start goes on here.
        same_start = live and not fresh and pace.starting and now - pace.last_cut < FIRST_BURST
        if cut and not (fresh and live) and not same_start:
            pace.adopted(rate, now, plateau)
        elif cut and same_start:
            pace.rate = max(pace.min_rate, min(rate, pace.rate))
        else:
            # The fleet's first cut, heard as it happens: slow start from it, as the process that
            # cut does after its first throttle (a cubic from that first guess would hold the fleet,
            # paced at its senders' slowest, near it for tens of seconds). Growth is taken as is.
            pace.rate = max(pace.min_rate, rate)
            if cut:
                pace.last_cut = now  # the first burst's other cuts, and refusals of it here, are this event
        if fresh and not self.lost and self.leases.next(slot) is None:
            _await_grant(state, now, self.grant_wait)
        self._published[slot] = pace.rate
        state.last_seen = now

    def _state(self, slot: str) -> SlotState:
        return self._slots.setdefault(slot, SlotState())

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


def _await_grant(state: SlotState, now: float, wait: float) -> None:
    """A slot paced from now on sends at granted times only. Left unset, its first send went at once:
    seven of eight processes, held until the fleet's first response, sent together at the end of its
    cooldown, were refused, and each cut the fleet's pace by beta once more."""
    state.next_paced = max(state.next_paced, max(now, state.cooldown_until) + wait)
