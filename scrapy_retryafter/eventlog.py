"""Which throttle responses make one event in the log, and when the pace is worth a line.

A slot hit by its limit answers every request already on the wire with a 429
(or, with rate-limit headers, a 200 saying the quota is spent): seven
responses in a second are one event, not seven. The bound is the one the
board uses for learning: **a response to a request sent before the event
began belongs to that event.** Requests sent after it began start a new one.

The event's line is written once, with the count, when the burst is over:

- every request that was on the wire when it began has been answered
  (``expected`` answers, throttled or not), or
- a response arrives to a request sent after the event began (the slot
  sends again), or another event of the slot begins, or
- ``grace`` seconds have passed since it began (answers lost to timeouts
  never come), or the crawl closes.

A late member, arriving after its event's line was written, is counted at
DEBUG only. Lines that follow from the event (a pace cut) wait for its line,
so they never come before it.

Pace rises are written at most once per slot per ``rise_every`` seconds, so a
slot climbing back after a cut gives one line a minute, not one per success.

Pure: an injected clock, no Scrapy, no Twisted.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EventLog", "Line", "RiseGate", "printable"]

Line = tuple[str, dict[str, Any]]
"""A log message with ``%(name)s`` fields and its arguments."""

_MAX_NAME = 200


def printable(name: str, limit: int = _MAX_NAME) -> str:
    """A name from a server, a file or Redis fit for one line of a log or a terminal:
    control and separator characters (and backslashes, so the escape is unambiguous)
    escaped, a long name cut."""
    if name.isprintable() and "\\" not in name and len(name) <= limit:
        return name
    escaped = "".join(
        "\\\\" if ch == "\\" else ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
        for ch in name[:limit]
    )
    return escaped if len(name) <= limit else escaped + f"...({len(name)} chars)"


@dataclass
class _Event:
    started: float
    line: Line
    expected: int
    count: int = 1
    answered: int = 0
    written: bool = False
    after: list[Line] = field(default_factory=list)


class EventLog:
    """Open events per key (a slot, or a slot and a kind); hands back lines when they are due."""

    def __init__(self, clock: Callable[[], float], grace: float = 1.0, keep: float = 60.0) -> None:
        self.clock = clock
        self.grace = grace
        self.keep = keep
        self._events: dict[Hashable, _Event] = {}
        self.kept: Mapping[Hashable, object] = self._events
        """The events kept, by key (read only): empty when none is open, which the middleware
        checks per answer at a dict's cost (``len()`` is a Python call)."""

    def __len__(self) -> int:
        return len(self._events)

    def event(self, key: Hashable, sent_at: float, line: Line, expected: int) -> tuple[bool, list[Line]]:
        """A throttle response: ``(new, lines due now)``; ``new`` is False for a member of the open event.

        ``expected`` is how many other requests of the slot were on the wire
        when this one was answered: their answers close a new event.
        """
        now = self.clock()
        event = self._events.get(key)
        if event is not None and sent_at < event.started:
            event.count += 1
            event.answered += 1
            return False, self._close_if_answered(key, event)
        due = self._write(key) if event is not None else []
        self._events[key] = _Event(now, line, max(0, expected))
        return True, due + self._close_if_answered(key, self._events[key])

    def follow(self, key: Hashable, line: Line) -> list[Line]:
        """A line caused by the event open at ``key``: written after its line (now, if that is out)."""
        event = self._events.get(key)
        if event is None or event.written:
            return [line]
        event.after.append(line)
        return []

    def answered(self, key: Hashable, sent_at: float) -> list[Line]:
        """A response that is not a throttle: one awaited answer, or the slot sending again."""
        event = self._events.get(key)
        if event is None or event.written:
            return []
        if sent_at >= event.started:
            return self._write(key)
        event.answered += 1
        return self._close_if_answered(key, event)

    def flush(self, key: Hashable) -> list[Line]:
        """Write the event open at ``key`` now (something else is about to be logged about it)."""
        return self._write(key) if key in self._events else []

    def due(self, everything: bool = False) -> list[Line]:
        """Lines of events past their grace (all of them at close); forget old written events."""
        now = self.clock()
        lines: list[Line] = []
        for key, event in list(self._events.items()):
            if not event.written and (everything or now - event.started >= self.grace):
                lines += self._write(key)
            elif event.written and now - event.started >= self.keep:
                del self._events[key]
        return lines

    def _close_if_answered(self, key: Hashable, event: _Event) -> list[Line]:
        return self._write(key) if not event.written and event.answered >= event.expected else []

    def _write(self, key: Hashable) -> list[Line]:
        event = self._events[key]
        if event.written:
            return []
        event.written = True
        message, args = event.line
        lines: list[Line] = [(message, {**args, "count": event.count})]
        lines += event.after
        event.after = []
        return lines


class RiseGate:
    """At most one pace-rise line per slot per ``every`` seconds; memory bounded by pruning."""

    def __init__(self, clock: Callable[[], float], every: float = 60.0, prune_at: int = 1024) -> None:
        self.clock = clock
        self.every = every
        self.prune_at = prune_at
        self._last: dict[str, float] = {}

    def noted(self, slot: str) -> None:
        """A pace line was written for ``slot`` (a cut): the next rise waits a full period."""
        self._last[slot] = self.clock()
        self._prune()

    def allows(self, slot: str) -> bool:
        """Whether a rise of ``slot`` may be written now (and, if so, note it)."""
        now = self.clock()
        last = self._last.get(slot)
        if last is not None and now - last < self.every:
            return False
        self._last[slot] = now
        self._prune()
        return True

    def _prune(self) -> None:
        if len(self._last) <= self.prune_at:
            return
        now = self.clock()
        self._last = {slot: at for slot, at in self._last.items() if now - at < self.every}
        self.prune_at = max(self.prune_at, 2 * len(self._last))
