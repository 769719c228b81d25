"""Learned paces kept in the per-host state file, so a second crawl of a host starts at its pace.

Learning a limit costs a crawl its first throttles: against nginx
``limit_req`` at 20 r/s, two cooldowns and a slow start, an eighth of a
400-page crawl. The pace each throttled slot ended at is merged into the
per-host state file (hoststate.py, beside the park file) when the spider
closes, and the next run's board starts each remembered host just under it
and back at it within seconds: no unpaced burst, no slow start, still
probing upward slowly in case the limit rose. Everything read is bounded by hostrecord.py (a finite rate, 1e-6 to
1e6 a second, learned no longer ago than RETRY_AFTER_MEMORY_AGE); here a
remembered pace is capped again by ``MAX_REMEMBERED`` and only seeds a host
no refusal holds. Pure: no Scrapy, no Twisted; the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .hostrecord import HostRecord, Pace

__all__ = ["MAX_REMEMBERED", "learned_records", "seeded_paces"]

MAX_REMEMBERED = 10_000.0
"""Requests per second: a remembered pace above it paces nothing a crawl can send, so it is not seeded."""


class _Board(Protocol):
    def learned_paces(self) -> dict[str, float]: ...

    def remember_paces(self, paces: dict[str, float]) -> int: ...

    def refused(self, slot: str) -> float: ...


def learned_records(board: _Board, now: float) -> dict[str, HostRecord]:
    """What this run learned of each host's pace, as records to merge into the file (empty: nothing learned)."""
    return {slot: HostRecord(pace=Pace(rate=rate, at=now)) for slot, rate in board.learned_paces().items()}


def seeded_paces(board: _Board, records: Mapping[str, HostRecord]) -> int:
    """Start each remembered host at its pace; returns how many were seeded.

    A host the file also refuses is left to the refusal; a pace the file's
    parser let through but no crawl could use (over ``MAX_REMEMBERED``) is
    not seeded, since a pace that high only marks the slot as throttled.
    """
    paces: dict[str, float] = {}
    for host, record in records.items():
        pace = record.pace
        if pace is None or board.refused(host) or not 0.0 < pace.rate <= MAX_REMEMBERED:
            continue
        paces[host] = pace.rate
    return board.remember_paces(paces) if paces else 0
