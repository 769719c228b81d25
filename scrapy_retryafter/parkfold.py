"""The park log folded: its lines read in order (a later line wins) into live records and claims.

Lines are read in bounded chunks; a torn, too long or malformed line becomes
a ``Bad`` (set aside by the park file), never a crash.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from .parkowner import Owner, claim_holds
from .parkrecord import _ID, ParkRecord

MAX_LINE = 16 * 1024 * 1024
"""Longest line read or written; a request this large is parked by its URL."""
MAX_IDS_PER_LINE = 1000
_CHUNK = 1 << 20
_TORN_HEAD = 4096
_MAX_NAMES = 10_000
"""Distinct names a fold shares (a hostile file may make every one distinct)."""


class Entry(NamedTuple):
    """A record as the log holds it: its line, and what choosing and summing it need.

    A tuple of bytes, strings and numbers, which the garbage collector stops
    tracking: a fold kept between claims (100,000 entries) then adds no time
    to a full collection on the reactor (a class instance added 33 ms).
    """

    line: bytes
    spider: str
    slot: str
    reason: str
    url: str
    not_before: float
    at: int = -1
    """Where the line starts in the file, when the fold keeps no lines (``line`` is then empty)."""
    size: int = 0
    crc: int = 0
    """The line's CRC-32, when the fold keeps no lines: the line read again by its offset must be this one."""

    def record(self) -> ParkRecord:
        return ParkRecord.from_line(self.line.decode("ascii"))


@dataclass
class Bad:
    """A line set aside: its bytes (the head only, past MAX_LINE) and why."""

    line: bytes
    why: str
    id: str | None = None
    url: str | None = None


class Fold:
    """The log read in order: live records, claims, and the lines that are no record."""

    def __init__(self, keep_lines: bool = True) -> None:
        """Without ``keep_lines``, a record is kept as where its line is, not its bytes: a claim
        of a batch then holds only the batch's lines, never the whole file's."""
        self.keep_lines = keep_lines
        self.records: dict[str, Entry] = {}
        self.claims: dict[str, Owner] = {}
        self.claimed_at: dict[str, float] = {}
        """When each claim was made, by its line (0 for a line without a time)."""
        self.bad: list[Bad] = []
        self.lines = 0
        self._names: dict[str, str] = {}
        """One string per distinct spider, slot and reason: a kept fold of 100,000 records
        otherwise holds 300,000 copies of a handful of names."""

    def _name(self, text: str) -> str:
        if len(self._names) >= _MAX_NAMES:
            return text
        return self._names.setdefault(text, text)

    def apply(self, line: bytes, end: int | None = None) -> None:
        """Fold one line; ``end`` is the file offset just after it."""
        if not line.strip():
            return
        self.lines += 1
        if not self.lines % 32:
            time.sleep(0)  # let a waiting thread (the reactor) have the GIL now, not at the next switch
        try:
            raw = json.loads(line.decode("ascii"))
        except (ValueError, RecursionError):
            self.bad.append(Bad(line, "not a JSON line (a torn write?)"))
            return
        if isinstance(raw, dict) and "url" in raw:
            try:
                record = ParkRecord.from_raw(raw, line.decode("ascii"))
            except (ValueError, TypeError, OverflowError, RecursionError) as error:
                record_id = raw.get("id")
                url = raw.get("url")
                self.bad.append(Bad(
                    line, str(error),
                    record_id if isinstance(record_id, str) and _ID.match(record_id) else None,
                    url[:200] if isinstance(url, str) else None,
                ))
                return
            self.records.pop(record.id, None)
            if self.keep_lines or end is None:
                entry = Entry(line, record.spider, record.slot, record.reason, record.url, record.not_before)
            else:
                name = self._name
                entry = Entry(b"", name(record.spider), name(record.slot), name(record.reason), record.url,
                              record.not_before, end - len(line), len(line), zlib.crc32(line))
            self.records[record.id] = entry
            self.claims.pop(record.id, None)
            self.claimed_at.pop(record.id, None)
            return
        try:
            self._apply_change(raw)
        except ValueError as error:
            self.bad.append(Bad(line, str(error)))

    def _apply_change(self, raw: Any) -> None:
        if not isinstance(raw, dict) or len(raw) > 3:
            raise ValueError("not a park-file line")
        kind = next((key for key in ("done", "claim", "release") if key in raw), None)
        if kind is None or not set(raw) <= {kind, "by", "at"} or ("at" in raw and kind != "claim"):
            raise ValueError("not a park-file line")
        ids = raw.get(kind) if kind else None
        if not isinstance(ids, list) or len(ids) > MAX_IDS_PER_LINE or not all(
            isinstance(i, str) and _ID.match(i) for i in ids
        ):
            raise ValueError("not a park-file line")
        if kind == "done":
            for record_id in ids:
                self.records.pop(record_id, None)
                self.claims.pop(record_id, None)
                self.claimed_at.pop(record_id, None)
            return
        owner = Owner.from_raw(raw.get("by"))
        if kind == "claim":
            at = raw.get("at", 0.0)
            if isinstance(at, bool) or not isinstance(at, (int, float)) or not 0.0 <= at < 1e11:
                raise ValueError("claim line has a malformed time")
            for record_id in ids:
                if record_id in self.records:
                    self.claims[record_id] = owner
                    self.claimed_at[record_id] = float(at)
        else:
            for record_id in ids:
                if self.claims.get(record_id) == owner:
                    del self.claims[record_id]
                    self.claimed_at.pop(record_id, None)

    def empty(self) -> None:
        """Free the fold piecewise: dropping 100,000 entries in one call would hold the GIL for tens of ms."""
        for table in (self.records, self.claims, self.claimed_at):
            while table:
                for _ in range(min(512, len(table))):
                    table.popitem()
                time.sleep(0)
        self.bad = []
        self._names = {}

    def holds(self, record_id: str, now: float, judged: dict[Owner, bool]) -> bool:
        """Whether a live claim holds the record (``judged`` caches each owner's verdict)."""
        owner = self.claims.get(record_id)
        if owner is None:
            return False
        return claim_holds(owner, self.claimed_at.get(record_id, 0.0), now, judged)

    def free(self, now: float | None = None, judged: dict[Owner, bool] | None = None) -> Iterator[str]:
        """Ids of records no live claim holds, in file order."""
        now = time.time() if now is None else now
        judged = {} if judged is None else judged
        for record_id in self.records:
            if not self.holds(record_id, now, judged):
                yield record_id


