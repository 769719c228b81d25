"""Smoothed successful responses per second, what a throttled slot's first pace starts from.

Pure: the caller passes the time.
"""

from __future__ import annotations

__all__ = ["Meter"]

BUCKET = 0.5
SMOOTHING = 0.8


class Meter:
    """Smoothed successful responses per second, in half-second buckets (three fields: a broad
    crawl keeps one per recently seen host; the last tick is at most a bucket after ``bucket``)."""

    __slots__ = ("bucket", "count", "rate")

    def __init__(self, now: float) -> None:
        self.bucket = now
        self.count = 0
        self.rate = 0.0

    def tick(self, now: float) -> float:
        elapsed = now - self.bucket
        if elapsed >= BUCKET:
            observed = self.count / elapsed
            self.rate = SMOOTHING * observed + (1 - SMOOTHING) * self.rate
            self.bucket = now
            self.count = 0
        self.count += 1
        return self.rate

    def idle(self, now: float, seconds: float) -> bool:
        """True when no tick came for at least ``seconds`` (give or take a bucket)."""
        return now - self.bucket > seconds + BUCKET

    def current(self, now: float) -> float:
        """The rate including the bucket in progress (so a burst counts at once).

        Never zero or near zero once successes were seen: those of the bucket in progress count
        over their span, at least a bucket (a first 429 within 50 ms of the first successes read 0
        and started the pace at the floor, 1 request/s, instead of what the host had just served).
        """
        return max(self.rate, self.count / max(now - self.bucket, BUCKET))
