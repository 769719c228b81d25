"""The park file: requests not retried now, kept for a later run.

A JSON Lines log that any number of processes of one spider share on one
machine. Four kinds of line, read in order (a later line wins):

- a record: ``{"id", "url", "slot", "reason", "not_before", "request", ...}``;
  written again with the same id, it replaces the earlier one and frees it;
- ``{"claim": [ids], "by": owner}``: a process took these records to crawl;
- ``{"release": [ids], "by": owner}``: it gave them back;
- ``{"done": [ids]}``: they were handled and are gone.

Each change is one locked append (``flock`` on the park file itself: no lock
file), written whole (short writes looped, cut back on failure) and fsynced
before it returns. A claim whose owner died (pid and start time, boot id)
goes back to the pool. Compaction writes the folded log to a ``mkstemp``
file beside it and renames it over; the lock is held only to copy what was
appended meanwhile. With nothing left the file is removed.

Requests carry cookies and auth headers: the file is 0600, and a park file,
temporary file or ``.torn`` file that is a symlink, not a regular file, not
ours or hard-linked elsewhere is refused. Every field is hostile until
bounded; a line that is torn, too long or malformed is set aside in
``FILE.torn``, never silently dropped, never a crash.

No Scrapy here: the Scrapy side turns requests into the plain ``request``
dict and back.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import gc
import hashlib
import json
import os
import re
import socket
import stat
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "Fold",
    "Owner",
    "ParkFile",
    "ParkFileError",
    "ParkRecord",
    "decode_value",
    "encode_value",
    "iso",
    "parse_iso",
    "read_log",
]

MAX_LINE = 16 * 1024 * 1024
"""Longest line read or written; a request this large is parked by its URL."""
MAX_IDS_PER_LINE = 1000
_CHUNK = 1 << 20
_TORN_HEAD = 4096
_LOCK_TIMEOUT = 30.0
_STALE_TEMPORARY = 3600.0
_MAX_NOT_BEFORE = 253402300799.0  # 9999-12-31T23:59:59Z
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
_METHOD = re.compile(r"[A-Z][A-Z0-9_-]{0,31}\Z")
_LIMITS = {"slot": 1024, "reason": 64, "detail": 65536, "spider": 1024, "url": 65536}


class ParkFileError(OSError):
    """A park-file operation was refused or failed: nothing it was to write is durable."""

    def __str__(self) -> str:
        return str(self.strerror)


def iso(when: float) -> str:
    return datetime.fromtimestamp(when, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    """Seconds since the epoch; ValueError for anything outside 1970..9999 or not ISO 8601."""
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError("not_before is not an ISO 8601 time")
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    when = moment.timestamp()
    if not 0.0 <= when <= _MAX_NOT_BEFORE:
        raise ValueError(f"not_before {text!r} is outside 1970..9999")
    return when


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
    """The inverse of encode_value; ValueError for a malformed encoding."""
    try:
        if isinstance(value, list):
            return [decode_value(item) for item in value]
        if isinstance(value, dict):
            if set(value) == {"$b64"}:
                return base64.b64decode(value["$b64"], validate=True)
            if set(value) == {"$pairs"}:
                return {_hashable(decode_value(key)): decode_value(item) for key, item in value["$pairs"]}
            return {key: decode_value(item) for key, item in value.items()}
        return value
    except (TypeError, binascii.Error, RecursionError) as error:
        raise ValueError(f"malformed encoded value ({type(error).__name__})") from None


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _bounded_str(raw: dict[str, Any], key: str, default: str = "") -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string")
    if len(value) > _LIMITS[key]:
        raise ValueError(f"{key} is longer than {_LIMITS[key]} characters")
    return value


def _check_url(url: Any, where: str) -> None:
    if not isinstance(url, str) or len(url) > _LIMITS["url"]:
        raise ValueError(f"{where} is not a URL string")
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise ValueError(f"{where} has scheme {scheme[:16]!r}: only http and https are loaded")


def _check_request(request: dict[str, Any], url: str) -> None:
    """What Scrapy's request_from_dict would act on before any check of ours: bounded here."""
    _check_url(request.get("url"), "request.url")
    cls = request.get("_class")
    if cls is not None and (not isinstance(cls, str) or len(cls) > 256 or not _DOTTED.match(cls)):
        raise ValueError("request._class is not a dotted class name")
    for key in ("callback", "errback"):
        name = request.get(key)
        if name is not None and (not isinstance(name, str) or len(name) > 128 or not _NAME.match(name)
                                 or name.startswith("__")):
            raise ValueError(f"request.{key} is not a method name")
    method = request.get("method", "GET")
    if not isinstance(method, str) or not _METHOD.match(method):
        raise ValueError("request.method is not an HTTP method")
    priority = request.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**31:
        raise ValueError("request.priority is not a bounded integer")
    encoding = request.get("encoding", "utf-8")
    if not isinstance(encoding, str) or len(encoding) > 64:
        raise ValueError("request.encoding is not a codec name")
    for key in ("meta", "cb_kwargs"):
        if request.get(key) is not None and not isinstance(request[key], dict):
            raise ValueError(f"request.{key} is not a mapping")


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
        return cls.from_raw(json.loads(line), line)

    @classmethod
    def from_raw(cls, raw: Any, line: str = "") -> ParkRecord:
        """A record from its parsed line; ValueError naming the first malformed field."""
        if not isinstance(raw, dict) or "url" not in raw:
            raise ValueError("not a park record")
        url = raw["url"]
        _check_url(url, "url")
        record_id = raw.get("id")
        if record_id is None:
            # A hand-written record: an id that every reader derives alike.
            record_id = "h" + hashlib.sha256(line.encode("utf-8", "replace")).hexdigest()[:40]
        if not isinstance(record_id, str) or not _ID.match(record_id):
            raise ValueError("id is not 1-64 letters, digits, '-' or '_'")
        attempts = raw.get("attempts", 0)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 0 <= attempts <= 10**6:
            raise ValueError("attempts is not an integer in 0..1000000")
        request = raw.get("request")
        if request is not None:
            if not isinstance(request, dict):
                raise ValueError("request is not a mapping")
            _check_request(request, url)
        return cls(
            url=url,
            slot=_bounded_str(raw, "slot"),
            reason=_bounded_str(raw, "reason"),
            detail=_bounded_str(raw, "detail"),
            attempts=attempts,
            not_before=parse_iso(raw.get("not_before")),  # type: ignore[arg-type]
            request=request,
            spider=_bounded_str(raw, "spider"),
            id=record_id,
        )


