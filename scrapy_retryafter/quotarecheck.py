"""The quota as a budget in the crawl (budget.py's rule), and deciding it again once the crawl can count.

While Spider.start() is still being read nobody can tell how many requests a
slot will want, so budget.py spreads its quota as if many. On a long window
that pace is slow (one request per 50 s for 60 left in 50 minutes), and the
requests it holds would wait for the next response to be decided again,
which may be that far away. The latest facts of each such slot are kept here
and decided again shortly, as the next response would have been. The thin
shell of budget.py's rule: the decisions are quota.py's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals

from . import scrapy_compat
from .quota import QuotaDecision, budget_covers, budget_quota
from .ratelimit import RateLimitFacts
from .timers import call_later

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from .extension import RetryAfterExtension

__all__ = ["AGAIN", "QuotaBudget", "QuotaRecheck"]

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


class QuotaBudget:
    """What the middleware asks of a slot's rate-limit facts: budget_quota with the slot's demand counted."""

    def __init__(self, crawler: Crawler, extension: RetryAfterExtension, on_the_wire: Callable[[str], int]) -> None:
        self.crawler = crawler
        self.extension = extension
        self._on_the_wire = on_the_wire
        self.recheck = QuotaRecheck(self._again, time.monotonic, known=lambda: not scrapy_compat.start_pending(crawler))
        crawler.signals.connect(self.recheck.close, signal=signals.spider_closed)

    def decide(
        self,
        slot: str,
        facts: RateLimitFacts,
        window: float | None,
        max_delay: float,
        *,
        moving: bool = False,
        ends_in: float | None = None,
    ) -> QuotaDecision:
        """The decision for these facts; a covered quota's pace is dropped here (``free``)."""
        wanted = self.wanted(slot)
        decision = budget_quota(
            facts, window, self._on_the_wire(slot), max_delay, wanted=wanted, moving=moving, ends_in=ends_in
        )
        if wanted is None and not decision.free and self.extension.queue_counts_slots:
            self.recheck.pending(slot, facts)
        else:
            self.recheck.settled(slot)
        if decision.free:
            self.free(slot)
        return decision

    def wanted(self, slot: str) -> int | None:
        """Requests of ``slot`` still to send, None while more may come uncounted."""
        if not self.extension.queue_counts_slots:
            return None
        return self.extension.left_at_most(slot)

    def free(self, slot: str) -> None:
        if self.extension.board.free_quota(slot):
            self.extension.stats.inc_value("retry_after/quota_budget_freed")
            self.extension.sooner(slot)
            self.extension.nudge_engine()

    def _again(self, slot: str, facts: RateLimitFacts) -> bool:
        """A quota spread while the demand was unknown, decided again: True once settled."""
        wanted = self.wanted(slot)
        if wanted is None:
            return True  # the start is read, so the demand cannot be counted at all (no cooldown-aware queue)
        if budget_covers(facts, self._on_the_wire(slot), wanted):
            self.free(slot)
        return True
