"""The paces slow start stepped through, to tell which one a refused request was sent at.

Slow start steps the pace up on every success, and a 429 comes back one
round trip after its request left: at 20 requests/s and 50 ms that is a
step or two later. Cutting from the pace in force when the 429 arrives
overstates the limit, so the slot resumes over it, is refused at once and
cut deep (simulated against a strict limiter at 100 ms: 1.6 x the ideal
time, against 1.26 x when the cut starts from the pace the refused request
was sent at). Pure; a flat array, as a broad crawl keeps one per slot in slow start.
"""

from __future__ import annotations

from array import array

__all__ = ["STEPS", "sent_pace", "stepped"]

STEPS = 8
"""Steps kept: at 50 requests/s, 160 ms of round trip; a request sent before the oldest was sent at most at it."""


def stepped(steps: array[float] | None, now: float, rate: float) -> array[float]:
    """``steps`` with the pace ``rate`` in force from ``now``."""
    if steps is None:
        steps = array("d")
    steps.extend((now, rate))
    if len(steps) > 2 * STEPS:
        del steps[:2]
    return steps


def sent_pace(steps: array[float], sent_at: float) -> tuple[float, float] | None:
    """The pace in force at ``sent_at`` and the one before it (0.0: unknown); None without steps."""
    if not steps:
        return None
    k = len(steps) // 2 - 1
    while k >= 0 and steps[2 * k] > sent_at:
        k -= 1
    if k < 0:
        return steps[1], 0.0
    return steps[2 * k + 1], steps[2 * k - 1] if k > 0 else 0.0