@dataclass(frozen=True)
class Owner:
    """Who holds a claim: a process (host, boot, pid namespace, pid, start time) and one handle in it."""

    host: str
    boot: str
    ns: str
    pid: int
    start: int
    nonce: str

    def to_raw(self) -> dict[str, Any]:
        return {"host": self.host, "boot": self.boot, "ns": self.ns, "pid": self.pid, "start": self.start, "nonce": self.nonce}

    @classmethod
    def from_raw(cls, raw: Any) -> Owner:
        if not isinstance(raw, dict):
            raise ValueError("claim owner is not a mapping")
        texts = [raw.get(key) for key in ("host", "boot", "ns", "nonce")]
        numbers = [raw.get(key) for key in ("pid", "start")]
        if not all(isinstance(text, str) and len(text) <= 256 for text in texts):
            raise ValueError("claim owner has a malformed name")
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63 for n in numbers):
            raise ValueError("claim owner has a malformed pid or start time")
        return cls(texts[0], texts[1], texts[2], numbers[0], numbers[1], texts[3])  # type: ignore[arg-type]

    @property
    def process(self) -> tuple[str, str, str, int, int]:
        return (self.host, self.boot, self.ns, self.pid, self.start)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as text:
            return text.read(4096).strip()
    except OSError:
        return ""


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, -1 for no such process, None where unknown (no /proc)."""
    if not os.path.exists("/proc/self/stat"):
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as proc:
            stat_line = proc.read(4096)
    except FileNotFoundError:
        return -1
    except OSError:
        return None
    try:
        return int(stat_line.rsplit(b")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


_this_process: tuple[str, str, str, int, int] | None = None


def this_process() -> tuple[str, str, str, int, int]:
    global _this_process
    pid = os.getpid()
    if _this_process is None or _this_process[3] != pid:  # recomputed after a fork
        ns = ""
        try:
            ns = os.readlink("/proc/self/ns/pid")
        except OSError:
            pass
        _this_process = (
            socket.gethostname(), _read_text("/proc/sys/kernel/random/boot_id"), ns, pid, max(0, _start_time(pid) or 0),
        )
    return _this_process


_live_handles: weakref.WeakValueDictionary[str, ParkFile] = weakref.WeakValueDictionary()
"""Handles of this process by nonce: a claim of this process whose handle is gone is free."""


def owner_alive(owner: Owner) -> bool:
    """False only when sure: a dead or replaced process, another boot, or a closed handle of ours.

    A claim from another machine or pid namespace cannot be judged and is kept.
    """
    here = this_process()
    if owner.host != here[0] or owner.ns != here[2]:
        return True
    if owner.boot != here[1]:
        return False
    if owner.pid == here[3] and owner.start == here[4]:
        return owner.nonce in _live_handles
    if owner.pid <= 0:
        return False
    start = _start_time(owner.pid)
    if start is not None:
        return start == owner.start
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Entry:
    """A record as the log holds it: its line, and what choosing and summing it need."""

    line: bytes
    spider: str
    slot: str
    reason: str
    url: str
    not_before: float

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

    def __init__(self) -> None:
        self.records: dict[str, Entry] = {}
        self.claims: dict[str, Owner] = {}
        self.bad: list[Bad] = []
        self.lines = 0

    def apply(self, line: bytes) -> None:
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
            self.records[record.id] = Entry(line, record.spider, record.slot, record.reason, record.url, record.not_before)
            self.claims.pop(record.id, None)
            return
        try:
            self._apply_change(raw)
        except ValueError as error:
            self.bad.append(Bad(line, str(error)))

    def _apply_change(self, raw: Any) -> None:
        if not isinstance(raw, dict) or len(raw) > 2:
            raise ValueError("not a park-file line")
        kind = next((key for key in ("done", "claim", "release") if key in raw), None)
        ids = raw.get(kind) if kind else None
        if not isinstance(ids, list) or len(ids) > MAX_IDS_PER_LINE or not all(
            isinstance(i, str) and _ID.match(i) for i in ids
        ):
            raise ValueError("not a park-file line")
        if kind == "done":
            for record_id in ids:
                self.records.pop(record_id, None)
                self.claims.pop(record_id, None)
            return
        owner = Owner.from_raw(raw.get("by"))
        if kind == "claim":
            for record_id in ids:
                if record_id in self.records:
                    self.claims[record_id] = owner
        else:
            for record_id in ids:
                if self.claims.get(record_id) == owner:
                    del self.claims[record_id]

    def empty(self) -> None:
        """Free the fold piecewise: dropping 100,000 entries in one call would hold the GIL for tens of ms."""
        for table in (self.records, self.claims):
            while table:
                for _ in range(min(512, len(table))):
                    table.popitem()
                time.sleep(0)
        self.bad = []

    def free(self, alive: Callable[[Owner], bool] = owner_alive) -> Iterator[str]:
        """Ids of records no live owner holds, in file order."""
        judged: dict[Owner, bool] = {}
        for record_id in self.records:
            owner = self.claims.get(record_id)
            if owner is None:
                yield record_id
                continue
            if owner not in judged:
                judged[owner] = alive(owner)
            if not judged[owner]:
                yield record_id


LINE, LONG, TORN = "line", "long", "torn"


def _lines(fd: int, offset: int, complete: bool, end: int | None = None) -> Iterator[tuple[bytes, int, str]]:
    """(line, offset after it, kind) from ``offset`` to ``end`` (or the end of the file), read in chunks.

    A last line without its newline is yielded (as TORN) only when
    ``complete`` (under the lock: a torn write); otherwise a writer may still
    be at it. A line over MAX_LINE is yielded as its head (LONG).
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
        yield pending, position, LONG if skipping else TORN


