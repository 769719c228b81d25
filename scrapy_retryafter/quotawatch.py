"""The rate-limit headers of every answer: the quota they state paces, cools or refuses the slot.

The rules are pure (quota.py, budget.py); this reads the headers, asks the
rules and carries the decision out on the board.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .failures import sent_at
from .quota import wants_window
from .quotarecheck import QuotaBudget
from .ratelimit import parse_ratelimit, parse_retry_after_ms, speaks_ratelimit

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from .extension import RetryAfterExtension
    from .policy import SlotPolicy
    from .slot_events import SlotEvents

__all__ = ["QuotaWatch", "announced_wait"]


def announced_wait(response: Response) -> float | None:
    """Without Retry-After, the wait the other rate-limit headers announce."""
    wait = parse_retry_after_ms(response.headers.get)
    if wait is not None:
        return wait
    facts = parse_ratelimit(response.headers.get, time.time())
    if facts is not None and not facts.invalid and facts.remaining is not None and facts.remaining < 1:
        return facts.reset
    return None


class QuotaWatch:
    """What a successful answer's quota headers ask of its slot."""

    def __init__(
        self,
        crawler: Crawler,
        extension: RetryAfterExtension,
        events: SlotEvents,
        on_the_wire: Callable[[str], int],
    ) -> None:
        self.stats = crawler.stats
        self.extension = extension
        self.board = extension.board
        self.events = events
        self._on_the_wire = on_the_wire
        self._budget = QuotaBudget(crawler, extension, on_the_wire)

    def read(self, slot: str, policy: SlotPolicy, response: Response, request: Request) -> None:
        if not speaks_ratelimit(response.headers):
            return
        facts = parse_ratelimit(response.headers.get, time.time())
        if facts is None:
            return
        if facts.invalid:
            self.stats.inc_value("retry_after/ratelimit_invalid")
            return
        reset_at = facts.reset_at
        window = None
        if reset_at is not None and wants_window(facts):
            sent = sent_at(request.meta, self.board.clock())
            window = self.board.quota_window(slot, reset_at, facts.remaining, facts.quota, sent)
        windows = self.board.quota_windows
        moving = window is not None and windows.moving(slot)
        ends_in = windows.ends_in(slot, self.board.clock()) if window is not None else None
        decision = self._budget.decide(slot, facts, window, policy.max_delay, moving=moving, ends_in=ends_in)
        if decision.free:
            return
        if decision.refuse:
            self.extension.refusals.refuse(slot, decision.refuse, "quota")
        rate = decision.rate
        if rate is not None and rate != self.board.rate(slot):
            if self.board.rate(slot) is None:
                self.stats.inc_value("retry_after/paced_slots")
            self.board.announce(slot, rate)
        if not decision.cooldown:
            return
        added = self.board.cool(slot, decision.cooldown, policy.wake_jitter)
        if added:
            self.extension.tally.cooled(slot, added)
            self.stats.inc_value("retry_after/ratelimit_cooldowns")
            self.extension.send_back(slot)
            self.events.quota_used(slot, sent_at(request.meta, self.board.clock()), decision.cooldown, self._on_the_wire(slot))
