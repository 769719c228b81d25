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

import contextlib
import errno
import gc
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from .parkfold import _CHUNK, LINE, MAX_IDS_PER_LINE, MAX_LINE, Bad, Entry, Fold, _apply_line, _lines, summarize
from .parkowner import Owner, _live_handles, owner_alive, this_process_owner
from .parkrecord import _ID, ParkRecord, decode_value, encode_value, iso, parse_iso

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
    "summarize",
]


_LOCK_TIMEOUT = 30.0
_STALE_TEMPORARY = 3600.0


class ParkFileError(OSError):
    """A park-file operation was refused or failed: nothing it was to write is durable."""

    def __str__(self) -> str:
        return str(self.strerror)


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

