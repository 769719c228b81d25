"""When to try a lost Redis again: one schedule for the board, the frontier and the dupefilter.

A lost connection is tried again after a jittered, doubling wait (0.25 s up
to 5 s), never on every call: a crawl that touches Redis on each request
would otherwise pay a connection attempt per request for the whole outage.
The caller reports each attempt's outcome and is told when the connection
was just lost or just came back, so each is logged once.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..board import Random

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "Outage"]

BACKOFF_MIN = 0.25
BACKOFF_MAX = 5.0


class Outage:
    """The state of one connection: up, or lost since ``since`` and tried again at ``retry_at``."""

    def __init__(self, clock: Callable[[], float], rng: Random = random) -> None:
        self.clock = clock
        self.rng = rng
        self.lost = False
        self.since = 0.0
        self.retry_at = 0.0
        self._backoff = 0.0

    def may_try(self) -> bool:
        """Up, or lost and its next attempt is due."""
        return not self.lost or self.clock() >= self.retry_at

    def failed(self) -> bool:
        """An attempt failed: wait longer before the next one. True if it was up until now."""
        newly = not self.lost
        if newly:
            self.lost = True
            self.since = self.clock()
        self._backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, self._backoff * 2))
        self.retry_at = self.clock() + self._backoff * (0.5 + self.rng.random() / 2)
        return newly

    def succeeded(self) -> float | None:
        """An attempt went through: seconds it had been lost, or None if it was up."""
        if not self.lost:
            return None
        self.lost = False
        self._backoff = 0.0
        return self.clock() - self.since
