"""The send times the fleet granted this process, per paced slot, and how many more it wants.

A paced slot shared by the fleet is sent to only at times Redis hands out
one fleet interval apart (GCRA). A process books a few refresh periods of
them ahead, so its loop never waits on Redis: this is that booking, on the
local clock. Pure: the caller passes the time.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable

__all__ = ["LEASE_AHEAD", "Leases", "ServerClock"]

LEASE_AHEAD = 3
"""Refresh periods of paced sends a process books ahead (so it never idles between exchanges)."""
WANT_MEMORY = 1.0
"""Seconds a slot's last request for sends counts: an emptied queue stops booking."""
SAME = 0.05
"""A granted time this close before the cooldown's end is the grant at its end."""
USED = 0.001
"""A granted time this close ahead counts as the one just used."""
DRIFT = 1e-4
"""Seconds per second the server's clock may drift from the local one (100 ppm: far more than clocks do)."""
SENDING_GAP = 1.0
"""Seconds between two sends beyond which the slot paused (a cooldown): that gap says nothing of the pace."""
SENT_WEIGHT = 0.3
"""Weight of each interval between two sends in the usual one (an EWMA)."""
LATE_WEIGHT = 0.2
"""Weight of each due time's lateness in the process's usual lateness (an EWMA)."""
SPENT = 8
"""Sends per slot whose granted spacing is kept, to tell the pace a throttled one was sent at."""


