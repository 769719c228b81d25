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

The parts: the record format and its bounds (``parkrecord``), the claim
owner and whether it lives (``parkowner``), the log folded (``parkfold``),
safe opening, locking and whole appends (``parklock``), setting aside and
compaction (``parkcompact``); this module is the handle and re-exports the
public names.

No Scrapy here: the Scrapy side turns requests into the plain ``request``
dict and back.
"""

from __future__ import annotations

import errno
import os
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .parkcompact import CompactingLog
from .parkfold import MAX_LINE, Bad, Entry, Fold, _apply_line, _lines, summarize
from .parkkept import KeptFold, fold_then_lock
from .parklock import (
    ParkFileError,
    _committed,
    _identity,
    _no_gc_pauses,
)
from .parkowner import Owner, _live_handles
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


@dataclass
class Claimed:
    records: list[ParkRecord]
    later: int
    """Free records of this spider left for later (due past the caller's horizon)."""
    bad: list[Bad]
    lines: list[tuple[float, str, bytes]] = field(default_factory=list)
    """With ``parse=False``: (not_before, id, line) per claimed record, instead of ``records``."""
    more: int = 0
    """Free records this claim would have taken but for its bounds: due now, left for the next claim."""


class ParkFile(CompactingLog):
    """A handle on a shared park file; each method is one locked operation, nothing held between."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        setting: str = "RETRY_AFTER_PARK_FILE",
        write: Callable[[int, bytes], int] = os.write,
        fsync: Callable[[int], None] = os.fsync,
        trusted_uid: int | None = None,
    ) -> None:
        super().__init__(path, setting=setting, write=write, fsync=fsync, trusted_uid=trusted_uid)
        self._kept: KeptFold | None = None
        _live_handles[self.owner.nonce] = self

    def __enter__(self) -> ParkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Claims this handle still holds are free for others from now on."""
        _live_handles.pop(self.owner.nonce, None)
        with self._mutex:
            kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    def add(self, record: ParkRecord) -> None:
        self.add_many([record])

    def add_many(self, records: Iterable[ParkRecord]) -> None:
        """Append records in one locked write and one fsync; ParkFileError if they are not all durable."""
        lines = [record.to_line().encode("ascii") for record in records]
        for line in lines:
            if len(line) > MAX_LINE:
                raise ParkFileError(errno.EFBIG, f"a park record of {len(line)} bytes is over {MAX_LINE}")
        self._append(b"".join(lines))

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

    def _read_then_lock(self, dir_fd: int, keep_lines: bool = True) -> tuple[int, Fold, int] | None:
        """The log folded: most of it read before taking the lock, the rest under it.

        The first descriptor stays open until the comparison under the lock,
        so its inode cannot be freed and reused by a compaction meanwhile
        (and offsets a fold without lines keeps are offsets in the locked file).
        """
        try:
            fd = self._open_in(dir_fd, self.path.name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fold, offset = Fold(keep_lines), 0
            before = _identity(os.fstat(fd))
            for line, offset, kind in _lines(fd, 0, complete=False, end=_committed(fd)):  # noqa: B007 (read after)
                _apply_line(fold, line, kind, offset)
            locked = self._locked(dir_fd, create=False)
            if locked is None:
                return None
            try:
                if _identity(os.fstat(locked)) != before:
                    fold.empty()
                    fold, offset = Fold(keep_lines), 0  # compacted meanwhile: read it all under the lock
                end = offset
                for line, end, kind in _lines(locked, offset, complete=True):  # noqa: B007 (read after)
                    _apply_line(fold, line, kind, end)
            except BaseException:
                os.close(locked)
                raise
            return locked, fold, end
        finally:
            os.close(fd)

    def claim(self, take: Callable[[Entry], bool | None], parse: bool = True,
              limit: int | None = None, max_bytes: int | None = None) -> Claimed:
        """Claim the free records ``take`` says yes to; None from it means "later", False "not ours".

        At most ``limit`` records and ``max_bytes`` of their lines (always one,
        however large); ``more`` counts those left for the next claim. One lock
        around reading the tail, choosing and appending the claim. With
        ``parse=False`` the claimed records come back as their lines (bytes: no
        objects for the garbage collector to walk), each already checked by the
        fold, and the fold keeps no lines: only the batch's are read again; that fold is kept
        while records are left for the next claim, which reads only what was appended since.
        """
        dir_fd = self._dir(False)
        if dir_fd is None:
            return Claimed([], 0, [])
        try:
            with self._mutex, _no_gc_pauses():
                if not parse:
                    return self._claim_kept(dir_fd, take, limit, max_bytes)
                state = self._read_then_lock(dir_fd, keep_lines=True)
                if state is None:
                    return Claimed([], 0, [])
                fd, fold, _ = state
                try:
                    return self._choose(fd, fold, take, parse, limit, max_bytes, list(fold.bad))
                finally:
                    os.close(fd)
                    fold.empty()
        finally:
            os.close(dir_fd)

    def _claim_kept(self, dir_fd: int, take: Callable[[Entry], bool | None],
                    limit: int | None, max_bytes: int | None) -> Claimed:
        """A claim of lines on the fold kept since the last one (``parkkept``), kept again while
        the claim leaves records for the next. Set-aside lines are reported once, when first read."""
        kept, self._kept = self._kept, None
        try:
            return self._claim_on(dir_fd, kept, take, limit, max_bytes)
        except _Stale:  # rewritten in place since (not by this package): folded again from the start
            return self._claim_on(dir_fd, None, take, limit, max_bytes)

    def _claim_on(self, dir_fd: int, kept: KeptFold | None, take: Callable[[Entry], bool | None],
                  limit: int | None, max_bytes: int | None) -> Claimed:
        state = fold_then_lock(self, dir_fd, kept)
        if state is None:
            return Claimed([], 0, [])
        fd, current, tail = state
        try:
            bad, current.fold.bad = current.fold.bad + tail, []
            claimed = self._choose(fd, current.fold, take, False, limit, max_bytes, bad, stale=current is kept)
        except BaseException:
            current.close()
            raise
        finally:
            os.close(fd)
        if claimed.more:
            self._kept = current
        else:
            current.close()
        return claimed

    def _choose(self, fd: int, fold: Fold, take: Callable[[Entry], bool | None], parse: bool,
                limit: int | None, max_bytes: int | None, bad: list[Bad], stale: bool = False) -> Claimed:
        """``stale``: the fold was kept from an earlier claim, and a line not found again where it
        was read raises ``_Stale`` (before anything is appended) instead of being skipped."""
        chosen: list[ParkRecord] = []
        lines: list[tuple[float, str, bytes]] = []
        later = more = size = 0
        for count, record_id in enumerate(list(fold.free())):
            if not count % 32:
                time.sleep(0)
            entry = fold.records[record_id]
            verdict = take(entry)
            if verdict is None:
                later += 1
                continue
            if not verdict:
                continue
            length = entry.size or len(entry.line)
            taken = len(chosen) + len(lines)
            if taken and ((limit is not None and taken >= limit)
                          or (max_bytes is not None and size + length > max_bytes)):
                more += 1
                continue
            line = entry.line or _reread(fd, entry)
            if line is None:
                if stale:
                    raise _Stale
                continue  # rewritten without the lock (not by this package): left free, not claimed
            if not parse:
                size += length
                lines.append((entry.not_before, record_id, line))
            else:
                try:
                    chosen.append(entry.record())
                    size += length
                except (ValueError, UnicodeDecodeError) as error:
                    bad.append(Bad(line, str(error), record_id, entry.url[:200]))
        ids = [record.id for record in chosen] or [record_id for _, record_id, _ in lines]
        if ids:
            _append_change(self, fd, "claim", ids, "claim records in")
        return Claimed(chosen, later, bad, lines, more)

    def clear(self, spider: str | None = None) -> int:
        """Drop every record (claimed or not), or only ``spider``'s (and those of no spider), in a
        file other spiders share: the file is removed when nothing is left. ParkFileError if there is none."""
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
                    ids = [key for key, entry in fold.records.items() if _of_spider(entry, spider)]
                    if len(ids) < len(fold.records):  # other spiders' records stay
                        _append_change(self, fd, "done", ids, "clear")
                        return len(ids)
                    if fold.bad:
                        self._keep_aside(fold.bad)
                    os.unlink(self.path.name, dir_fd=dir_fd)
                    self._fsync_dir(dir_fd)
                    return len(fold.records)
                finally:
                    os.close(fd)
        finally:
            os.close(dir_fd)


def _append_change(log: ParkFile, fd: int, kind: str, ids: list[str], doing: str) -> None:
    """One ``kind`` line for ``ids``, synced; cut back whole when the write fails."""
    end = log._seek_end(fd)
    try:
        log._write_all(fd, log._after_torn(fd, end) + log._changes(kind, ids))
        log._fsync(fd)
    except OSError as error:
        log._cut_back(fd, end)
        raise ParkFileError(error.errno or errno.EIO, f"could not {doing} {log.path}: {error}") from error


class _Stale(Exception):
    """A kept fold's record is no longer where it was read: the file was rewritten in place."""


def _reread(fd: int, entry: Entry) -> bytes | None:
    """A record's line read again by its offset, None unless it is the line folded (the same
    CRC-32): a file cleared in place and parked into again can hold another record there."""
    line = os.pread(fd, entry.size, entry.at)
    if len(line) != entry.size or zlib.crc32(line) != entry.crc:
        return None
    return line


def _of_spider(entry: Entry, spider: str | None) -> bool:
    """The record is ``spider``'s as a crawl of it would load it (a record of no spider is anyone's)."""
    return spider is None or not entry.spider or entry.spider == spider


def read_log(path: str | os.PathLike[str], trusted_uid: int | None = None) -> Fold:
    """The park file at ``path`` folded, read without its lock (for the command line)."""
    handle = ParkFile(path, trusted_uid=trusted_uid)
    try:
        handle.check()
        return handle.read()
    finally:
        handle.close()

