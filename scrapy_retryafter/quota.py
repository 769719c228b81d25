"""What a response's rate-limit headers make the crawler do: pace, cool, or nothing.

headers are parsed in ratelimit.py; the rules that turn those facts into a
pace and a cooldown are here, pure, so that a table tests them:

- pace from a stated quota and window; from a quota whose window is learnt
  from successive resets; else spread what is left until the reset;
- cool until the reset when the quota left is spent by the requests already
  on the wire;
- never cool past the cap (RETRY_AFTER_MAX_DELAY): such a reset is skipped;
- never pace slower than one request per cap: such a quota is a refusal
  until its reset (cooled when the reset is within the cap, refused past it);
- but first, a quota is a budget (budget.py): when what is left covers what
  the slot still wants before the reset, none of the above applies and the
  slot sends at its own pace (``budget_quota``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from .budget import spend
from .ratelimit import MAX_RESET, RateLimitFacts, quota_pace

_MOVING_EVIDENCE = 2
"""Steps of the reset that must agree before a quota's window is read as moving (or fixed again)."""
_WHOLE_SECONDS = 1.0
"""Resets stated in epoch seconds step by whole seconds: a shorter step is no window read from them."""
_DISPROVED = 0.0
"""The shortest step, once an answer showed the window lasts longer: never trusted again (under _WHOLE_SECONDS)."""

__all__ = ["QuotaDecision", "QuotaWindows", "budget_covers", "budget_quota", "decide_quota", "wants_window"]


@dataclass(frozen=True)
class QuotaDecision:
    rate: float | None
    """Requests/s to pace the slot at; None: the headers state no pace."""
    cooldown: float
    """Seconds to cool the slot until its quota resets; 0.0: no cooldown."""
    past_cap: bool = False
    """The quota is spent but its reset is past the cap: not cooled."""
    refuse: float = 0.0
    """Seconds to refuse the slot: its quota is slower than one request per cap, and resets past the cap."""
    free: bool = False
    """What is left covers what the slot wants before the reset: no pace from the quota (own pace)."""


def wants_window(facts: RateLimitFacts) -> bool:
    """Whether a pace needs the window learnt from successive resets (a quota stated without one)."""
    return facts.rate is None and bool(facts.quota) and facts.reset_at is not None


def decide_quota(
    facts: RateLimitFacts,
    window: float | None,
    on_the_wire: int,
    max_delay: float,
    *,
    moving: bool = False,
    ends_in: float | None = None,
) -> QuotaDecision:
    """The pace and cooldown ``facts`` call for.

    ``window`` is the learnt window (``QuotaWindows``) when ``wants_window``;
    ``on_the_wire`` counts the slot's other requests already sent, which
    spend what is left too. ``moving``: the window reads as a moving one
    (``QuotaWindows.moving``); there "none left" at the quota's pace is the
    steady state, and the next hit is free when the oldest leaves, not at a
    reset rounded up to whole seconds: the pace is kept, no cooldown.
    ``ends_in``: seconds until a fixed window ends at the latest
    (``QuotaWindows.ends_in``); a quota spent there is cooled until then,
    not until a reset stated up to a second late.
    """
    rate = facts.rate
    if rate is None and facts.quota and window:
        rate = quota_pace(facts.quota, window)
    if rate is None and facts.remaining and facts.reset:
        rate = facts.remaining / facts.reset  # no stated window: spread what is left until the reset
    if rate is not None and rate * max_delay < 1.0:
        # slower than one request per cap: not a pace but a refusal until the reset (capped at a week by the parser)
        if not facts.reset:
            return QuotaDecision(1.0 / max_delay, 0.0)
        if facts.reset > max_delay:
            return QuotaDecision(None, 0.0, past_cap=True, refuse=facts.reset)
        return QuotaDecision(None, facts.reset)
    if facts.remaining is None or facts.remaining > on_the_wire or not facts.reset:
        return QuotaDecision(rate, 0.0)
    if moving and window and rate is not None:
        return QuotaDecision(rate, 0.0)
    wait = facts.reset
    if window and ends_in is not None and math.isfinite(ends_in):
        wait = min(wait, max(0.0, ends_in))
        if not wait:
            return QuotaDecision(rate, 0.0)
    if wait > max_delay:
        return QuotaDecision(rate, 0.0, past_cap=True)
    return QuotaDecision(rate, wait)


def budget_covers(facts: RateLimitFacts, on_the_wire: int, wanted: int | None) -> bool:
    """Whether what is left of the quota covers what the slot still wants before its reset (budget.py).

    ``wanted``: the slot's requests not yet sent, None when more may come
    that nobody counted (the start requests are still being read). A
    remainder above the stated limit is read as the limit: a server that says
    "a billion left of 10" is not trusted with a burst it never offered.
    """
    remaining, reset, quota = facts.remaining, facts.reset, facts.quota
    if facts.invalid or remaining is None or reset is None or not 0.0 < reset <= MAX_RESET:
        return False  # a NaN, infinite or past reset says nothing about the time left
    if quota is not None and math.isfinite(quota) and quota > 0:
        remaining = min(remaining, quota)
    else:
        quota = None
    budget = spend(remaining, reset, on_the_wire, quota=quota, wanted=wanted)
    return budget.pace is None and not budget.wait