class Leases:
    """Granted send times and outstanding wants, per slot; pruned with the board (``forget``)."""

    def __init__(self, refresh: float) -> None:
        self.refresh = refresh
        self._granted: dict[str, collections.deque[tuple[float, float, bool]]] = {}
        """Granted send times, each with the fleet pace it was spaced at (0.0: not told) and whether that is
        unknown: a claim's first time whose gap after the fleet's time before it was not told."""
        self._spent: dict[str, collections.deque[tuple[float, float, bool]]] = {}
        """The same, for the granted times this process last used, each at when it was used."""
        self._want: dict[str, tuple[int, float]] = {}
        self._pace: dict[str, float] = {}
        """The pace the fleet last granted each slot's times at (its senders' slowest)."""
        self._sent: dict[str, tuple[float, float]] = {}
        """When this process last sent to each slot, and its usual interval (an EWMA over sends under a second apart)."""
        self._skipped: set[str] = set()
        """Slots whose last due time was skipped: their next one is sent however late."""
        self.usual_late = 0.0
        """How late this process's loop usually takes a due time (its wake's pad, timers, load)."""

    def __len__(self) -> int:
        return len(self._granted) + len(self._want)

    @property
    def horizon(self) -> float:
        """How far ahead the fleet grants send times."""
        return LEASE_AHEAD * self.refresh

    def next(self, slot: str) -> float | None:
        granted = self._granted.get(slot)
        return granted[0][0] if granted else None

    def pace(self, slot: str) -> float | None:
        """The fleet's pace for the slot, as of the last grant; None if none came."""
        return self._pace.get(slot)

    def paced(self, slot: str, rate: float) -> None:
        self._pace[slot] = rate

    def times(self, slot: str) -> list[float]:
        return [t for t, _, _ in self._granted.get(slot, ())]

    def want(self, slot: str, held: int, now: float) -> None:
        """``held`` requests wait for the slot: book send times for them."""
        self._want[slot] = (held, now)

    def claims(
        self, paced: Callable[[str], tuple[float, float, float] | None], now: float
    ) -> list[tuple[str, int, float]]:
        """(slot, how many, rate) for each paced slot that will run out of granted sends.

        ``paced(slot)``: its (rate, share of the fleet, end of its cooldown), None if not paced.
        """
        claims: list[tuple[str, int, float]] = []
        for slot, (held, asked) in list(self._want.items()):
            pace = paced(slot)
            if pace is None or (now - asked > WANT_MEMORY and now >= pace[2]):
                del self._want[slot]
                continue
            rate, share, _ = pace
            ahead = max(1, math.ceil(rate / share * self.horizon))
            want = min(held, ahead) - len(self._granted.get(slot, ()))
            if want > 0:
                claims.append((slot, want, rate))
        return claims

    def add(self, slot: str, times: list[float], not_before: float, rate: float = 0.0,
            gap: float | None = None) -> float | None:
        """Keep the granted ``times`` (spaced at the fleet's ``rate``, the first ``gap`` seconds after the
        fleet's time before it) not inside the slot's cooldown; the slot's next one."""
        granted = self._granted.setdefault(slot, collections.deque())
        # A claim that crossed this process's own throttle on the way may fall inside the cooldown;
        # the grant at the cooldown's end may read a little before it (Redis time to local time).
        first = 1.0 / gap if gap else 0.0
        granted.extend(
            (max(t, not_before), first if k == 0 and first else rate, k == 0 and not first)
            for k, t in enumerate(times) if t >= not_before - SAME
        )
        if not granted:
            del self._granted[slot]
            return None
        if any(later[0] < earlier[0] for earlier, later in itertools.pairwise(granted)):
            self._granted[slot] = granted = collections.deque(sorted(granted))  # a time between ones held
        return granted[0][0]

    def drop_before(self, slot: str, when: float) -> float | None:
        """A cooldown until ``when`` overtook the times before it; the slot's next one."""
        granted = self._granted.get(slot)
        while granted and granted[0][0] < when:
            granted.popleft()
        return self.next(slot)

    def used(self, slot: str, now: float) -> float | None:
        """A request of the slot left: drop its time, and any that went by unused; the next one."""
        self._skipped.discard(slot)
        last, interval = self._sent.get(slot, (-math.inf, 0.0))
        gap = now - last
        if gap <= SENDING_GAP:
            interval = gap if not interval else interval + SENT_WEIGHT * (gap - interval)
        self._sent[slot] = (now, interval)
        granted = self._granted.get(slot)
        spent = None
        while granted and granted[0][0] < now + USED:
            spent = granted.popleft()
        # A send on no grant is kept too, so that a throttle of it is blamed on no grant's pace.
        entry = (now, spent[1], spent[2]) if spent is not None else (now, 0.0, False)
        self._spent.setdefault(slot, collections.deque(maxlen=SPENT)).append(entry)
        return self.next(slot)

    def spaced(self, slot: str, sent_at: float) -> tuple[float, float] | None:
        """The fleet pace the send at ``sent_at`` went at (what a throttle refused), and the last slower one
        of the sends before it (else 0.0: what the limiter let through); None when that send used no grant.

        The times of one claim are spaced at its pace, its first one by the gap Redis told after
        the fleet's time before it. Without that gap, the first one's pace is taken as this
        process's claim before: in a fleet of eight with a time per claim, that claim was eight
        sends back and at half the pace, and slow start refused at 11/s was cut from 5.6.
        """
        spent = [entry for entry in self._spent.get(slot, ()) if entry[0] <= sent_at + USED]
        if not spent or sent_at - spent[-1][0] > SENDING_GAP:
            return None
        paces = [rate if not first or k == 0 else spent[k - 1][1] for k, (_, rate, first) in enumerate(spent)]
        refused = paces[-1]
        if not 0.0 < refused < math.inf:
            return None
        passed = next((pace for pace in reversed(paces[:-1]) if 0.0 < pace < refused), 0.0)
        return refused, passed

    def skip_late(self, slot: str, now: float, margin: float, interval: float) -> bool:
        """Drop the due times this process is too late for; True if it was.

        Too late is ``margin`` seconds past the lateness this process's loop
        usually has: the next fleet time (maybe another process's) is taken
        about as late, so only the excess brings two sends closer than the
        limiter allows. Every loop is late by something (a wake is padded by a
        millisecond, timers and load add more), and at 50 requests/s the margin
        is under a millisecond: judged by the margin alone, every due time was
        late, every one was skipped, and the slot never sent again. Nor is a
        slot skipped twice in a row: the next due time is sent however late.
        """
        granted = self._granted.get(slot)
        if not granted or granted[0][0] >= now:
            return False
        late = now - granted[0][0]
        usual = self.usual_late
        self.usual_late += LATE_WEIGHT * (min(late, interval) - usual)
        if slot in self._skipped or late <= usual + margin:
            return False
        while granted and granted[0][0] < now - usual - margin:
            granted.popleft()
        self._skipped.add(slot)
        return True

    def sending(self, slot: str) -> float | None:
        """The rate this process has been sending to the slot at (its share of the fleet's); None if unknown."""
        interval = self._sent.get(slot, (0.0, 0.0))[1]
        return 1.0 / interval if interval > 0.0 else None

    def forget(self, slot: str) -> None:
        self._sent.pop(slot, None)
        self._spent.pop(slot, None)
        self._skipped.discard(slot)
        self._granted.pop(slot, None)
        self._want.pop(slot, None)
        self._pace.pop(slot, None)

    def drop(self, slot: str) -> None:
        """Redis is lost: the slot is paced on this process's share alone."""
        self._sent.pop(slot, None)
        self._spent.pop(slot, None)
        self._skipped.discard(slot)
        self._granted.pop(slot, None)
        self._pace.pop(slot, None)


class ServerClock:
    """The local time of an instant on Redis's clock, from the exchanges' round trips.

    A grant is a time on Redis's clock; read as "seconds after the reply
    came back", it is late by the reply's way back, which a loaded machine
    makes vary by milliseconds from one exchange to the next (the worker
    thread waits for the interpreter): two processes' times, one fleet
    interval apart on Redis, came closer here than a limiter with no burst
    allows. The offset between the clocks lies between ``server - got`` and
    ``server - sent`` for every exchange; the highest lower bound seen (eased
    by DRIFT) is the tightest. An answer outside this exchange's bounds (a
    clock stepped, a hostile value) falls back to them: the local time is
    always within the exchange's round trip.
    """

    def __init__(self) -> None:
        self._offset: float | None = None
        self._at = 0.0

    def local(self, server: float, sent: float, got: float) -> float:
        """The local time of the reply's ``server`` instant, for an exchange that left at ``sent`` and came back at ``got``."""
        if not math.isfinite(server) or not sent <= got:
            return got
        low, high = server - got, server - sent
        offset = self._offset
        if offset is None or not low <= offset <= high:
            offset = low
        else:
            offset = max(low, offset - DRIFT * max(0.0, got - self._at))
        self._offset, self._at = offset, got
        return min(got, max(sent, server - offset))  # within the round trip, rounding included
