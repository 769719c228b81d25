"""The send times the fleet granted this process, per paced slot, and how many more it wants.

A paced slot shared by the fleet is sent to only at times Redis hands out
one fleet interval apart (GCRA). A process books a few refresh periods of
them ahead, so its loop never waits on Redis: this is that booking, on the
local clock. Pure: the caller passes the time.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable

__all__ = ["LEASE_AHEAD", "Leases"]

LEASE_AHEAD = 3
"""Refresh periods of paced sends a process books ahead (so it never idles between exchanges)."""
WANT_MEMORY = 1.0
"""Seconds a slot's last request for sends counts: an emptied queue stops booking."""
SAME = 0.05
"""A granted time this close before the cooldown's end is the grant at its end."""
USED = 0.001
"""A granted time this close ahead counts as the one just used."""


class Leases:
    """Granted send times and outstanding wants, per slot; pruned with the board (``forget``)."""

    def __init__(self, refresh: float) -> None:
        self.refresh = refresh
        self._granted: dict[str, collections.deque[float]] = {}
        self._want: dict[str, tuple[int, float]] = {}
        self._pace: dict[str, float] = {}
        """The pace the fleet last granted each slot's times at (its senders' slowest)."""

    def __len__(self) -> int:
        return len(self._granted) + len(self._want)

    @property
    def horizon(self) -> float:
        """How far ahead the fleet grants send times."""
        return LEASE_AHEAD * self.refresh

    def next(self, slot: str) -> float | None:
        granted = self._granted.get(slot)
        return granted[0] if granted else None

    def pace(self, slot: str) -> float | None:
        """The fleet's pace for the slot, as of the last grant; None if none came."""
        return self._pace.get(slot)

    def paced(self, slot: str, rate: float) -> None:
        self._pace[slot] = rate

    def times(self, slot: str) -> list[float]:
        return list(self._granted.get(slot, ()))

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

    def add(self, slot: str, times: list[float], not_before: float) -> float | None:
        """Keep the granted ``times`` not inside the slot's cooldown; the slot's next one."""
        granted = self._granted.setdefault(slot, collections.deque())
        # A claim that crossed this process's own throttle on the way may fall inside the cooldown;
        # the grant at the cooldown's end may read a little before it (Redis time to local time).
        granted.extend(max(t, not_before) for t in times if t >= not_before - SAME)
        if not granted:
            del self._granted[slot]
            return None
        return granted[0]

    def drop_before(self, slot: str, when: float) -> float | None:
        """A cooldown until ``when`` overtook the times before it; the slot's next one."""
        granted = self._granted.get(slot)
        while granted and granted[0] < when:
            granted.popleft()
        return self.next(slot)

    def used(self, slot: str, now: float) -> float | None:
        """A request of the slot left: drop its time, and any that went by unused; the next one."""
        return self.drop_before(slot, now + USED)

    def skip_late(self, slot: str, now: float, late: float) -> bool:
        """Drop the times this process is more than ``late`` seconds behind; True if it was."""
        granted = self._granted.get(slot)
        if not granted or granted[0] >= now:
            return False
        skipped = False
        while granted and granted[0] < now - late:
            granted.popleft()
            skipped = True
        return skipped

    def forget(self, slot: str) -> None:
        self._granted.pop(slot, None)
        self._want.pop(slot, None)
        self._pace.pop(slot, None)

    def drop(self, slot: str) -> None:
        """Redis is lost: the slot is paced on this process's share alone."""
        self._granted.pop(slot, None)
        self._pace.pop(slot, None)