def budget_quota(
    facts: RateLimitFacts,
    window: float | None,
    on_the_wire: int,
    max_delay: float,
    *,
    wanted: int | None = None,
    moving: bool = False,
    ends_in: float | None = None,
) -> QuotaDecision:
    """``decide_quota``, with the quota spent as a budget first: no pace at all while it covers ``wanted``.

    The slot's own learned pace is not passed to ``spend``: a pace the quota
    sets on a slot that learned one is the lower of the two (``announced``),
    which is what ``spend`` would choose.
    """
    if budget_covers(facts, on_the_wire, wanted):
        return QuotaDecision(None, 0.0, free=True)
    return decide_quota(facts, window, on_the_wire, max_delay, moving=moving, ends_in=ends_in)


class QuotaWindows:
    """The window of a quota stated without one (``X-RateLimit-Limit`` with an epoch reset).

    The epoch a window resets at is the same on every response of that
    window and moves on by the window's length when the next one starts;
    spreading what is left until a reset rounded to whole seconds would
    instead pace a one-second window at anything from half its quota up.
    An idle slot may see the reset move on by several windows: that paces
    it slower until the next step, never faster; once the window reads as
    fixed (it refills at each step) its shortest step is its length. The board owns it and
    prunes it in its sweep.
    """

    def __init__(self, most: int = 10_000) -> None:
        self.most = most
        self._seen: dict[str, tuple[float, float, float, int, float, float]] = {}
        """Slot -> (latest reset epoch, last step, when last seen on the board's clock, moving score,
        when the latest window was first seen, shortest step)."""

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, slot: str) -> bool:
        return slot in self._seen

    def __iter__(self) -> Iterator[str]:
        return iter(self._seen)

    def window(
        self,
        slot: str,
        reset_at: float,
        now: float,
        remaining: float | None = None,
        quota: float | None = None,
        sent_at: float | None = None,
    ) -> float | None:
        """The window's length, None while unknown. ``sent_at``: when the answered request was sent
        (board clock); one sent after the window's end by the shortest step, answered with no new
        reset, disproves that step for good (a window of 1.5 s stated in whole seconds steps by 1 or 2)."""
        previous, window, _, score, began, shortest = self._seen.get(slot, (reset_at, 0.0, now, 0, now, math.inf))
        if reset_at <= previous and sent_at is not None and sent_at > began + shortest:
            shortest = _DISPROVED
        if reset_at > previous:
            window = min(reset_at - previous, MAX_RESET)  # resets far apart: still at most a week
            shortest = min(shortest, window)
            began = now
            if remaining is not None and quota:
                # A fixed window refills when its reset moves on; a moving one (the reset is when
                # the oldest hit leaves) still holds the hits of the last window: little is left.
                score = max(-_MOVING_EVIDENCE, min(_MOVING_EVIDENCE, score + (1 if remaining < quota / 2 else -1)))
        elif slot not in self._seen and len(self._seen) >= self.most:
            self._seen.clear()  # a broad crawl between sweeps: start over rather than grow
        self._seen[slot] = (max(previous, reset_at), window, now, score, began, shortest)
        if score < 0 and _WHOLE_SECONDS <= shortest < window:
            return shortest  # a fixed window: a longer step is an idle spell or a reset rounded up
        return window or None

    def throttled(self, slot: str, sent_at: float) -> None:
        """A throttle of a request sent after the window's end by the shortest step: the step is no window."""
        entry = self._seen.get(slot)
        if entry is not None and sent_at > entry[4] + entry[5]:
            self._seen[slot] = (*entry[:5], _DISPROVED)

    def ends_in(self, slot: str, now: float) -> float | None:
        """Seconds until the slot's fixed window ends at the latest; None when that is not known.

        A window that opens at its first hit (Flask-Limiter's fixed window,
        GitHub's hour) and lasts whole seconds moves its reset on by at
        least its length, so the shortest step is at least the window; it
        began before its first answer was seen. Its stated reset may be up
        to a second late (Flask-Limiter states ``int(end + 1)``). A window
        of another length is caught by ``window``'s ``sent_at``.
        """
        entry = self._seen.get(slot)
        if entry is None or entry[3] >= 0 or not _WHOLE_SECONDS <= entry[5] < math.inf:
            return None
        return entry[4] + entry[5] - now

    def moving(self, slot: str) -> bool:
        """Whether the slot's quota reads as a moving window: its "none left" is when the oldest hit leaves."""
        entry = self._seen.get(slot)
        return entry is not None and entry[3] > 0

    def prune(self, before: float) -> int:
        """Forget the slots last seen before ``before``; return how many."""
        stale = [slot for slot, entry in self._seen.items() if entry[2] < before]
        for slot in stale:
            del self._seen[slot]
        return len(stale)
