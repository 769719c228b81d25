"""Learning a throttled slot's rate: measure, cut on a throttle, grow back (CUBIC).

Obeying Retry-After alone gives a saw-tooth: the slot reopens at full
concurrency and runs straight into the limiter again. After its first
throttle a slot is paced instead, at a rate that starts from what it was
measured to sustain, is cut by ``beta`` on each throttle and grows back along
a cubic curve toward and past the last peak, as the AWS SDKs' adaptive retry
mode does. Pure: the caller passes the time.
"""

from __future__ import annotations

import math

__all__ = ["Meter", "RateController"]

BUCKET = 0.5
SMOOTHING = 0.8
SCALE = 0.4


class Meter:
    """Smoothed successful responses per second, in half-second buckets."""

    __slots__ = ("bucket", "count", "rate", "last")

    def __init__(self, now: float) -> None:
        self.bucket = now
        self.count = 0
        self.rate = 0.0
        self.last = now

    def tick(self, now: float) -> float:
        elapsed = now - self.bucket
        if elapsed >= BUCKET:
            observed = self.count / elapsed
            self.rate = SMOOTHING * observed + (1 - SMOOTHING) * self.rate
            self.bucket = now
            self.count = 0
        self.count += 1
        self.last = now
        return self.rate

    def current(self, now: float) -> float:
        """The rate including the bucket in progress (so a burst counts at once)."""
        elapsed = now - self.bucket
        if elapsed <= 0.05:
            return self.rate
        return max(self.rate, self.count / max(elapsed, BUCKET))


class RateController:
    """The pace of one throttled slot, in requests per second."""

    __slots__ = ("rate", "peak", "last_cut", "window", "beta", "min_rate", "ceiling")

    def __init__(self, beta: float = 0.7, min_rate: float = 0.5) -> None:
        self.beta = beta
        self.min_rate = min_rate
        self.rate = 0.0
        self.peak = 0.0
        self.last_cut = 0.0
        self.window = 0.0
        self.ceiling = math.inf
        """A rate the server announced: growth never passes it."""

    def throttled(self, measured: float, now: float) -> float:
        """Cut the rate: the server said this pace is too fast."""
        base = measured if not self.rate else min(measured or self.rate, self.rate)
        base = max(base, self.min_rate)
        self.peak = base
        self.window = (base * (1 - self.beta) / SCALE) ** (1 / 3)
        self.last_cut = now
        self.rate = max(self.min_rate, base * self.beta)
        return self.rate

    def succeeded(self, measured: float, now: float) -> float:
        """Grow back: slowly near the last peak, faster once past it."""
        if not self.rate:
            return 0.0
        cubic = SCALE * (now - self.last_cut - self.window) ** 3 + self.peak
        ceiling = 2 * measured if measured > 0 else cubic
        self.rate = max(self.min_rate, min(cubic, ceiling, self.ceiling))
        return self.rate

    def announced(self, rate: float) -> None:
        """The server stated its quota: pace at it, and never above it."""
        self.ceiling = rate
        # Never throttled: follow the server. Throttled: the learned rate may only drop.
        self.rate = rate if not self.last_cut or not self.rate else min(self.rate, rate)
