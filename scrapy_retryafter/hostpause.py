"""A host outage is one event: pause the host and probe it, one request per interval. Pure.

Fifty requests failing the same way at once (502, 504, 522, 524, timeouts,
resets, or blind 503s once the retry budget is spent) say the host is down,
not that fifty requests are bad. Counting that against each request's own
retries loses every page of a six-second outage; retrying each one on its own
backoff sends the failing host a storm. So after ``threshold`` failures of
one kind in a row the slot pauses: one probe leaves per interval, the
interval growing from the backoff's base to its cap, and the first answer
that is not such a failure ends the pause. A request that fails while its
host is paused spends none of its own retries; one that fails while the host
answers spends one, so RETRY_TIMES keeps its meaning for a request that
fails alone. The probe itself spends one: a host that never answers again
runs out of retries one probe at a time instead of holding the crawl forever.

The board owns one ``HostPauses`` and asks it in ``ready_at``; the retry
middlewares report failures and answers. Times are the board's clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .backoff import Backoff, Uniform

__all__ = [
    "OUTAGE_STATUSES",
    "PROBE_TIMEOUT",
    "HostPauses",
    "Pause",
    "PauseEvent",
    "exception_kind",
    "probe_interval",
]

OUTAGE_STATUSES = frozenset({502, 504, 522, 524})
"""Gateway answers that say the host behind is down, not that the request is wrong."""
PROBE_TIMEOUT = 60.0
"""Seconds a probe may stay out before another is sent (its outcome never came back to us)."""

_TIMEOUTS = frozenset({
    "twisted.internet.error.TimeoutError",
    "twisted.internet.defer.TimeoutError",
    "scrapy.exceptions.DownloadTimeoutError",
    "builtins.TimeoutError",
})


def exception_kind(names: Iterable[str]) -> str:
    """How a failed attempt failed, from its exception's qualified names: ``timeout`` or ``reset``
    (a connection lost or reset mid-request, a response cut short)."""
    return "timeout" if any(name in _TIMEOUTS for name in names) else "reset"


def probe_interval(probes: int, backoff: Backoff, rng: Uniform = random) -> float:
    """Seconds before the ``probes``-th probe (1-based): the backoff's ceiling for that attempt,
    jittered down by at most half, so "one request per interval" holds whatever strategy the
    slot's own retries use (full jitter can draw 0)."""
    low, high = backoff.bounds(max(1, probes))
    high = max(high, backoff.base)
    return rng.uniform(high / 2, high)


@dataclass(frozen=True)
class PauseEvent:
    """What one failure did to its host's pause."""

    started: bool
    """This failure paused the host."""
    free: bool
    """The host was paused already: the failure is the host's, not the request's."""
    wait: float
    """Seconds until the next probe (0.0: no pause, or the pause was not moved)."""


class Pause:
    __slots__ = ("kind", "next_probe", "probe_out", "probes", "since")

    def __init__(self, kind: str, since: float) -> None:
        self.kind = kind
        self.since = since
        self.probes = 0
        self.next_probe = since
        self.probe_out = 0.0
        """Until when the probe sent is awaited (0.0: none out)."""


class HostPauses:
    """Per slot: failures of one kind in a row, and the pause they started."""

    __slots__ = ("_pauses", "_streaks")

    def __init__(self) -> None:
        self._streaks: dict[str, tuple[str, int, float]] = {}
        """Slot -> (kind, failures of that kind in a row, when the last one happened)."""
        self._pauses: dict[str, Pause] = {}

    def __bool__(self) -> bool:
        return bool(self._pauses) or bool(self._streaks)

    def __len__(self) -> int:
        return len(self._pauses.keys() | self._streaks.keys())

    def __contains__(self, slot: str) -> bool:
        """True while ``slot`` is paused."""
        return slot in self._pauses

    def __iter__(self) -> Iterator[str]:
        return iter(self._pauses.keys() | self._streaks.keys())

    def pause_of(self, slot: str) -> Pause | None:
        return self._pauses.get(slot)

    def failed(
        self,
        slot: str,
        kind: str,
        now: float,
        sent_at: float,
        threshold: int,
        backoff: Backoff,
        rng: Uniform = random,
    ) -> PauseEvent:
        """A request to ``slot`` sent at ``sent_at`` failed as ``kind``.

        Paused already: a request sent during the pause was its probe (or slipped
        out with it), so the next probe waits a longer interval from now. One sent
        before the pause is part of the event that started it, but the host saw it
        too: the interval grows with it and the next probe never comes sooner, so
        the host sees about one request per interval, a burst in flight included.
        """
        pause = self._pauses.get(slot)
        if pause is not None:
            if sent_at < pause.since:
                pause.probes += 1
                pause.next_probe = max(pause.next_probe, now + probe_interval(pause.probes, backoff, rng))
                return PauseEvent(started=False, free=True, wait=max(0.0, pause.next_probe - now))
            # The probe's failure is its own attempt: it spends a retry, so a host that never
            # answers again still ends (each probe uses up its request's retries).
            return PauseEvent(started=False, free=False, wait=self._rearm(pause, now, backoff, rng))
        last_kind, count, _ = self._streaks.get(slot, (kind, 0, now))
        count = count + 1 if last_kind == kind else 1
        if count < max(1, threshold):
            self._streaks[slot] = (kind, count, now)
            return PauseEvent(started=False, free=False, wait=0.0)
        return PauseEvent(started=True, free=False, wait=self.pause(slot, kind, now, backoff, rng))

    def pause(self, slot: str, kind: str, now: float, backoff: Backoff, rng: Uniform = random) -> float:
        """Pause ``slot`` now (or wait a longer interval if it is paused); return seconds to the next probe."""
        self._streaks.pop(slot, None)
        pause = self._pauses.get(slot)
        if pause is None:
            pause = self._pauses[slot] = Pause(kind, now)
        return self._rearm(pause, now, backoff, rng)

    @staticmethod
    def _rearm(pause: Pause, now: float, backoff: Backoff, rng: Uniform) -> float:
        pause.probes += 1
        wait = probe_interval(pause.probes, backoff, rng)
        pause.next_probe = now + wait
        pause.probe_out = 0.0
        return wait

    def answered(self, slot: str, now: float) -> float | None:
        """The host answered (not with an outage failure): its streak ends, and its pause;
        return how long the pause lasted, or None when it was not paused."""
        self._streaks.pop(slot, None)
        pause = self._pauses.pop(slot, None)
        return None if pause is None else max(0.0, now - pause.since)

    def ready_at(self, slot: str, now: float) -> float:
        """When ``slot``'s next request may leave as far as its pause goes (0.0: now)."""
        pause = self._pauses.get(slot)
        if pause is None:
            return 0.0
        if pause.probe_out > now:
            return pause.probe_out
        return pause.next_probe if pause.next_probe > now else 0.0

    def released(self, slot: str, now: float, probe_timeout: float = PROBE_TIMEOUT) -> None:
        """A request of ``slot`` left: while paused, it is the probe, and the next waits for its outcome."""
        pause = self._pauses.get(slot)
        if pause is not None and now >= pause.next_probe and pause.probe_out <= now:
            pause.probe_out = now + probe_timeout

    def remaining(self, slot: str, now: float) -> float:
        """Seconds until ``slot``'s next probe may leave."""
        return max(0.0, self.ready_at(slot, now) - now)

    def prune(self, before: float) -> int:
        """Forget the streaks whose last failure is older than ``before``; pauses stay until answered."""
        stale = [slot for slot, (_, _, last) in self._streaks.items() if last < before]
        for slot in stale:
            del self._streaks[slot]
        return len(stale)
