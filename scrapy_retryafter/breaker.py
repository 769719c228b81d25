"""A circuit breaker per slot: stop knocking on a host that keeps saying no.

CLOSED counts consecutive throttles; at the threshold it OPENs and holds every
request of the slot for ``open_seconds``; then HALF_OPEN lets exactly one
probe through: a success closes it, a throttle opens it again. Pure: the
caller passes the time.

Only throttles of requests sent while the slot was open to traffic count: a
penalty window that answers sixteen in-flight requests is one event, or two
windows would open the breaker on a perfectly healthy limiter.
"""

from __future__ import annotations

__all__ = ["Breaker", "CLOSED", "HALF_OPEN", "OPEN"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half-open"


class Breaker:
    __slots__ = ("consecutive", "opened_until", "probing", "state")

    def __init__(self) -> None:
        self.state = CLOSED
        self.consecutive = 0
        self.opened_until = 0.0
        self.probing = False

    def throttled(self, now: float, counts: bool, threshold: int, open_seconds: float) -> bool:
        """Record a throttle; return True when this one opened the circuit."""
        if self.state == HALF_OPEN:
            return self._open(now, open_seconds)
        if self.state == OPEN or not counts:
            return False
        self.consecutive += 1
        if self.consecutive >= threshold:
            return self._open(now, open_seconds)
        return False

    def succeeded(self) -> bool:
        """Record a success; return True when it closed an open circuit."""
        self.consecutive = 0
        if self.state == CLOSED:
            return False
        self.state = CLOSED
        self.probing = False
        return True

    def ready_at(self, now: float) -> float:
        """When the next request may leave (0.0: now), as far as the breaker goes."""
        if self.state == CLOSED:
            return 0.0
        if self.state == OPEN:
            if now < self.opened_until:
                return self.opened_until
            self.state = HALF_OPEN
            self.probing = False
        if self.probing and now >= self.opened_until:
            self.probing = False  # the probe never came back (an error, a drop): send another
        return self.opened_until if self.probing else 0.0

    def released(self, now: float, probe_timeout: float = 180.0) -> None:
        if self.state == HALF_OPEN and not self.probing:
            self.probing = True
            self.opened_until = now + probe_timeout

    def force_open(self, until: float) -> bool:
        """Hold the circuit open until ``until`` (another process opened it, or a
        paused job resumes); return True when it was closed before."""
        was_closed = self.state == CLOSED
        self.state = OPEN
        self.opened_until = until
        self.probing = False
        self.consecutive = 0
        return was_closed

    def restore(self, consecutive: int, open_until: float | None) -> None:
        """Take back a saved breaker: its streak, and open until ``open_until``
        when it was open or half-open at the save (then one probe, as usual)."""
        self.consecutive = max(0, int(consecutive))
        if open_until is not None:
            self.state = OPEN
            self.opened_until = open_until
            self.probing = False

    def _open(self, now: float, open_seconds: float) -> bool:
        self.state = OPEN
        self.opened_until = now + open_seconds
        self.probing = False
        self.consecutive = 0
        return True