def _apply_line(fold: Fold, line: bytes, kind: str) -> None:
    if kind == LONG:
        fold.bad.append(Bad(line + b"...\n", f"a line longer than {MAX_LINE} bytes"))
    elif kind == TORN:
        fold.bad.append(Bad(line + b"\n", "torn line (no newline at the end)"))
    else:
        fold.apply(line)


_gc_lock = threading.Lock()
_gc_users = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """No cyclic collection while the log is folded or rewritten.

    Folding allocates a container per line; in a worker thread that soon
    triggers a full collection of the whole process, which holds the GIL and
    stops the reactor with it (hundreds of ms with 20,000 requests in memory).
    Lines are freed by reference counting anyway.
    """
    global _gc_users, _gc_was_enabled
    with _gc_lock:
        if _gc_users == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0 and _gc_was_enabled:
                gc.enable()


def _committed(fd: int) -> int:
    """The file's size at a moment no writer holds the lock: bytes below it are whole and stay.

    (A writer that fails cuts the file back to where it started, under its
    lock: a read without the lock must not go past what was committed.)
    """
    assert fcntl is not None
    deadline = time.monotonic() + _LOCK_TIMEOUT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ParkFileError(errno.ETIMEDOUT, "the park file stayed locked too long") from None
            time.sleep(0.001)
    try:
        return os.fstat(fd).st_size
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return (info.st_dev, info.st_ino)


