"""Cooldowns and breaker states saved with a JOBDIR job.

Scrapy's JOBDIR saves the queue and the duplicate filter; a resumed crawl
would otherwise forget that a host asked for an hour's rest a minute ago and
hit it at once. Times are stored relative to the save, with its wall-clock
time, so the resumed crawl subtracts however long the pause lasted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .board import CooldownBoard

__all__ = ["STATE_FILE", "load_board", "save_board"]

STATE_FILE = "retry_after.state.json"


def save_board(board: CooldownBoard, jobdir: str | os.PathLike[str], wall: float | None = None) -> Path:
    path = Path(jobdir, STATE_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"saved_at": time.time() if wall is None else wall, "slots": board.snapshot()}
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, sort_keys=True))
    os.replace(temporary, path)
    return path


def load_board(board: CooldownBoard, jobdir: str | os.PathLike[str], wall: float | None = None) -> int:
    """Restore a saved board; an unreadable state file restores nothing (it is only a courtesy)."""
    path = Path(jobdir, STATE_FILE)
    try:
        data: Any = json.loads(path.read_text())
        saved_at = float(data["saved_at"])
        slots = data["slots"]
        if not isinstance(slots, dict):
            raise ValueError("slots is not a mapping")
        elapsed = max(0.0, (time.time() if wall is None else wall) - saved_at)
        return board.restore(slots, elapsed)
    except FileNotFoundError:
        return 0
    except (ValueError, KeyError, TypeError, AttributeError):
        return -1
