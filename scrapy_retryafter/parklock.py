"""The park file's bytes on disk: opened safely, locked with ``flock``, appended whole and fsynced.

Refuses a path that is a symlink, not a regular file, not ours or hard-linked
elsewhere (the file holds cookies and auth headers: it is 0600), and a path
another user could redirect: every directory on the way to it, as written
and with symlinks resolved, must be ours or root's and writable by nobody
else (a sticky directory such as /tmp aside; a group-writable one only when
the group is our own private group), as ssh's StrictModes asks. A failed
append is cut back to where it started, under the lock, so readers never see
half a change. No Scrapy here.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import grp
import os
import pwd
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from .parkfold import _CHUNK

_LOCK_TIMEOUT = 30.0
_NAME_MAX = 255
_TEMPORARY_EXTRA = len(".") + len(".XXXXXXXX.tmp")
"""mkstemp's name beside the park file: a longer name parked but never compacted (ENAMETOOLONG)."""


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


def _trusted(uid: int, trusted_uid: int | None) -> bool:
    """``uid`` is ours, or the project owner's when we run as root (who runs that user's code anyway)."""
    euid = os.geteuid()
    return uid == euid or (euid == 0 and trusted_uid is not None and uid == trusted_uid)


def _check_ours(info: os.stat_result, path: Path, setting: str, trusted_uid: int | None = None) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ParkFileError(errno.EISDIR, f"{path} is a directory; {setting} must name a file")
    if not stat.S_ISREG(info.st_mode):
        raise ParkFileError(errno.EINVAL, f"{path} is not a regular file; refusing it ({setting})")
    if hasattr(os, "geteuid") and not _trusted(info.st_uid, trusted_uid):
        raise ParkFileError(
            errno.EPERM,
            f"{path} belongs to another user (uid {info.st_uid}); refusing to read or extend it: "
            "requests it holds could be planted, and ours carry cookies",
        )
    if info.st_nlink > 1:
        raise ParkFileError(errno.EMLINK, f"{path} has {info.st_nlink} hard links; refusing a file that is also elsewhere")


@functools.lru_cache(maxsize=64)
def _private_group(gid: int) -> bool:
    """``gid`` is the user-private group of this user (umask 002 systems): nobody else is in it."""
    try:
        user = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except (KeyError, OSError):
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _unsafe_directory(directory: Path, info: os.stat_result, trusted_uid: int | None = None) -> str | None:
    mode = info.st_mode
    if info.st_uid != 0 and not _trusted(info.st_uid, trusted_uid):
        why = f"it belongs to another user (uid {info.st_uid}), who could replace what is in it"
        if os.geteuid() == 0:  # typically a container's root over a bind-mounted project
            why += (f" (this crawl runs as root and trusts only the owner of its project directory, the one "
                    f"holding scrapy.cfg: run it as uid {info.st_uid}, e.g. docker run --user {info.st_uid})")
        return why
    if mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH:
        return f"it is writable by every user (mode {stat.S_IMODE(mode):04o}) and has no sticky bit"
    if mode & stat.S_IWGRP and not _private_group(info.st_gid):
        return f"it is writable by group {info.st_gid} (mode {stat.S_IMODE(mode):04o}) and has no sticky bit"
    return None


def check_directories(path: Path, setting: str, trusted_uid: int | None = None) -> None:
    """Refuse ``path``'s directories if another user could swap them (each as written, and resolved).

    Directories that do not exist yet are skipped (they will be created ours and 0700).
    ``trusted_uid`` counts as ours when we run as root (the project's owner).
    """
    absolute = Path(os.path.abspath(path)).parent
    resolved = Path(os.path.realpath(absolute))
    for chain, follow in ((absolute, False), (resolved, True)):
        for directory in (chain, *chain.parents):
            try:
                info = os.stat(directory) if follow else os.lstat(directory)
            except FileNotFoundError:
                continue
            except OSError as error:
                raise ParkFileError(error.errno or errno.EIO, f"{directory}: {error.strerror} ({setting})") from None
            if not follow and stat.S_ISLNK(info.st_mode):
                continue  # its directory is checked here, its target in the resolved chain
            why = _unsafe_directory(directory, info, trusted_uid)
            if why is not None:
                shown = f"{directory} (where {absolute} leads)" if follow and resolved != absolute else str(directory)
                raise ParkFileError(
                    errno.EPERM,
                    f"refusing the park file {path}: its directory {shown} is unsafe: {why}; whoever can "
                    f"change it could redirect the file, which holds cookies. Fix its owner or mode, or "
                    f"set {setting} to a path in a directory only you can write",
                )


