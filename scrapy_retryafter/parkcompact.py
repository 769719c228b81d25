"""The park log's upkeep: bad lines set aside in ``FILE.torn``, and compaction.

Compaction writes the folded log (live records, live claims) to a
``mkstemp`` file beside it and renames it over; the lock is held only to
copy what was appended meanwhile. With nothing left the file is removed.
No Scrapy here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from .parkfold import _CHUNK, LINE, MAX_IDS_PER_LINE, Bad, Fold, _apply_line, _lines
from .parklock import (
    LockedFile,
    ParkFileError,
    _committed,
    _identity,
    _no_gc_pauses,
)
from .parkowner import Owner, this_process_owner

_STALE_TEMPORARY = 3600.0
_CHILD_TIMEOUT = 600.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_CHILD_DISK_FULL = 3
"""The child's exit status for a full disk (or quota): the parent raises ENOSPC, not EIO."""
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = (
    "import sys; sys.path.append(sys.argv[1]); "
    "from scrapy_retryafter.parkcompact import _child_main; sys.exit(_child_main(*sys.argv[2:4]))"
)


class CompactingLog(LockedFile):
    """A park log with an owner: the change lines it appends, what it sets aside, and its rewrite."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        setting: str,
        write: Callable[[int, bytes], int] = os.write,
        fsync: Callable[[int], None] = os.fsync,
        trusted_uid: int | None = None,
    ) -> None:
        super().__init__(path, setting=setting, write=write, fsync=fsync, trusted_uid=trusted_uid)
        self.owner = this_process_owner()
        self._mutex = threading.Lock()
        self._tombstones = 0

    def _changes(self, kind: str, ids: list[str]) -> bytes:
        out = []
        for start in range(0, len(ids), MAX_IDS_PER_LINE):
            line: dict[str, Any] = {kind: ids[start:start + MAX_IDS_PER_LINE]}
            if kind != "done":
                line["by"] = self.owner.to_raw()
            if kind == "claim":
                line["at"] = round(time.time(), 3)
            out.append(json.dumps(line, separators=(",", ":")).encode("ascii") + b"\n")
        return b"".join(out)

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
        made = ""
        try:
            try:
                fd = self._open_in(dir_fd, self.torn_path.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            except OSError as error:
                # ENXIO: a FIFO or socket nobody reads, refused by open() itself before any check could.
                planted = isinstance(error, ParkFileError) or error.errno in (errno.EACCES, errno.EPERM, errno.ENXIO)
                if not planted or self.torn_refused is not None:
                    raise
                fd = self._torn_elsewhere(dir_fd, str(error))
                made = self._torn_name
            try:
                self._write_all(fd, b"".join(item.line if item.line.endswith(b"\n") else item.line + b"\n" for item in bad))
                self._fsync(fd)
            except BaseException:
                if made:  # made for these lines, which stay in the park file: no empty file left per try
                    with contextlib.suppress(OSError):
                        os.unlink(made, dir_fd=dir_fd)
                    self.torn_refused, self._torn_name = None, self.path.name + ".torn"
                raise
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)

    def _torn_elsewhere(self, dir_fd: int, why: str) -> int:
        """A set-aside file of our own (``FILE.XXXXXXXX.torn``, made with O_EXCL) when ``FILE.torn``
        is refused: one planted by another user in a shared directory must not stop set-aside."""
        fd, name = tempfile.mkstemp(prefix=f"{self.path.name}.", suffix=".torn", dir=self.path.parent)
        try:
            created = os.stat(os.path.basename(name), dir_fd=dir_fd, follow_symlinks=False)
            if _identity(created) != _identity(os.fstat(fd)):
                raise ParkFileError(errno.EXDEV, f"{self.path.parent} changed while setting lines aside")
        except BaseException:
            os.close(fd)
            raise
        self.torn_refused, self._torn_name = why, os.path.basename(name)
        return fd

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

    def compact_apart(self) -> int:
        """``compact()`` in a child process: the crawl's interpreter lock stays free for the reactor.

        Folding 100,000 lines in a thread holds the lock for most of a
        second in 5 ms slices; another process shares nothing with the crawl
        but the file and its ``flock``, which the log is built for. Claims of
        this process are judged there by pid and start time, so they stay.
        Where no child can be started, it compacts here.
        """
        self.check()
        if "python" not in os.path.basename(sys.executable or "").lower():
            return self.compact()  # embedded (uWSGI, a frozen app): no interpreter to start
        self._tombstones = 0  # on failure too: tried again after as many removals, not at every flush
        try:
            child = subprocess.run(
                [sys.executable, "-I", "-S", "-c", _CHILD, _PACKAGE_ROOT, os.fspath(self.path),
                 "" if self.trusted_uid is None else str(self.trusted_uid)],
                stdin=subprocess.DEVNULL, capture_output=True, timeout=_CHILD_TIMEOUT, check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return self.compact()
        if child.returncode != 0:
            why = child.stderr.decode("ascii", "replace").strip().splitlines()[-1:] or [f"exit {child.returncode}"]
            code = errno.ENOSPC if child.returncode == _CHILD_DISK_FULL else errno.EIO
            raise ParkFileError(code, f"could not compact {self.path}: {why[0][:500]}")
        try:
            return int(child.stdout.strip() or 0)
        except ValueError:
            return 0

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
        claims: dict[tuple[Owner, float], list[str]] = {}
        judged: dict[Owner, bool] = {}
        if release_own:
            judged[self.owner] = False
        now = time.time()
        for record_id, owner in fold.claims.items():
            if fold.holds(record_id, now, judged):
                claims.setdefault((owner, fold.claimed_at.get(record_id, 0.0)), []).append(record_id)
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
                kept: list[bytes] = []  # joined once: bytes += under the lock was quadratic
                for line, _, kind in _lines(locked, offset, complete=True):
                    set_aside = len(tail.bad)
                    _apply_line(tail, line, kind)
                    if kind == LINE and len(tail.bad) == set_aside:
                        kept.append(line)
                copied = b"".join(kept)
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

    def _write_folded(self, fd: int, fold: Fold, claims: dict[tuple[Owner, float], list[str]]) -> int:
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
        for (owner, at), ids in claims.items():
            for start in range(0, len(ids), MAX_IDS_PER_LINE):
                line = {"claim": ids[start:start + MAX_IDS_PER_LINE], "by": owner.to_raw(), "at": at}
                batch.append(json.dumps(line, separators=(",", ":")).encode("ascii") + b"\n")
        data = b"".join(batch)
        self._write_all(fd, data, offset)
        return offset + len(data)



def _child_main(path: str, trusted_uid: str = "") -> int:
    """The child of ``compact_apart``: compact the park file at ``path``, print the records left.

    ``trusted_uid`` is the parent's (empty for none), as digits: anything else is refused.
    """
    try:
        if trusted_uid and not (trusted_uid.isascii() and trusted_uid.isdigit() and len(trusted_uid) <= 10):
            raise ValueError(f"not a uid: {trusted_uid[:20]!r}")
        log = CompactingLog(path, setting="RETRY_AFTER_PARK_FILE",
                            trusted_uid=int(trusted_uid) if trusted_uid else None)
        log.check()
        print(log.compact())
    except (OSError, ValueError) as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return _CHILD_DISK_FULL if isinstance(error, OSError) and error.errno in _DISK_FULL else 1
    return 0