LINE, LONG, TORN, TORN_LONG = "line", "long", "torn", "torn-long"
TAIL = (TORN, TORN_LONG)
"""Kinds of a last line without its newline: a later append may still end it."""


def _lines(fd: int, offset: int, complete: bool, end: int | None = None) -> Iterator[tuple[bytes, int, str]]:
    """(line, offset after it, kind) from ``offset`` to ``end`` (or the end of the file), read in chunks.

    A last line without its newline is yielded (as TORN) only when
    ``complete`` (under the lock: a torn write); otherwise a writer may still
    be at it. A line over MAX_LINE is yielded as its head (LONG, or
    TORN_LONG when it is that last line).
    """
    pending = b""
    skipping = False
    position = offset
    while True:
        size = _CHUNK if end is None else min(_CHUNK, end - position)
        chunk = os.pread(fd, size, position) if size > 0 else b""
        if not chunk:
            break
        base = position
        position += len(chunk)
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                break
            piece = chunk[start:newline + 1]
            start = newline + 1
            if skipping:
                yield pending, base + start, LONG
                pending, skipping = b"", False
                continue
            if len(pending) + len(piece) > MAX_LINE:
                yield (pending + piece)[:_TORN_HEAD], base + start, LONG
            else:
                yield pending + piece, base + start, LINE
            pending = b""
        if not skipping:
            pending += chunk[start:]
            if len(pending) > MAX_LINE:
                pending, skipping = pending[:_TORN_HEAD], True
    if pending and complete:
        yield pending, position, TORN_LONG if skipping else TORN


def _apply_line(fold: Fold, line: bytes, kind: str, end: int | None = None) -> None:
    if kind == LINE:
        fold.apply(line, end)
    else:
        fold.bad.append(bad_line(line, kind))


def bad_line(line: bytes, kind: str) -> Bad:
    """What a line that is not one (too long, or torn) is set aside as."""
    if kind in (LONG, TORN_LONG):
        return Bad(line + b"...\n", f"a line longer than {MAX_LINE} bytes")
    return Bad(line + b"\n", "torn line (no newline at the end)")


def summarize(entries: Iterable[Entry]) -> Iterator[tuple[str, int, dict[str, int], float]]:
    """(slot, count, reasons, earliest not_before) per slot, slots sorted."""
    by_slot: dict[str, list[Entry]] = {}
    for entry in entries:
        by_slot.setdefault(entry.slot, []).append(entry)
    for slot in sorted(by_slot):
        group = by_slot[slot]
        reasons: dict[str, int] = {}
        for entry in group:
            reasons[entry.reason] = reasons.get(entry.reason, 0) + 1
        yield slot, len(group), reasons, min(entry.not_before for entry in group)
