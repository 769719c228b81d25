"""Deciding a quota's budget again once the crawl can count what it wants.

While Spider.start() is still being read nobody can tell how many requests a
slot will want, so budget.py spreads its quota as if many. On a long window
that pace is slow (one request per 50 s for 60 left in 50 minutes), and the
requests it holds would wait for the next response to be decided again,
which may be that far away. The latest facts of each such slot are kept here
and decided again shortly, as the next response would have been. The thin
shell of budget.py's rule: the decision itself is the caller's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .ratelimit import RateLimitFacts
from .timers import call_later

__all__ = ["AGAIN", "QuotaRecheck"]

AGAIN = 0.25
"""Seconds between looks: reading a start request takes a turn of the event loop."""
_MOST = 1_000
"""Slots kept at most: a broad crawl starts over rather than grow."""


class QuotaRecheck:
    """Slots whose quota was spread while their demand was unknown, with the facts last read."""

    def __init__(
        self,
        decide: Callable[[str, RateLimitFacts], bool],
        clock: Callable[[], float],
        later: Callable[[float, Callable[[], object]], Any] = call_later,
        known: Callable[[], bool] = lambda: True,
    ) -> None:
        self._decide = decide
        """Decide ``slot`` again on these facts, their reset aged; True once settled (the demand was known)."""
        self._clock = clock
        self._later = later
        self._known = known
        """Whether the crawl can count its demand at all now: while not, a look decides nothing
        (a broad crawl reading a long start list keeps many slots here)."""
        self._pending: dict[str, tuple[RateLimitFacts, float]] = {}
        self._timer: Any = None

    def __len__(self) -> int:
        return len(self._pending)

    def pending(self, slot: str, facts: RateLimitFacts) -> None:
        if slot not in self._pending and len(self._pending) >= _MOST:
            self._pending.clear()
        self._pending[slot] = (facts, self._clock())
        if self._timer is None:
            self._timer = self._later(AGAIN, self._look)

    def settled(self, slot: str) -> None:
        self._pending.pop(slot, None)

    def close(self) -> None:
        self._pending.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look(self) -> None:
        self._timer = None
        now = self._clock()
        for slot, (facts, at) in list(self._pending.items()) if self._known() else ():
            reset = (facts.reset or 0.0) - (now - at)
            if reset <= 0 or self._decide(slot, dataclasses.replace(facts, reset=reset)):
                self._pending.pop(slot, None)
        if self._pending:
            self._timer = self._later(AGAIN, self._look)
