"""Who holds a park claim: an owner (host, boot, pid namespace, pid, start time, nonce) and whether it lives.

A claim whose owner died goes back to the pool. One that cannot be judged
(another machine or pid namespace: no pid of ours to look at) is kept for a
lease of CLAIM_LEASE seconds from the time written in its claim line, then
goes back too; a claim line dated in the future is not trusted at all.
"""

from __future__ import annotations

import os
import socket
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

CLAIM_LEASE = 24 * 3600.0
"""How long a claim whose owner cannot be judged (another host or pid namespace) holds its records."""
_MAX_PID = 2**31
"""pid_t is a C int everywhere (os.kill overflows past it); Linux's own limit is 2**22."""
_FUTURE_SLACK = 300.0
"""A claim dated further ahead than this is forged or from a wrong clock: it holds nothing."""


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
        numbers: list[Any] = [raw.get(key) for key in ("pid", "start")]
        if not all(isinstance(text, str) and len(text) <= 256 for text in texts):
            raise ValueError("claim owner has a malformed name")
        limits = (_MAX_PID, 2**63)
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < top for n, top in zip(numbers, limits)):
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


_live_handles: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
"""Handles of this process by nonce: a claim of this process whose handle is gone is free."""


def judgeable(owner: Owner) -> bool:
    """Whether this process can tell if ``owner`` lives: same host and pid namespace."""
    here = this_process()
    return owner.host == here[0] and owner.ns == here[2]


def within_lease(at: float, now: float) -> bool:
    """A claim made at ``at`` that cannot be judged still holds at ``now``."""
    return now - CLAIM_LEASE < at <= now + _FUTURE_SLACK


def claim_holds(owner: Owner, at: float, now: float, alive: dict[Owner, bool]) -> bool:
    """Whether a claim still holds its record; ``alive`` caches owner_alive per owner."""
    if owner not in alive:
        alive[owner] = owner_alive(owner)
    if not alive[owner]:
        return False
    return judgeable(owner) or within_lease(at, now)


def owner_alive(owner: Owner) -> bool:
    """False only when sure: a dead or replaced process, another boot, or a closed handle of ours.

    An owner on another machine or in another pid namespace cannot be judged
    here: True (its claims then hold only for their lease, see claim_holds).
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


def this_process_owner() -> Owner:
    host, boot, ns, pid, start = this_process()
    return Owner(host, boot, ns, pid, start, uuid.uuid4().hex[:16])

