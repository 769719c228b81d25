"""Per-slot counts and the text of the live view and the closing summary.

Scrapy's stats are crawl-wide; a user watching a throttled crawl asks "which
host, and how hard is it pushing back?". The middleware feeds these counts as
it handles responses, and the log-stats extension turns them, with the
board's state, into lines. Pure: no Scrapy, no Twisted, no clock.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .breaker import CLOSED
from .eventlog import printable
from .parkrecord import iso

__all__ = ["SlotTally", "SlotView", "SummaryRow", "live_line", "live_lines", "summary_rows", "summary_table"]

MAX_LINES = 20
"""Slots named per live view and rows in the closing table; a broad crawl gets a count of the rest."""


class SlotTally:
    """What happened to each slot during the crawl.

    Responses are counted for every slot (one int per host, the same order of
    memory as the dupefilter's one fingerprint per request); throttles,
    cooldowns and circuit openings only for the slots that had them.
    """

    def __init__(self) -> None:
        self.responses: collections.Counter[str] = collections.Counter()
        self.throttles: dict[str, collections.Counter[int]] = {}
        self.cooldown: dict[str, float] = {}
        self.circuit_opens: collections.Counter[str] = collections.Counter()

    def responded(self, slot: str) -> None:
        self.responses[slot] += 1

    def throttled(self, slot: str, status: int, cooldown_added: float) -> None:
        self.responses[slot] += 1
        self.throttles.setdefault(slot, collections.Counter())[status] += 1
        self.cooled(slot, cooldown_added)

    def cooled(self, slot: str, cooldown_added: float) -> None:
        if cooldown_added > 0:
            self.cooldown[slot] = self.cooldown.get(slot, 0.0) + cooldown_added

    def circuit_opened(self, slot: str) -> None:
        self.circuit_opens[slot] += 1

    def prune(self, live: Callable[[str], bool]) -> int:
        """Forget the response counts of slots that are not ``live`` and were never throttled,
        cooled or opened (the closing table names only those); return how many."""
        remarkable = (self.throttles, self.cooldown, self.circuit_opens)
        quiet = [slot for slot in self.responses if not live(slot) and not any(slot in kept for kept in remarkable)]
        for slot in quiet:
            del self.responses[slot]
        return len(quiet)

    def noteworthy(self, also: Iterable[str] = ()) -> list[str]:
        """Slots that were throttled, cooled, had a circuit open, or are in ``also``; sorted."""
        slots = set(self.throttles) | set(self.cooldown) | set(self.circuit_opens) | set(also)
        return sorted(slots)


@dataclass(frozen=True)
class SlotView:
    """One slot's state at one moment, as the live view reports it."""

    slot: str
    cooling: float
    """Seconds left in its cooldown."""
    circuit: str
    rate: float | None
    """Learned or announced requests/s; None when the slot is not paced."""
    held: int
    """Requests waiting in the scheduler for the slot."""
    parked: int = 0
    sent: float | None = None
    """Requests per second the slot really sent (answers, 429s included) over the last ``over`` seconds;
    None before a whole interval was seen. The pace ``rate`` is only what it may send."""
    over: float = 0.0
    refused_until: float | None = None
    """Epoch seconds the slot is refused until (over the cap, a host down too long); None: not refused."""

    @property
    def held_back(self) -> bool:
        """Whether anything holds this slot back right now (a pace with nothing waiting does not)."""
        return self.refused_until is not None or self.cooling > 0 or self.circuit != CLOSED or self.held > 0


def live_line(view: SlotView) -> str:
    """``127.0.0.2: sending, 7.9 requests/s sent in the last 30 s, pace allows 8.50 requests/s, 12 requests held``.

    What was sent and what the pace allows are two numbers: during slow
    start, or when a quota allows more than the crawl asks, the pace runs
    far above what the slot sends.
    """
    if view.refused_until is not None:
        parts = [f"refused until {iso(view.refused_until)}"]
    else:
        parts = [f"cooling down for {view.cooling:.1f} s" if view.cooling > 0 else "sending"]
    if view.sent is not None:
        parts.append(f"{view.sent:.1f} requests/s sent in the last {view.over:.3g} s")
    if view.circuit != CLOSED:
        parts.append(f"circuit {view.circuit}")
    if view.rate is not None:
        parts.append(f"pace allows {view.rate:.2f} requests/s")
    parts.append(f"{view.held} request{'s' if view.held != 1 else ''} held")
    if view.parked:
        parts.append(f"{view.parked} parked")
    return f"{printable(view.slot)}: {', '.join(parts)}"


def live_lines(views: Iterable[SlotView], limit: int = MAX_LINES) -> list[str]:
    """The held-back slots holding the most requests first; past ``limit``, one line counting the rest."""
    held = sorted((view for view in views if view.held_back), key=lambda view: (-view.held, view.slot))
    lines = [live_line(view) for view in held[:limit]]
    if len(held) > limit:
        rest = held[limit:]
        lines.append(f"{len(rest)} more slot(s), {sum(view.held for view in rest)} request(s) held")
    return lines


@dataclass(frozen=True)
class SummaryRow:
    slot: str
    responses: int
    throttles: Mapping[int, int]
    cooldown: float
    rate: float | None
    circuit_opens: int
    parked: int
    refused_until: float | None = None


def summary_rows(
    tally: SlotTally, slots: Iterable[str], rates: Mapping[str, float | None], parked: Mapping[str, int],
    refused: Mapping[str, float] | None = None,
) -> list[SummaryRow]:
    return [
        SummaryRow(
            slot=slot,
            responses=tally.responses.get(slot, 0),
            throttles=dict(sorted(tally.throttles.get(slot, {}).items())),
            cooldown=tally.cooldown.get(slot, 0.0),
            rate=rates.get(slot),
            circuit_opens=tally.circuit_opens.get(slot, 0),
            parked=parked.get(slot, 0),
            refused_until=(refused or {}).get(slot),
        )
        for slot in slots
    ]


_HEADER = ("slot", "requests", "throttles", "cooldown s", "learned rate/s", "circuit opens", "parked")


def summary_table(rows: list[SummaryRow], limit: int = MAX_LINES) -> str:
    """A fixed-width table readable in a plain log: the most throttled slots first; past ``limit``, a count."""
    rows = sorted(rows, key=lambda row: (-sum(row.throttles.values()), row.slot))
    rest = rows[limit:]
    rows = rows[:limit]
    cells = [_HEADER] + [
        (
            printable(row.slot, 60),
            str(row.responses),
            " ".join(f"{status}x{count}" for status, count in row.throttles.items()) or "-",
            f"refused until {iso(row.refused_until)}" if row.refused_until is not None else f"{row.cooldown:.1f}",
            f"{row.rate:.2f}" if row.rate is not None else "-",
            str(row.circuit_opens),
            str(row.parked),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_HEADER))]
    lines = [
        "  ".join(cell.ljust(width) if i == 0 else cell.rjust(width) for i, (cell, width) in enumerate(zip(line, widths)))
        for line in cells
    ]
    if rest:
        lines.append(
            f"... and {len(rest)} more slot(s): {sum(sum(row.throttles.values()) for row in rest)} throttles, "
            f"{sum(row.responses for row in rest)} requests"
        )
    return "\n".join(lines)
