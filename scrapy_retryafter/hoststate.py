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
Twisted; the clock is passed in. The records, their merge rules and the file
format are in hostrecord.py; this module owns the file.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from .hostrecord import (
    MAX_HOSTS,
    HostRecord,
    Pace,
    Quota,
    Refusal,
    checked_host,
    dump,
    merge,
    merge_all,
    parse,
    record_from_json,
    record_to_json,
)

__all__ = [
    "MAX_HOSTS", "HostMemory", "HostMemoryError", "HostRecord", "Pace", "Quota", "Refusal", "merge", "merge_all",
    "parse",
]

LOCK_TIMEOUT = 10.0
STALE_LOCK = 60.0
"""Without flock, a lock file this old was left by a process that died holding it."""
_RECORD_BYTES = 1024
_BAD_BYTES = 1 << 20


class HostMemoryError(OSError):
    """The memory file cannot be used as it is: a symlink, not a regular file, locked too long, unwritable."""


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
                mine[checked_host(host)] = record_from_json(record_to_json(record), now)  # bounded as if read back
            except (ValueError, KeyError):
                continue
        mine = merge_all(mine, now=now, max_age=self.max_age, max_hosts=self.max_hosts)
        if not mine:
            return 0
        try:
            missing = [d for d in (self.path.parent, *self.path.parent.parents) if not os.path.lexists(d)]
            for directory in reversed(missing):  # each 0700, as the park file's (mkdir(parents=True) follows the umask)
                directory.mkdir(mode=0o700, exist_ok=True)
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
            # Whoever can write it can refuse any host for a week: only our own, not writable by all.
            if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
                raise HostMemoryError(f"{self.path} belongs to another user (uid {info.st_uid}): not read")
            if info.st_mode & stat.S_IWOTH:
                raise HostMemoryError(f"{self.path} is writable by every user: not read (chmod o-w it)")
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
