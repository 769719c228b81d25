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

import errno
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .parkfold import _CHUNK, LINE, MAX_IDS_PER_LINE, MAX_LINE, Bad, Entry, Fold, _apply_line, _lines, summarize
from .parklock import (
    LockedFile,
    ParkFileError,
    _committed,
    _identity,
    _no_gc_pauses,
)
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


_STALE_TEMPORARY = 3600.0


@dataclass
class Claimed:
    records: list[ParkRecord]
    later: int
    """Free records of this spider left for later (due past the caller's horizon)."""
    bad: list[Bad]


class ParkFile(LockedFile):
    """A handle on a shared park file; each method is one locked operation, nothing held between."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        setting: str = "RETRY_AFTER_PARK_FILE",
        write: Callable[[int, bytes], int] = os.write,
        fsync: Callable[[int], None] = os.fsync,
    ) -> None:
        super().__init__(path, setting=setting, write=write, fsync=fsync)
        self.owner = this_process_owner()
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

