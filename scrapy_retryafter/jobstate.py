"""Cooldowns and breaker states saved with a JOBDIR job.

Scrapy's JOBDIR saves the queue and the duplicate filter; a resumed crawl
would otherwise forget that a host asked for an hour's rest a minute ago and
hit it at once. Times are stored relative to the save, with its wall-clock
time, so the resumed crawl subtracts however long the pause lasted.

The file is written to a ``mkstemp`` file beside it, fsynced and renamed over
(the temporary file is removed if anything fails), and read without following
a symlink and no further than MAX_STATE_BYTES.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from .board import CooldownBoard

__all__ = ["STATE_FILE", "load_board", "save_board"]

STATE_FILE = "retry_after.state.json"
MAX_STATE_BYTES = 64 * 1024 * 1024


def save_board(board: CooldownBoard, jobdir: str | os.PathLike[str], wall: float | None = None) -> Path:
    path = Path(jobdir, STATE_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"saved_at": time.time() if wall is None else wall, "slots": board.snapshot()}, sort_keys=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def _read_state(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as state:
        if not stat.S_ISREG(os.fstat(state.fileno()).st_mode):
            raise ValueError("not a regular file")
        data = state.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
    return data.decode("utf-8")


def load_board(board: CooldownBoard, jobdir: str | os.PathLike[str], wall: float | None = None) -> int:
    """Restore a saved board; an unreadable state file restores nothing (it is only a courtesy).

    A symlink, a file that is not regular or one too large counts as unreadable.
    """
    path = Path(jobdir, STATE_FILE)
    try:
        data: Any = json.loads(_read_state(path))
        saved_at = float(data["saved_at"])
        slots = data["slots"]
        if not isinstance(slots, dict):
            raise ValueError("slots is not a mapping")
        elapsed = max(0.0, (time.time() if wall is None else wall) - saved_at)
        return board.restore(slots, elapsed)
    except FileNotFoundError:
        return 0
    except (ValueError, KeyError, TypeError, AttributeError, OSError, RecursionError):
        return -1