def _check_ours(info: os.stat_result, path: Path, setting: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ParkFileError(errno.EISDIR, f"{path} is a directory; {setting} must name a file")
    if not stat.S_ISREG(info.st_mode):
        raise ParkFileError(errno.EINVAL, f"{path} is not a regular file; refusing it ({setting})")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise ParkFileError(
            errno.EPERM,
            f"{path} belongs to another user (uid {info.st_uid}); refusing to read or extend it: "
            "requests it holds could be planted, and ours carry cookies",
        )
    if info.st_nlink > 1:
        raise ParkFileError(errno.EMLINK, f"{path} has {info.st_nlink} hard links; refusing a file that is also elsewhere")


def this_process_owner() -> Owner:
    host, boot, ns, pid, start = this_process()
    return Owner(host, boot, ns, pid, start, uuid.uuid4().hex[:16])


@dataclass
class Claimed:
    records: list[ParkRecord]
    later: int
    """Free records of this spider left for later (due past the caller's horizon)."""
    bad: list[Bad]


class ParkFile:
    """A handle on a shared park file; each method is one locked operation, nothing held between."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        setting: str = "RETRY_AFTER_PARK_FILE",
        write: Callable[[int, bytes], int] = os.write,
        fsync: Callable[[int], None] = os.fsync,
    ) -> None:
        self.path = Path(path)
        self.setting = setting
        self.owner = this_process_owner()
        self._write = write
        self._fsync = fsync
        self._mutex = threading.Lock()
        self._tombstones = 0
        _live_handles[self.owner.nonce] = self

    def __enter__(self) -> ParkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Claims this handle still holds are free for others from now on."""
        _live_handles.pop(self.owner.nonce, None)

    @property
    def torn_path(self) -> Path:
        return self.path.with_name(self.path.name + ".torn")

    # -- opening safely -------------------------------------------------------------------

    def check(self) -> None:
        """Refuse a park path that could never work or could be an attack, creating nothing."""
        if fcntl is None:
            raise ParkFileError(
                errno.ENOTSUP,
                "parking needs POSIX file locks (fcntl), which this platform lacks: "
                "set RETRY_AFTER_PARKING = False",
            )
        if not self.path.name or self.path.name in (".", ".."):
            raise ParkFileError(errno.EINVAL, f"{self.setting} {str(self.path)!r} does not name a file")
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise ParkFileError(errno.ENOTDIR, f"{self.path}: a part of it is not a directory ({self.setting})") from None
        if stat.S_ISLNK(info.st_mode):
            raise ParkFileError(errno.ELOOP, self._symlink_refused(self.path))
        _check_ours(info, self.path, self.setting)

    def _symlink_refused(self, path: Path) -> str:
        return (
            f"{path} is a symlink; refusing to follow it (whoever can write its directory could point it at "
            f"another file, which would be truncated or receive our cookies). Remove it or set {self.setting}"
        )

    def _dir(self, create: bool) -> int | None:
        parent = self.path.parent
        if create:
            try:
                parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            except FileExistsError:
                raise ParkFileError(errno.ENOTDIR, f"{parent} is not a directory ({self.setting})") from None
        try:
            return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if create:
                raise
            return None
        except NotADirectoryError:
            raise ParkFileError(errno.ENOTDIR, f"{parent} is not a directory ({self.setting})") from None

    def _open_in(self, dir_fd: int, name: str, flags: int) -> int:
        """Open ``name`` in the pinned directory: never through a symlink, never anything but our regular file."""
        path = self.path.with_name(name)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600, dir_fd=dir_fd)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ParkFileError(errno.ELOOP, self._symlink_refused(path)) from None
            if error.errno == errno.EISDIR:
                raise ParkFileError(errno.EISDIR, f"{path} is a directory; {self.setting} must name a file") from None
            raise
        try:
            _check_ours(os.fstat(fd), path, self.setting)
            if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
                os.fchmod(fd, 0o600)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _locked(self, dir_fd: int, create: bool) -> int | None:
        """The park file's fd, exclusively locked and still the file at its name; None if there is none."""
        deadline = time.monotonic() + _LOCK_TIMEOUT
        pause = 0.0005
        assert fcntl is not None
        while True:
            flags = os.O_RDWR | (os.O_CREAT if create else 0)
            try:
                fd = self._open_in(dir_fd, self.path.name, flags)
            except FileNotFoundError:
                return None
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise ParkFileError(
                                errno.ETIMEDOUT, f"the park file {self.path} stayed locked for {_LOCK_TIMEOUT:.0f} s"
                            ) from None
                        time.sleep(pause)
                        pause = min(pause * 2, 0.02)
                try:
                    now = os.stat(self.path.name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
                if now is not None and _identity(now) == _identity(os.fstat(fd)):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # compacted or removed meanwhile: lock the file now at the name

    # -- writing whole or not at all ------------------------------------------------------

    def _write_all(self, fd: int, data: bytes, offset: int | None = None) -> None:
        view = memoryview(data)
        while view:
            written = self._write(fd, bytes(view[:_CHUNK])) if offset is None else os.pwrite(fd, view[:_CHUNK], offset)
            if written <= 0:
                raise OSError(errno.EIO, "write wrote nothing")
            view = view[written:]
            if offset is not None:
                offset += written

    def _append(self, data: bytes, create: bool = True) -> None:
        """One locked append of whole lines, durable on return; on failure the file is cut back."""
        if not data:
            return
        dir_fd = self._dir(create)
        if dir_fd is None:
            return
        try:
            fd = self._locked(dir_fd, create)
            if fd is None:
                return
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # a torn line stays a line of its own
                os.lseek(fd, size, os.SEEK_SET)
                try:
                    self._write_all(fd, data)
                    self._fsync(fd)
                except OSError as error:
                    self._cut_back(fd, size)
                    if size == 0:
                        with contextlib.suppress(OSError):
                            os.unlink(self.path.name, dir_fd=dir_fd)  # created for this write: nothing left behind
                    raise ParkFileError(error.errno or errno.EIO, f"could not write the park file {self.path}: "
                                        f"{error.strerror or error}") from error
            finally:
                os.close(fd)
            if size == 0:
                self._fsync_dir(dir_fd)
        finally:
            os.close(dir_fd)

    def _cut_back(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError:
            pass  # the next append starts on a new line; the torn part is set aside

    def _fsync_dir(self, dir_fd: int) -> None:
        try:
            os.fsync(dir_fd)
        except OSError:
            pass

    def add(self, record: ParkRecord) -> None:
        self.add_many([record])

    def add_many(self, records: Iterable[ParkRecord]) -> None:
        """Append records in one locked write and one fsync; ParkFileError if they are not all durable."""
        lines = [record.to_line().encode("ascii") for record in records]
        for line in lines:
            if len(line) > MAX_LINE:
                raise ParkFileError(errno.EFBIG, f"a park record of {len(line)} bytes is over {MAX_LINE}")
        self._append(b"".join(lines))

    def _changes(self, kind: str, ids: list[str]) -> bytes:
        out = []
        for start in range(0, len(ids), MAX_IDS_PER_LINE):
            line: dict[str, Any] = {kind: ids[start:start + MAX_IDS_PER_LINE]}
            if kind != "done":
                line["by"] = self.owner.to_raw()
            out.append(json.dumps(line, separators=(",", ":")).encode("ascii") + b"\n")
        return b"".join(out)

    def done(self, ids: Iterable[str]) -> None:
        """The records are handled: gone for every process (compacted away later)."""
        with _no_gc_pauses():
            ids = [i for i in ids if _ID.match(i)]
            self._append(self._changes("done", ids), create=False)
        self._tombstones += len(ids)

    def release(self, ids: Iterable[str]) -> None:
        self._append(self._changes("release", [i for i in ids if _ID.match(i)]), create=False)

    @property
    def tombstones(self) -> int:
        """Records this handle marked done since it last compacted."""
        return self._tombstones

    # -- reading and claiming -------------------------------------------------------------

    def read(self) -> Fold:
        """A snapshot without the lock (for people: a writer's last line may be missing)."""
        fold = Fold()
        dir_fd = self._dir(False)
        if dir_fd is None:
            return fold
        try:
            try:
                fd = self._open_in(dir_fd, self.path.name, os.O_RDONLY)
            except FileNotFoundError:
                return fold
            try:
                for line, _, kind in _lines(fd, 0, complete=False, end=_committed(fd)):
                    _apply_line(fold, line, kind)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        return fold

    def _read_then_lock(self, dir_fd: int) -> tuple[int, Fold, int] | None:
        """The log folded: most of it read before taking the lock, the rest under it.

        The first descriptor stays open until the comparison under the lock,
        so its inode cannot be freed and reused by a compaction meanwhile.
        """
        try:
            fd = self._open_in(dir_fd, self.path.name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fold, offset = Fold(), 0
            before = _identity(os.fstat(fd))
            for line, offset, kind in _lines(fd, 0, complete=False, end=_committed(fd)):  # noqa: B007 (read after)
                _apply_line(fold, line, kind)
            locked = self._locked(dir_fd, create=False)
            if locked is None:
                return None
            try:
                if _identity(os.fstat(locked)) != before:
                    fold, offset = Fold(), 0  # compacted meanwhile: read it all under the lock
                end = offset
                for line, end, kind in _lines(locked, offset, complete=True):  # noqa: B007 (read after)
                    _apply_line(fold, line, kind)
            except BaseException:
                os.close(locked)
                raise
            return locked, fold, end
        finally:
            os.close(fd)

    def claim(self, take: Callable[[Entry], bool | None]) -> Claimed:
        """Claim the free records ``take`` says yes to; None from it means "later", False "not ours".

        One lock around reading the tail, choosing and appending the claim.
        """
        dir_fd = self._dir(False)
        if dir_fd is None:
            return Claimed([], 0, [])
        try:
            with self._mutex, _no_gc_pauses():
                state = self._read_then_lock(dir_fd)
                if state is None:
                    return Claimed([], 0, [])
                fd, fold, _ = state
                try:
                    chosen: list[ParkRecord] = []
                    later = 0
                    bad = list(fold.bad)
                    for count, record_id in enumerate(list(fold.free())):
                        if not count % 32:
                            time.sleep(0)
                        entry = fold.records[record_id]
                        verdict = take(entry)
                        if verdict is None:
                            later += 1
                        elif verdict:
                            try:
                                chosen.append(entry.record())
                            except (ValueError, UnicodeDecodeError) as error:
                                bad.append(Bad(entry.line, str(error), record_id, entry.url[:200]))
                    if chosen:
                        size = os.fstat(fd).st_size
                        os.lseek(fd, size, os.SEEK_SET)
                        try:
                            self._write_all(fd, self._changes("claim", [record.id for record in chosen]))
                            self._fsync(fd)
                        except OSError as error:
                            self._cut_back(fd, size)
                            raise ParkFileError(error.errno or errno.EIO,
                                                f"could not claim records in {self.path}: {error}") from error
                    return Claimed(chosen, later, bad)
                finally:
                    os.close(fd)
                    fold.empty()
        finally:
            os.close(dir_fd)

    # -- setting aside and compacting -----------------------------------------------------

    def set_aside(self, bad: list[Bad]) -> None:
        """Move lines to FILE.torn: written and fsynced there before they leave the park file."""
        if not bad:
            return
        self._keep_aside(bad)
        ids = [item.id for item in bad if item.id]
        if ids:
            self._append(self._changes("done", ids), create=False)

    def _keep_aside(self, bad: list[Bad]) -> None:
        dir_fd = self._dir(True)
        assert dir_fd is not None
        try:
            fd = self._open_in(dir_fd, self.torn_path.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                self._write_all(fd, b"".join(item.line if item.line.endswith(b"\n") else item.line + b"\n" for item in bad))
                self._fsync(fd)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)

    def compact(self, release_own: bool = False) -> int:
        """Rewrite the log as its live records and live claims; remove it when nothing is left.

        The rewrite is built before the lock; under it, only lines appended
        meanwhile are copied. Returns the number of records left.
        """
        dir_fd = self._dir(False)
        if dir_fd is None:
            return 0
        try:
            with self._mutex, _no_gc_pauses():
                self._tombstones = 0
                return self._compact(dir_fd, release_own)
        finally:
            os.close(dir_fd)

    def _compact(self, dir_fd: int, release_own: bool) -> int:
        try:
            snapshot = self._open_in(dir_fd, self.path.name, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            # Open until the comparison under the lock: its inode cannot be reused meanwhile.
            return self._compact_from(dir_fd, snapshot, release_own)
        finally:
            os.close(snapshot)

    def _compact_from(self, dir_fd: int, fd: int, release_own: bool) -> int:
        fold = Fold()
        try:
            return self._compact_fold(dir_fd, fd, release_own, fold)
        finally:
            fold.empty()

    def _compact_fold(self, dir_fd: int, fd: int, release_own: bool, fold: Fold) -> int:
        offset = 0
        before = _identity(os.fstat(fd))
        for line, offset, kind in _lines(fd, 0, complete=False, end=_committed(fd)):  # noqa: B007 (read after)
            _apply_line(fold, line, kind)
        mine = self.owner
        claims: dict[Owner, list[str]] = {}
        judged: dict[Owner, bool] = {}
        for record_id, owner in fold.claims.items():
            if owner not in judged:
                judged[owner] = not (release_own and owner == mine) and owner_alive(owner)
            if judged[owner]:
                claims.setdefault(owner, []).append(record_id)
        if fold.bad:
            self._keep_aside(fold.bad)
        temporary, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            created = os.stat(os.path.basename(name), dir_fd=dir_fd, follow_symlinks=False)
            if _identity(created) != _identity(os.fstat(temporary)):
                raise ParkFileError(errno.EXDEV, f"{self.path.parent} changed under the compaction")
            size = self._write_folded(temporary, fold, claims)
            self._fsync(temporary)
            locked = self._locked(dir_fd, create=False)
            if locked is None:
                return 0
            try:
                if _identity(os.fstat(locked)) != before:
                    return len(fold.records)  # another process compacted meanwhile: its file stands
                tail = Fold()
                copied = b""
                for line, _, kind in _lines(locked, offset, complete=True):
                    set_aside = len(tail.bad)
                    _apply_line(tail, line, kind)
                    if kind == LINE and len(tail.bad) == set_aside:
                        copied += line
                if tail.bad:
                    self._keep_aside(tail.bad)
                self._remove_stale_temporaries(dir_fd, os.path.basename(name))
                left = len(fold.records) + len(tail.records)
                if left == 0 and not copied.strip():
                    os.unlink(self.path.name, dir_fd=dir_fd)
                    self._fsync_dir(dir_fd)
                    return 0
                self._write_all(temporary, copied, size)
                self._fsync(temporary)
                os.rename(os.path.basename(name), self.path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                name = ""
                self._fsync_dir(dir_fd)
                return left
            finally:
                os.close(locked)
        finally:
            os.close(temporary)
            if name:
                try:
                    os.unlink(os.path.basename(name), dir_fd=dir_fd)
                except OSError:
                    pass

    def _remove_stale_temporaries(self, dir_fd: int, own: str) -> None:
        """Temporary files of compactions killed half-way (an hour old, ours, regular): removed."""
        prefix, now = f".{self.path.name}.", time.time()
        try:
            names = os.listdir(dir_fd)
        except OSError:
            return
        for entry in names:
            if entry == own or not (entry.startswith(prefix) and entry.endswith(".tmp")):
                continue
            try:
                info = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
                if (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
                        and now - info.st_mtime > _STALE_TEMPORARY):
                    os.unlink(entry, dir_fd=dir_fd)
            except OSError:
                continue

    def _write_folded(self, fd: int, fold: Fold, claims: dict[Owner, list[str]]) -> int:
        offset = 0
        batch: list[bytes] = []
        batched = 0
        for entry in fold.records.values():
            batch.append(entry.line)
            batched += len(entry.line)
            if not len(batch) % 256:
                time.sleep(0)
            if batched >= _CHUNK:
                data = b"".join(batch)
                self._write_all(fd, data, offset)
                offset += len(data)
                batch, batched = [], 0
        for owner, ids in claims.items():
            for start in range(0, len(ids), MAX_IDS_PER_LINE):
                line = {"claim": ids[start:start + MAX_IDS_PER_LINE], "by": owner.to_raw()}
                batch.append(json.dumps(line, separators=(",", ":")).encode("ascii") + b"\n")
        data = b"".join(batch)
        self._write_all(fd, data, offset)
        return offset + len(data)

    def clear(self) -> int:
        """Drop every record (claimed or not); the file is removed. ParkFileError if there is none."""
        dir_fd = self._dir(False)
        missing = ParkFileError(errno.ENOENT, f"no park file at {self.path}")
        if dir_fd is None:
            raise missing
        try:
            with self._mutex:
                state = self._read_then_lock(dir_fd)
                if state is None:
                    raise missing
                fd, fold, _ = state
                try:
                    if fold.bad:
                        self._keep_aside(fold.bad)
                    os.unlink(self.path.name, dir_fd=dir_fd)
                    self._fsync_dir(dir_fd)
                    return len(fold.records)
                finally:
                    os.close(fd)
        finally:
            os.close(dir_fd)


def read_log(path: str | os.PathLike[str]) -> Fold:
    """The park file at ``path`` folded, read without its lock (for the command line)."""
    handle = ParkFile(path)
    try:
        handle.check()
        return handle.read()
    finally:
        handle.close()


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