class LockedFile:
    """A path opened only when safe, written only under its ``flock``: the park file's I/O, no format."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        setting: str,
        write: Callable[[int, bytes], int] = os.write,
        fsync: Callable[[int], None] = os.fsync,
        trusted_uid: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.setting = setting
        self.trusted_uid = trusted_uid
        """Besides our own: the uid whose files and directories are accepted when we run as root."""
        self._write = write
        self._fsync = fsync
        self._safe_directory: tuple[int, int] | None = None
        self.torn_refused: str | None = None
        """Why ``FILE.torn`` was refused (planted by another user, a symlink), if it was."""
        self._torn_name = self.path.name + ".torn"

    @property
    def torn_path(self) -> Path:
        """Where set-aside lines go: ``FILE.torn``, or a file of our own beside it if that was refused."""
        return self.path.with_name(self._torn_name)

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
        if len(os.fsencode(self.path.name)) > _NAME_MAX - _TEMPORARY_EXTRA:
            raise ParkFileError(
                errno.ENAMETOOLONG,
                f"the park file name {self.path.name[:40]!r}... is over {_NAME_MAX - _TEMPORARY_EXTRA} bytes: its "
                f"compaction's temporary file (.NAME.XXXXXXXX.tmp) would not fit a file name ({self.setting})",
            )
        check_directories(self.path, self.setting, self.trusted_uid)
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise ParkFileError(errno.ENOTDIR, f"{self.path}: a part of it is not a directory ({self.setting})") from None
        if stat.S_ISLNK(info.st_mode):
            raise ParkFileError(errno.ELOOP, self._symlink_refused(self.path))
        _check_ours(info, self.path, self.setting, self.trusted_uid)

    def _symlink_refused(self, path: Path) -> str:
        return (
            f"{path} is a symlink; refusing to follow it (whoever can write its directory could point it at "
            f"another file, which would be truncated or receive our cookies). Remove it or set {self.setting}"
        )

    def _dir(self, create: bool) -> int | None:
        """The park file's directory, opened; checked safe (again whenever it is another directory)."""
        dir_fd = self._open_dir(create)
        if dir_fd is None:
            return None
        try:
            identity = _identity(os.fstat(dir_fd))
            if identity != self._safe_directory:
                check_directories(self.path, self.setting, self.trusted_uid)
                if _identity(os.stat(self.path.parent)) != identity:
                    raise ParkFileError(errno.EXDEV, f"{self.path.parent} changed while it was checked ({self.setting})")
                self._safe_directory = identity
        except BaseException:
            os.close(dir_fd)
            raise
        return dir_fd

    def _open_dir(self, create: bool) -> int | None:
        parent = self.path.parent
        if create:
            check_directories(self.path, self.setting, self.trusted_uid)  # before creating anything in it
            missing = [d for d in (parent, *parent.parents) if not os.path.lexists(d)]
            for directory in reversed(missing):  # each 0700: mkdir(parents=True) gives parents 0777 & ~umask
                try:
                    directory.mkdir(mode=0o700)
                except FileExistsError:
                    if not directory.is_dir():
                        raise ParkFileError(errno.ENOTDIR, f"{directory} is not a directory ({self.setting})") from None
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
            _check_ours(os.fstat(fd), path, self.setting, self.trusted_uid)
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
                size = self._seek_end(fd)
                data = self._after_torn(fd, size) + data
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

    def _seek_end(self, fd: int) -> int:
        size = os.fstat(fd).st_size
        os.lseek(fd, size, os.SEEK_SET)
        return size

    def _after_torn(self, fd: int, size: int) -> bytes:
        """A newline to write first when the file ends in a torn line: it stays a line of its own,
        and what is appended (a claim, a removal) is not glued to it and lost."""
        return b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""

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
