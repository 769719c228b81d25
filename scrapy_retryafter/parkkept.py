"""The park log's fold kept between claims and brought up to date from where it stopped.

A claim takes a bounded batch, so a large backlog is claimed in several;
folding the whole file for each cost ten folds per 100,000 records. The kept
fold covers the file's whole lines up to ``offset``, and the next claim reads
only what was appended since, by this process or another. Its descriptor
stays open, so the inode cannot be freed and reused: a file at the name with
another identity (compacted, or removed and made again, by any process) is
folded from the start, as is one shorter than the offset or whose byte before
it is no newline (rewritten in place, not by this package); one rewritten so that
both checks pass (cleared and parked into again) is caught when a claimed line is
read again by its offset (its CRC-32 differs), and folded again. A torn last line
is never part of the fold: it is reported with each claim until an append
ends it, then folded as the line it became, as a full fold would. No Scrapy here.
"""

from __future__ import annotations

import errno
import os

from .parkfold import TAIL, Bad, Fold, _apply_line, _lines, bad_line
from .parklock import LockedFile, ParkFileError, _committed, _identity

__all__ = ["KeptFold", "fold_then_lock"]


class KeptFold:
    """A fold without lines (records kept by offset) of one park file, and how far it reaches."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.fold = Fold(keep_lines=False)
        self.offset = 0
        """End of the last whole line folded."""
        self.identity = _identity(os.fstat(fd))

    def read(self, fd: int, complete: bool) -> list[Bad]:
        """Fold the whole lines past ``offset`` of ``fd`` (this file); a torn last line comes back
        (with ``complete``, under the lock) instead of being folded."""
        end = None if complete else _committed(fd)
        for line, after, kind in _lines(fd, self.offset, complete=complete, end=end):
            if kind in TAIL:
                return [bad_line(line, kind)]
            _apply_line(self.fold, line, kind, after)
            self.offset = after
        return []

    def covers(self, fd: int) -> bool:
        """``fd`` (locked) is this file, grown only by appends past the offset as far as can be seen."""
        info = os.fstat(fd)
        if _identity(info) != self.identity or info.st_size < self.offset:
            return False
        return self.offset == 0 or os.pread(fd, 1, self.offset - 1) == b"\n"

    def close(self) -> None:
        os.close(self.fd)
        self.fold.empty()


def _current(log: LockedFile, dir_fd: int, kept: KeptFold | None) -> KeptFold | None:
    """``kept`` if the file at the name is still its file, else a new fold of the file there (None if none)."""
    if kept is not None:
        try:
            info = os.stat(log.path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None and _identity(info) == kept.identity:
            return kept
        kept.close()
    try:
        fd = log._open_in(dir_fd, log.path.name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return KeptFold(fd)
    except BaseException:
        os.close(fd)
        raise


def _reopen(log: LockedFile, dir_fd: int, locked: int) -> KeptFold:
    """A new fold of the locked file, on a descriptor of its own: a ``dup`` would share the
    ``flock`` and hold the lock for as long as the fold is kept."""
    fd = log._open_in(dir_fd, log.path.name, os.O_RDONLY)
    try:
        kept = KeptFold(fd)
    except BaseException:
        os.close(fd)
        raise
    if kept.identity != _identity(os.fstat(locked)):
        kept.close()
        raise ParkFileError(errno.EAGAIN, f"{log.path} was replaced under its lock (not by this package)")
    return kept


def fold_then_lock(log: LockedFile, dir_fd: int, kept: KeptFold | None) -> tuple[int, KeptFold, list[Bad]] | None:
    """The park file locked, its fold up to date, and a torn last line's Bad (if any).

    What was appended since ``kept`` is read mostly before taking the lock,
    the rest under it. ``kept`` is taken over: closed when it no longer
    covers the file, and on failure. None (``kept`` closed) if there is no file.
    """
    current = _current(log, dir_fd, kept)
    if current is None:
        return None
    try:
        current.read(current.fd, complete=False)
        locked = log._locked(dir_fd, create=False)
        if locked is None:
            current.close()
            return None
    except BaseException:
        current.close()
        raise
    owned: KeptFold | None = current
    try:
        if not current.covers(locked):
            owned = None
            current.close()
            current = owned = _reopen(log, dir_fd, locked)  # compacted or rewritten meanwhile: all of it under the lock
        return locked, current, current.read(locked, complete=True)
    except BaseException:
        if owned is not None:
            owned.close()
        os.close(locked)
        raise
