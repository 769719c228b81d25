"""The park file: requests not retried now, kept for a later run.

A JSON Lines file, one record per request. Requests carry cookies and auth
headers, so the file is private (0600); two runs writing it at once would
lose records, so a run holds an exclusive lock on ``FILE.lock``. A record is
appended with a single write of a whole line; removals rewrite the file to a
temporary one that replaces it, so a crash leaves either the old file or the
new one, never half a record. A torn last line left by a crash in the middle
of an append (a power cut, not a killed process) is skipped and kept aside
in ``FILE.torn`` rather than silently dropped.

No Scrapy here: the Scrapy side turns requests into the plain ``request``
dict and back.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, IO

__all__ = ["ParkFile", "ParkFileLocked", "ParkRecord", "decode_value", "encode_value", "iso", "parse_iso"]


class ParkFileLocked(RuntimeError):
    """Another run holds the park file."""


def iso(when: float) -> str:
    return datetime.fromtimestamp(when, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def encode_value(value: Any) -> Any:
    """A JSON-safe copy: bytes as base64, dicts with non-string keys as pairs.

    Raises TypeError for anything JSON cannot hold, so the caller can fall
    back to a URL-only record instead of writing a lossy one.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [encode_value(item) for item in value]
    if isinstance(value, Mapping):
        if all(isinstance(key, str) and not key.startswith("$") for key in value):
            return {key: encode_value(item) for key, item in value.items()}
        return {"$pairs": [[encode_value(key), encode_value(item)] for key, item in value.items()]}
    raise TypeError(f"{type(value).__name__} cannot be written to the park file")


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {"$b64"}:
            return base64.b64decode(value["$b64"])
        if set(value) == {"$pairs"}:
            return {_hashable(decode_value(key)): decode_value(item) for key, item in value["$pairs"]}
        return {key: decode_value(item) for key, item in value.items()}
    return value


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass
class ParkRecord:
    url: str
    slot: str
    reason: str
    """A short kind (``over_cap``, ``retries_exhausted``, ``budget_spent``, ``held_at_close``)."""
    attempts: int
    not_before: float
    """Wall-clock seconds (UTC epoch); written as ISO 8601."""
    request: dict[str, Any] | None
    """Scrapy's Request.to_dict(), JSON-encoded; None for a URL-only record."""
    spider: str = ""
    detail: str = ""
    """The give-up line's reason, for people."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def to_line(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "spider": self.spider,
                "url": self.url,
                "slot": self.slot,
                "reason": self.reason,
                "detail": self.detail,
                "attempts": self.attempts,
                "not_before": iso(self.not_before),
                "request": self.request,
            },
            separators=(",", ":"),
            ensure_ascii=True,
        ) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ParkRecord:
        raw = json.loads(line)
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
            raise ValueError("not a park record")
        request = raw.get("request")
        return cls(
            url=raw["url"],
            slot=str(raw.get("slot", "")),
            reason=str(raw.get("reason", "")),
            attempts=int(raw.get("attempts", 0)),
            not_before=parse_iso(str(raw["not_before"])),
            request=request if isinstance(request, dict) else None,
            spider=str(raw.get("spider", "")),
            detail=str(raw.get("detail", "")),
            id=str(raw.get("id") or uuid.uuid4().hex),
        )


def read_records(path: Path) -> tuple[dict[str, ParkRecord], list[str]]:
    """Records by id (a later line with the same id replaces an earlier one) and unreadable lines."""
    records: dict[str, ParkRecord] = {}
    bad: list[str] = []
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return records, bad
    for line in text.splitlines(keepends=True):
        if not line.strip():
            continue
        try:
            if not line.endswith("\n"):
                raise ValueError("torn line")
            record = ParkRecord.from_line(line)
        except (ValueError, TypeError, KeyError, OverflowError):
            bad.append(line if line.endswith("\n") else line + "\n")
            continue
        records.pop(record.id, None)
        records[record.id] = record
    return records, bad


def _open_private(path: Path, flags: int) -> int:
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


class ParkFile:
    """One run's exclusive handle on a park file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _open_private(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise ParkFileLocked(
                f"the park file {self.path} is in use by another run (lock {self.path.name}.lock); "
                "give this run its own RETRY_AFTER_PARK_FILE or wait for the other to finish"
            ) from None
        self._append: IO[str] | None = None
        records, bad = read_records(self.path)
        if bad:
            self._keep_aside(bad)
            self._rewrite(records.values())

    def __enter__(self) -> ParkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def torn_path(self) -> Path:
        return self.path.with_name(self.path.name + ".torn")

    def _keep_aside(self, lines: list[str]) -> None:
        fd = _open_private(self.torn_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        with os.fdopen(fd, "a", encoding="ascii") as torn:
            torn.writelines(lines)

    def records(self) -> dict[str, ParkRecord]:
        return read_records(self.path)[0]

    def add(self, record: ParkRecord) -> None:
        """Append one record in one write, flushed to disk before returning."""
        if self._append is None:
            fd = _open_private(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            self._append = os.fdopen(fd, "a", encoding="ascii")
        line = record.to_line()
        os.write(self._append.fileno(), line.encode("ascii"))
        os.fsync(self._append.fileno())

    def remove(self, ids: Iterable[str]) -> int:
        """Drop records by id, atomically; returns how many went."""
        gone = set(ids)
        if not gone:
            return 0
        records = self.records()
        kept = [record for key, record in records.items() if key not in gone]
        removed = len(records) - len(kept)
        if removed:
            self._rewrite(kept)
        return removed

    def clear(self) -> int:
        count = len(self.records())
        self._rewrite([])
        return count

    def _rewrite(self, records: Iterable[ParkRecord]) -> None:
        if self._append is not None:
            self._append.close()
            self._append = None
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = _open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.writelines(record.to_line() for record in records)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)

    def close(self) -> None:
        if self._append is not None:
            self._append.close()
            self._append = None
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1


def summarize(records: Iterable[ParkRecord]) -> Iterator[tuple[str, int, dict[str, int], float]]:
    """(slot, count, reasons, earliest not_before) per slot, slots sorted."""
    by_slot: dict[str, list[ParkRecord]] = {}
    for record in records:
        by_slot.setdefault(record.slot, []).append(record)
    for slot in sorted(by_slot):
        group = by_slot[slot]
        reasons: dict[str, int] = {}
        for record in group:
            reasons[record.reason] = reasons.get(record.reason, 0) + 1
        yield slot, len(group), reasons, min(record.not_before for record in group)
