"""What a project's crawls learned about each host, kept from one run to the next.

A host that refused the crawl for an hour refuses the next run too, and a host
whose pace was learned need not be learned again: every run of every tool pays
that cost otherwise. One JSON file per project (the caller picks the path,
beside the park file) holds per host a refusal (until when, and why), the
learned pace and the stated quota, each with the time it was learned.

Several crawls of one project may run at once, so the file is never simply
overwritten: a save takes the lock for that one operation, reads what is
there, merges per field (the refusal that ends last, the newest pace, the
newest quota), and replaces the file atomically. Everything read is bounded
and checked: a record that is not what it should be is set aside (its file
copied to ``FILE.bad``), never trusted and never a crash. Records age out after
``max_age`` seconds and the file keeps the ``max_hosts`` most recently updated
hosts. Nothing is created when nothing was learned. Pure: no Scrapy, no
Twisted; the clock is passed in.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_HOSTS", "HostMemory", "HostMemoryError", "HostRecord", "Pace", "Quota", "Refusal", "merge", "merge_all",
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
LOCK_TIMEOUT = 10.0
STALE_LOCK = 60.0
"""Without flock, a lock file this old was left by a process that died holding it."""
_RECORD_BYTES = 1024
_BAD_BYTES = 1 << 20


class HostMemoryError(OSError):
    """The memory file cannot be used as it is: a symlink, not a regular file, locked too long, unwritable."""


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


def _host(host: Any) -> str:
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
            records[_host(host)] = record_from_json(raw, now)
        except (ValueError, KeyError):
            bad += 1
    return records, bad


def dump(records: Mapping[str, HostRecord]) -> bytes:
    hosts = {host: record_to_json(records[host]) for host in sorted(records)}
    return json.dumps({"version": VERSION, "hosts": hosts}, ensure_ascii=True, allow_nan=False, indent=1).encode(
        "ascii"
    ) + b"\n"


# --------------------------------------------------------------------------
# the file
# --------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class HostMemory:
    """The per-host memory file of one project: ``load`` at the start of a crawl, ``save`` what it learned."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_age: float = 604800.0,
        max_hosts: int = MAX_HOSTS,
        clock: Callable[[], float] = time.time,
        write: Callable[[int, bytes], None] = _write_all,
        lock_timeout: float = LOCK_TIMEOUT,
    ) -> None:
        if not (max_age > 0 and math.isfinite(max_age)):
            raise ValueError(f"max_age must be a finite number of seconds > 0; got {max_age!r}")
        if max_hosts < 1:
            raise ValueError(f"max_hosts must be at least 1; got {max_hosts!r}")
        self.path = Path(path)
        self.max_age = max_age
        self.max_hosts = max_hosts
        self.clock = clock
        self._write = write
        self.lock_timeout = lock_timeout
        self.set_aside = 0
        """Records found unusable by the last load or save (copied to ``bad_path``)."""

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @property
    def bad_path(self) -> Path:
        return self.path.with_name(self.path.name + ".bad")

    def load(self) -> dict[str, HostRecord]:
        """The hosts' records still in force. Takes no lock: a save replaces the file whole.

        Raises HostMemoryError when the path is a symlink or not a regular file.
        """
        now = self.clock()
        raw = self._read()
        if raw is None:
            self.set_aside = 0
            return {}
        records, self.set_aside = parse(raw, now)
        return merge_all(records, now=now, max_age=self.max_age, max_hosts=self.max_hosts)

    def save(self, learned: Mapping[str, HostRecord]) -> int:
        """Merge what this run learned into the file; returns how many hosts it holds (0: nothing to save).

        Nothing is created or written when nothing was learned, or when the
        file already says all of it. Raises HostMemoryError (an OSError) when
        the file cannot be used or written; the file is then left as it was.
        """
        now = self.clock()
        mine: dict[str, HostRecord] = {}
        for host, record in learned.items():
            try:
                mine[_host(host)] = record_from_json(record_to_json(record), now)  # bounded as if read back
            except (ValueError, KeyError):
                continue
        mine = merge_all(mine, now=now, max_age=self.max_age, max_hosts=self.max_hosts)
        if not mine:
            return 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise HostMemoryError(f"cannot create the directory of {self.path}: {error.strerror or error}") from None
        with self._locked():
            now = self.clock()
            raw = self._read()
            theirs, self.set_aside = parse(raw, now) if raw is not None else ({}, 0)
            merged = merge_all(theirs, mine, now=now, max_age=self.max_age, max_hosts=self.max_hosts)
            if self.set_aside and raw is not None:
                self._replace(self.bad_path, raw[:_BAD_BYTES])
            current = merge_all(theirs, now=now, max_age=self.max_age, max_hosts=self.max_hosts)
            if raw is None or self.set_aside or merged != current:
                self._replace(self.path, dump(merged))
            return len(merged)

    def _read(self) -> bytes | None:
        try:
            # Non-blocking: a FIFO planted at the path must not hang the crawl until someone writes to it.
            flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(self.path, flags)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP or self.path.is_symlink():
                raise HostMemoryError(f"{self.path} is a symlink: the per-host memory is not followed through links") from None
            raise HostMemoryError(f"cannot read {self.path}: {error.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise HostMemoryError(f"{self.path} is not a regular file: move it away or set another path")
            # Never more than the largest file max_hosts records make: a longer one is cut, so garbage.
            left = self.max_hosts * _RECORD_BYTES + _BAD_BYTES + 1
            chunks = []
            while left > 0 and len(data := os.read(fd, min(left, 1 << 20))):
                chunks.append(data)
                left -= len(data)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _replace(self, target: Path, data: bytes) -> None:
        """Write to a private temporary file beside ``target``, flush it to disk, rename it over ``target``."""
        if target.is_symlink():
            raise HostMemoryError(f"{target} is a symlink: not replaced")
        if target.exists() and not target.is_file():
            raise HostMemoryError(f"{target} is not a regular file: move it away or set another path")
        try:
            fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        except OSError as error:
            raise HostMemoryError(f"cannot write beside {target}: {error.strerror or error}") from None
        try:
            try:
                os.fchmod(fd, 0o600)
                self._write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, target)
        except OSError as error:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            if isinstance(error, HostMemoryError):
                raise
            raise HostMemoryError(f"cannot write {target}: {error.strerror or error}") from error
        _sync_directory(target.parent)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            import fcntl
        except ImportError:  # no flock here: exclusive creation of the lock file instead
            with self._created_lock():
                yield
            return
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.lock_path, flags, 0o600)
        except OSError as error:
            raise HostMemoryError(f"cannot open the lock {self.lock_path}: {error.strerror}") from None
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise HostMemoryError(
                            f"{self.lock_path} stayed locked for {self.lock_timeout:g}s: another process is stuck"
                        ) from None
                    time.sleep(0.005)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @contextmanager
    def _created_lock(self) -> Iterator[None]:
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileExistsError:
                try:
                    if os.lstat(self.lock_path).st_mtime < time.time() - STALE_LOCK:
                        os.unlink(self.lock_path)
                        continue
                except FileNotFoundError:
                    continue
                if time.monotonic() >= deadline:
                    raise HostMemoryError(f"{self.lock_path} stayed locked for {self.lock_timeout:g}s") from None
                time.sleep(0.005)
        os.close(fd)
        try:
            yield
        finally:
            os.unlink(self.lock_path)


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (where a directory can be opened at all)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
