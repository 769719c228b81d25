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
fails alone. The probe itself spends one, but a probe that fails on its last
attempt while the host stays paused is held, not given up: the outage is the
host's. A host that never answers again is refused once its pause outlasts
the slot's max_delay (pausing.py), and its requests are parked.

The probe is a request that failed before, the most failed first
(``probe_priority``): a fresh URL's first attempt says nothing when each
URL fails once or twice on its own (a CDN's cold-cache 504), and probing
with fresh URLs kept such a healthy host paused for good. One whose last
attempt failed as a probe is held once more at its own priority; failing
so again, it is given up as with stock Scrapy, so URLs that always fail
reach their errback instead of holding their host paused. And once a fresh
request fails right after a pause ended, the failures are the URLs', not the
host's (a recovered host answers fresh URLs; one that went down again fails
the held retries too): from then on only requests that failed before count
toward a pause of that host, so a cold cache costs one pause, not one per
burst of new URLs.

The board owns one ``HostPauses`` and asks it in ``ready_at``; the retry
middlewares report failures and answers. Times are the board's clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from .backoff import Backoff, Uniform

__all__ = [
    "FAILURES",
    "OUTAGE_STATUSES",
    "OWN_PRIORITY",
    "PROBED_OUT",
    "PROBE_PRIORITY",
    "PROBE_TIMEOUT",
    "HostPauses",
    "Pause",
    "PauseEvent",
    "PROBE",
    "SENT",
    "exception_kind",
    "left_at",
    "probe_interval",
    "own_priority",
    "probe_priority",
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


FAILURES = "retry_after_failures"
"""Meta: how often the request failed in a way that says its host may be down."""
OWN_PRIORITY = "retry_after_priority"
"""Meta: [the request's own priority, the priority a paused host raised it to]; trusted only while
the request still has the raised one (a spider passing ``response.meta`` on copies it)."""
PROBED_OUT = "retry_after_probed_out"
"""Meta: the request failed its last attempt as a probe and was held once: the next such failure is final."""
LESSON_WINDOW = 2.0
"""Seconds after a pause ends (at least four backoff bases) in which a fresh request's failure says
the host's failures are its URLs'."""
PROBE_PRIORITY = 1 << 20
"""Added to the priority of a request held by a paused host, once per failure: its slot's probe is picked
before fresh requests, the most failed first."""
_MOST_FAILURES = 1000
WITHDRAWN_AFTER = 10.0
"""Seconds a released probe may take to reach the middleware before the host is freed for the next: it
gets there within the reactor turn but for slow middlewares before it (3 s ones sent two probes at 2 s);
the known ways not to get there withdraw it at once."""
PROBE = "retry_after_probe"
"""Meta: the release mark of a request released as its paused host's probe (``HostPauses.released``)."""
SENT = "retry_after_sent"
"""Meta: when the request last passed the middleware while its slot was on the board (board clock).
Scrapy's ``download_latency`` is set only once headers arrive and retries copy it, so a probe reset at
once read as sent seconds before it left."""


def left_at(meta: Mapping[str, object], now: float) -> float:
    """When a request left, as far as a pause goes: its ``SENT`` stamp, or -inf when it has none, or one
    from the future (another process's clock): it left before its slot was held, so before any pause."""
    stamp = meta.get(SENT)
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and stamp <= now:
        return stamp
    return -math.inf


def probe_priority(base: int, failures: int, spent: bool) -> int:
    """The priority a request held by a paused host waits at: above the slot's fresh requests,
    the most failed first; ``spent``: its last attempt failed as a probe, so it waits at its own."""
    if spent:
        return base
    # Failures outrank the request's own priority, which RETRY_PRIORITY_ADJUST lowers on each retry.
    return base + PROBE_PRIORITY * min(max(1, failures), _MOST_FAILURES)


def own_priority(mark: object, priority: int) -> int:
    """The priority a request had before a paused host raised it: from its ``OWN_PRIORITY`` mark
    when the mark was made for this very priority, else ``priority`` itself."""
    if isinstance(mark, (list, tuple)) and len(mark) == 2 and all(_whole(value) for value in mark) and mark[1] == priority:
        return int(mark[0])
    return priority


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**63


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
    __slots__ = ("charged", "kind", "left", "next_probe", "on_trial", "probe_out", "probes", "released", "since")

    def __init__(self, kind: str, since: float) -> None:
        self.kind = kind
        self.since = since
        self.probes = 0
        self.charged = 0
        """Failures of requests sent before the pause that moved its first probe."""
        self.on_trial = False
        """Started by fresh failures under the per-URL lesson: a failed probe proves the lesson wrong."""
        self.next_probe = since
        self.probe_out = 0.0
        """Until when the probe sent is awaited (0.0: none out)."""
        self.released = 0.0
        """When the probe out was released."""
        self.left = False
        """The probe out passed the middleware toward the host."""


class HostPauses:
    """Per slot: failures of one kind in a row, and the pause they started."""

    __slots__ = ("_host_wide", "_pauses", "_repeats_only", "_resumed", "_streaks", "tracks_departures")

    def __init__(self) -> None:
        self.tracks_departures = False
        """The shell reports each probe that leaves (``left``) and each that will not (``withdrawn``):
        one released and reported neither way within ``WITHDRAWN_AFTER`` frees the host for the next."""
        self._streaks: dict[str, tuple[str, int, int, float]] = {}
        """Slot -> (kind, failures of that kind in a row, how many of them repeated one, when the last happened)."""
        self._pauses: dict[str, Pause] = {}
        self._resumed: dict[str, float] = {}
        """Slot -> when its last pause ended."""
        self._repeats_only: dict[str, float] = {}
        """Slot -> when a fresh request failing right after a pause taught that its failures are per URL."""
        self._host_wide: dict[str, float] = {}
        """Slot -> when a run of fresh failures under that lesson proved it wrong (a host that flaps)."""

    def __bool__(self) -> bool:
        return bool(self._pauses or self._streaks or self._resumed or self._repeats_only or self._host_wide)

    def __len__(self) -> int:
        return len(self._slots())

    def __contains__(self, slot: str) -> bool:
        """True while ``slot`` is paused."""
        return slot in self._pauses

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots())

    def _slots(self) -> set[str]:
        return (
            self._pauses.keys() | self._streaks.keys() | self._resumed.keys() | self._repeats_only.keys()
            | self._host_wide.keys()
        )

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
        repeat: bool = True,
    ) -> PauseEvent:
        """A request to ``slot`` sent at ``sent_at`` failed as ``kind``; ``repeat``: it had failed before.

        Paused already: a request sent during the pause was its probe (or slipped
        out with it), so the next probe waits a longer interval from now. One sent
        before, even if it reached the host after the pause began (the downloader's
        own queue still held it), is part of the burst that started it, but the host
        saw it too: it moves the next probe one interval later, so the host sees about
        one request per interval, a burst in flight included, up to twice ``threshold``
        such failures: a larger burst was sent before anyone knew, and 16 requests in
        flight during a one-second blip once put the first probe a minute out. When a
        request left is the shell's stamp (``left_at``), not its answer's latency:
        counting queued ones as failed probes once put a cold cache's first probe
        past a 20 s crawl.

        Once the host's failures proved to be its URLs' (a fresh request failed within
        ``LESSON_WINDOW`` of a pause's end), ``threshold`` failures of requests that failed before
        pause it, or four times as many of any (a real outage fails everything at once, while a
        cold cache answers the retries in between); a fresh failure in flight moves no probe; a
        pause's first probe waits one interval. The lesson is not renewed: the board forgets it
        after its pace memory, like a streak. A pause by such a run of fresh failures whose probe
        fails too proves it wrong (the host flaps, or is down), and it is not taught again until
        that verdict is forgotten the same way.
        """
        lesson = slot in self._repeats_only
        per_url = not repeat and lesson
        pause = self._pauses.get(slot)
        if pause is not None:
            if sent_at < pause.since:
                if not per_url and pause.charged < 2 * max(1, threshold):
                    pause.charged += 1
                    later = max(pause.next_probe, now) + probe_interval(max(1, pause.probes), backoff, rng)
                    pause.next_probe = min(later, now + max(backoff.cap, backoff.base))
                return PauseEvent(started=False, free=True, wait=max(0.0, pause.next_probe - now))
            # The probe's failure is its own attempt: it spends a retry (the shell holds one that
            # fails on its last attempt while the host stays paused).
            if pause.on_trial:  # a retry fails too: the lesson was wrong, the host flaps or is down
                pause.on_trial = False
                self._repeats_only.pop(slot, None)
                self._host_wide[slot] = now
            return PauseEvent(started=False, free=False, wait=self._rearm(pause, now, backoff, rng))
        if not repeat and not lesson:
            resumed = self._resumed.pop(slot, None)
            window = max(LESSON_WINDOW, 4 * backoff.base)
            if resumed is not None and now - resumed <= window and slot not in self._host_wide:
                self._repeats_only[slot] = now  # a fresh URL fails though the host answered: per-URL failures
                return PauseEvent(started=False, free=False, wait=0.0)
        last_kind, count, repeats, _ = self._streaks.get(slot, (kind, 0, 0, now))
        if last_kind == kind:
            count, repeats = count + 1, repeats + repeat
        else:
            count, repeats = 1, int(repeat)
        threshold = max(1, threshold)
        if (repeats < threshold and count < 4 * threshold) if lesson else count < threshold:
            self._streaks[slot] = (kind, count, repeats, now)
            return PauseEvent(started=False, free=False, wait=0.0)
        seen = 1 if lesson else count
        wait = self.pause(slot, kind, now, backoff, rng, seen=seen)
        self._pauses[slot].on_trial = lesson and repeats < threshold
        return PauseEvent(started=True, free=False, wait=wait)

    def pause(
        self, slot: str, kind: str, now: float, backoff: Backoff, rng: Uniform = random, seen: int = 1
    ) -> float:
        """Pause ``slot`` now (or wait a longer interval if it is paused); return seconds to the next probe.

        ``seen`` failures started it: the host saw each, so the first probe waits one interval per
        failure (at most the backoff's cap), and a burst stays about one request per interval."""
        self._streaks.pop(slot, None)
        pause = self._pauses.get(slot)
        if pause is not None:
            return self._rearm(pause, now, backoff, rng)
        pause = self._pauses[slot] = Pause(kind, now)
        self._rearm(pause, now, backoff, rng)
        pause.charged = max(1, min(seen, 64))
        later = pause.next_probe + sum(probe_interval(1, backoff, rng) for _ in range(pause.charged - 1))
        pause.next_probe = min(later, now + max(backoff.cap, backoff.base))
        return pause.next_probe - now

    @staticmethod
    def _rearm(pause: Pause, now: float, backoff: Backoff, rng: Uniform) -> float:
        # At least the pause's age (at most the cap): a failed probe never lets the next come sooner
        # than the host has been down, so a burst and two probes never share a short outage.
        pause.probes += 1
        age = min(max(0.0, now - pause.since), max(backoff.cap, backoff.base))
        wait = max(probe_interval(pause.probes, backoff, rng), age)
        pause.next_probe = now + wait
        pause.probe_out = 0.0
        return wait

    def answered(self, slot: str, now: float) -> float | None:
        """The host answered (not with an outage failure): its streak ends, and its pause;
        return how long the pause lasted, or None when it was not paused."""
        self._streaks.pop(slot, None)
        pause = self._pauses.pop(slot, None)
        if pause is None:
            return None
        self._resumed[slot] = now
        return max(0.0, now - pause.since)

    def ready_at(self, slot: str, now: float) -> float:
        """When ``slot``'s next request may leave as far as its pause goes (0.0: now)."""
        pause = self._pauses.get(slot)
        if pause is None:
            return 0.0
        if pause.probe_out > now:
            if pause.left or not self.tracks_departures:
                return pause.probe_out
            if now < pause.released + WITHDRAWN_AFTER:
                return pause.released + WITHDRAWN_AFTER  # ask again then: it may never leave
            pause.probe_out = 0.0  # it never left: a probe held past its deadline once held its host 60 s
        return pause.next_probe if pause.next_probe > now else 0.0

    def released(self, slot: str, now: float, probe_timeout: float = PROBE_TIMEOUT) -> float | None:
        """A request of ``slot`` left the queue: while paused, it is the probe, and the next waits for
        its outcome. Returns the probe's mark (``PROBE`` meta) when it became the probe, else None."""
        pause = self._pauses.get(slot)
        if pause is not None and now >= pause.next_probe and pause.probe_out <= now:
            pause.probe_out = now + probe_timeout
            pause.released, pause.left = now, False
            return now
        return None

    def _probe(self, slot: str, mark: object) -> Pause | None:
        pause = self._pauses.get(slot)
        if pause is None or not pause.probe_out or mark != pause.released or isinstance(mark, bool):
            return None
        return pause  # the probe out is this request (a copied meta carries an older mark)

    def left(self, slot: str, mark: object) -> None:
        """The request marked ``mark`` passed the middleware toward the host."""
        pause = self._probe(slot, mark)
        if pause is not None:
            pause.left = True

    def withdrawn(self, slot: str, mark: object, sent_back: bool = False) -> bool:
        """The request marked ``mark`` will not reach the host now (parked past its deadline, put back
        to wait, cooled on its way; ``sent_back``: from the downloader's queue, past the middleware
        but not on the wire): True when it was the probe out, and the host is free for the next.
        A probe that left is awaited (its retry carries its mark)."""
        pause = self._probe(slot, mark)
        if pause is None or (pause.left and not sent_back):
            return False
        pause.probe_out, pause.left = 0.0, False
        return True

    def remaining(self, slot: str, now: float) -> float:
        """Seconds until ``slot``'s next probe may leave."""
        return max(0.0, self.ready_at(slot, now) - now)

    def prune(self, before: float) -> int:
        """Forget the streaks and the lessons older than ``before``; pauses stay until answered."""
        stale = [slot for slot, (*_, last) in self._streaks.items() if last < before]
        for slot in stale:
            del self._streaks[slot]
        for lessons in (self._resumed, self._repeats_only, self._host_wide):
            old = [slot for slot, when in lessons.items() if when < before]
            for slot in old:
                del lessons[slot]
            stale += old
        return len(stale)
