"""A stated quota is a budget, not a speed.

A host that says "60 left, reset in 50 minutes" has not asked for one
request every 50 s: a crawl that needs eight of them may send them at once.
Spreading what is left over the time to the reset only pays when the crawl
would otherwise run the quota dry before the reset (and then wait it out).
Pure: the caller passes what the headers said and what the slot holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RESERVE", "RESERVE_SHARE", "Spend", "spend"]

RESERVE = 1
"""Requests of a quota never spent: the answers that may still arrive for
requests the caller could not count (a retry in the downloader's queue)."""
RESERVE_SHARE = 0.02
"""And a share of a large quota: two of every hundred, 100 of GitHub's 5,000."""


@dataclass(frozen=True)
class Spend:
    """How the slot spends what is left of its quota until the reset."""

    pace: float | None
    """Requests/s to send at; None: at the slot's own pace (learned, or unpaced)."""
    wait: float = 0.0
    """Seconds to hold the slot before sending (until the reset); 0: send now."""
    reason: str = ""


def reserve_of(quota: float | None) -> int:
    if quota is None or not math.isfinite(quota) or quota <= 0:
        return RESERVE
    return max(RESERVE, math.floor(RESERVE_SHARE * quota))


def spend(
    remaining: float,
    reset: float,
    on_the_wire: int,
    *,
    quota: float | None = None,
    sustained: float | None = None,
    own_pace: float | None = None,
    wanted: int | None = None,
) -> Spend:
    """What to do with ``remaining`` requests left for ``reset`` seconds.

    ``on_the_wire``: requests sent that the server has not counted yet.
    ``quota``: the stated limit per window, for the reserve. ``sustained``:
    a pace that keeps every window within the quota whatever the phase
    (``quota_pace(quota, window)``), given only when the window is known
    and the slot sent at no more than it for the last whole window (after
    a burst, a fixed window has only what it says left). ``own_pace``:
    the slot's learned pace, None when unpaced. ``wanted``: requests waiting
    for the slot, None when unknown (a broad crawl: assume many).

    1. What the window needs is what the slot would send before the reset
       at its own pace, and no more than it has waiting.
    2. Left, after the requests on the wire and a small reserve, at least
       what the window needs: send at the slot's own pace.
    3. Less: spread what is left until the reset, but never slower than a
       sustained pace (on a moving window "1 left" is what a steady pace
       reads; its reset is when the oldest hit leaves, not when all do).
    4. Nothing left at all: hold the slot until the reset.
    """
    remaining = max(0.0, remaining) if math.isfinite(remaining) else 0.0
    reset = max(0.0, reset) if math.isfinite(reset) else 0.0
    left = remaining - max(0, on_the_wire) - reserve_of(quota)
    if remaining - max(0, on_the_wire) <= 0:
        return Spend(None, wait=reset, reason="quota spent: hold until its reset")
    if reset <= 0:
        return Spend(None, reason="the window resets now")
    need = math.inf
    if own_pace is not None and math.isfinite(own_pace) and own_pace > 0:
        need = own_pace * reset
    if wanted is not None:
        need = min(need, max(0, wanted))
    if left >= need:
        return Spend(None, reason="quota well above what the window needs: own pace")
    floor = sustained if sustained is not None and math.isfinite(sustained) and sustained > 0 else 0.0
    spread = max(0.0, left) / reset
    if left <= 0 and not floor:
        return Spend(None, wait=reset, reason="only the reserve left: hold until the reset")
    pace = max(spread, floor)
    if own_pace is not None and own_pace > 0:
        pace = min(pace, own_pace)
    return Spend(pace, reason="quota would run out before its reset: spread what is left")
