"""One host's record in the per-host memory, the merge rules, and the file format read as hostile.

Pure: no Scrapy, no Twisted, no file access (hoststate.py owns the file).
A record holds a refusal (until when, and why), the learned pace and the
stated quota, each with the time it was learned. Merging two records takes,
per field, the refusal that ends last, the newest pace and the newest quota,
so processes that save in any order agree. Everything parsed is bounded and
checked; a record that is not what it should be counts as set aside.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_HOSTS", "HostRecord", "Pace", "Quota", "Refusal", "checked_host", "dump", "merge", "merge_all", "parse",
    "record_from_json", "record_to_json",
]

VERSION = 1
MAX_HOSTS = 10_000
MAX_REFUSAL = 7 * 86400.0
"""No refusal is kept longer than the longest a header is believed."""
MAX_RATE = 1e6
MIN_RATE = 1e-6
"""Slower than one request in eleven days is no pace: a refusal says that better."""
MAX_QUOTA = 1e9
MIN_WINDOW = 0.001
MAX_WINDOW = 7 * 86400.0
CLOCK_SLACK = 86400.0
"""How far in the future another process's clock may put a record's time before it is pulled back to now."""
MAX_HOST = 512
MAX_REASON = 200


@dataclass(frozen=True)
class Refusal:
    until: float
    """Epoch seconds: nothing is sent to the host before."""
    reason: str
    at: float
    """When the refusal was learned."""

    def key(self) -> tuple[float, str, float]:
        return (self.until, self.reason, self.at)


@dataclass(frozen=True)
class Pace:
    rate: float
    """Requests per second the host was learned to take."""
    at: float

    def key(self) -> tuple[float, float]:
        # Newest wins; of two learned at the same instant, the slower.
        return (self.at, -self.rate)


@dataclass(frozen=True)
class Quota:
    quota: float
    window: float
    """Seconds."""
    at: float

    def key(self) -> tuple[float, float, float]:
        return (self.at, -self.quota, self.window)


@dataclass(frozen=True)
class HostRecord:
    refusal: Refusal | None = None
    pace: Pace | None = None
    quota: Quota | None = None

    @property
    def updated(self) -> float:
        """When anything in the record was last learned."""
        return max((part.at for part in (self.refusal, self.pace, self.quota) if part is not None), default=0.0)

    def __bool__(self) -> bool:
        return self.refusal is not None or self.pace is not None or self.quota is not None

    def refused_until(self, now: float) -> float | None:
        """The end of a refusal still in force, or None."""
        if self.refusal is not None and self.refusal.until > now:
            return self.refusal.until
        return None


def _later(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a if a.key() >= b.key() else b


def merge(a: HostRecord, b: HostRecord) -> HostRecord:
    """Per field, the record two processes agree on whatever order they write in.

    The refusal that ends last, the newest pace, the newest quota: each is a
    maximum under a total order, so merging is commutative, associative and
    idempotent, and no process's newer field is lost to an older one.
    """
    return HostRecord(_later(a.refusal, b.refusal), _later(a.pace, b.pace), _later(a.quota, b.quota))


def prune(record: HostRecord, now: float, max_age: float) -> HostRecord:
    """Without what ran out: a refusal that ended, a pace or quota learned more than ``max_age`` ago."""
    refusal = record.refusal if record.refusal is not None and record.refusal.until > now else None
    if refusal is not None and now - refusal.at > max_age:
        refusal = None
    pace = record.pace if record.pace is not None and now - record.pace.at <= max_age else None
    quota = record.quota if record.quota is not None and now - record.quota.at <= max_age else None
    return HostRecord(refusal, pace, quota)


def merge_all(
    *sources: Mapping[str, HostRecord], now: float, max_age: float, max_hosts: int = MAX_HOSTS
) -> dict[str, HostRecord]:
    """All sources merged host by host, run-out fields dropped, the ``max_hosts`` most recently updated kept."""
    merged: dict[str, HostRecord] = {}
    for source in sources:
        for host, record in source.items():
            # Pruned before merging: a run-out field must not win a merge and take a live one down with it.
            record = prune(record, now, max_age)
            merged[host] = merge(merged[host], record) if host in merged else record
    kept = {host: record for host, record in merged.items() if record}
    if len(kept) > max_hosts:
        newest = sorted(kept, key=lambda host: (kept[host].updated, host), reverse=True)[:max_hosts]
        kept = {host: kept[host] for host in newest}
    return kept


# --------------------------------------------------------------------------
# the file format, read as hostile
# --------------------------------------------------------------------------


class _Bad(ValueError):
    pass


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad("not a number")
    try:
        number = float(value)
    except OverflowError:
        raise _Bad("too large") from None
    if not math.isfinite(number) or number < 0:
        raise _Bad("not a finite number >= 0")
    return number


def _learned_at(value: Any, now: float) -> float:
    """When something was learned, as written: a day ahead of this clock at most (another process's skew)."""
    at = _finite(value)
    if at > now + CLOCK_SLACK:
        raise _Bad("learned in the future")
    return at


def _stamp(value: Any, now: float) -> float:
    """Never in the future, so a fast clock cannot win every merge."""
    return min(_learned_at(value, now), now)


def _refusal(raw: Any, now: float) -> Refusal:
    if not isinstance(raw, dict) or not isinstance(raw.get("reason", ""), str):
        raise _Bad("refusal")
    at = _learned_at(raw.get("at"), now)
    # Bounded by the time it was learned, not by now: a refusal never renews itself from run to run.
    until = min(_finite(raw.get("until")), at + MAX_REFUSAL, now + MAX_REFUSAL)
    return Refusal(until, raw.get("reason", "")[:MAX_REASON], min(at, now))


def _pace(raw: Any, now: float) -> Pace:
    if not isinstance(raw, dict):
        raise _Bad("pace")
    rate = _finite(raw.get("rate"))
    if rate <= 0:
        raise _Bad("pace rate 0")
    return Pace(min(max(rate, MIN_RATE), MAX_RATE), _stamp(raw.get("at"), now))


def _quota(raw: Any, now: float) -> Quota:
    if not isinstance(raw, dict):
        raise _Bad("quota")
    quota, window = _finite(raw.get("quota")), _finite(raw.get("window"))
    if quota <= 0 or window <= 0:
        raise _Bad("quota or window 0")
    return Quota(min(quota, MAX_QUOTA), min(max(window, MIN_WINDOW), MAX_WINDOW), _stamp(raw.get("at"), now))


def checked_host(host: Any) -> str:
    if not isinstance(host, str) or not 0 < len(host) <= MAX_HOST or not host.isprintable():
        raise _Bad("host")
    return host


def record_from_json(raw: Any, now: float) -> HostRecord:
    """One record as the file holds it, checked and bounded; raises ValueError for garbage."""
    if not isinstance(raw, dict):
        raise _Bad("record")
    return HostRecord(
        _refusal(raw["refusal"], now) if raw.get("refusal") is not None else None,
        _pace(raw["pace"], now) if raw.get("pace") is not None else None,
        _quota(raw["quota"], now) if raw.get("quota") is not None else None,
    )


def record_to_json(record: HostRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"updated": record.updated}
    if record.refusal is not None:
        out["refusal"] = {"until": record.refusal.until, "reason": record.refusal.reason, "at": record.refusal.at}
    if record.pace is not None:
        out["pace"] = {"rate": record.pace.rate, "at": record.pace.at}
    if record.quota is not None:
        out["quota"] = {"quota": record.quota.quota, "window": record.quota.window, "at": record.quota.at}
    return out


def parse(text: bytes, now: float) -> tuple[dict[str, HostRecord], int]:
    """The records of a file's bytes, and how many were set aside (the whole file counts as one)."""
    try:
        # Integers as floats: a 5,000-digit number is one bad record, not a whole file Python will not read.
        data = json.loads(text.decode("utf-8"), parse_int=float)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}, 1
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("hosts"), dict):
        return {}, 1
    records: dict[str, HostRecord] = {}
    bad = 0
    for host, raw in data["hosts"].items():
        try:
            records[checked_host(host)] = record_from_json(raw, now)
        except (ValueError, KeyError):
            bad += 1
    return records, bad


def dump(records: Mapping[str, HostRecord]) -> bytes:
    hosts = {host: record_to_json(records[host]) for host in sorted(records)}
    return json.dumps({"version": VERSION, "hosts": hosts}, ensure_ascii=True, allow_nan=False, indent=1).encode(
        "ascii"
    ) + b"\n"
