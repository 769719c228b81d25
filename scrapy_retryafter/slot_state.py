"""What the board remembers of one slot, and how a reopening slot spreads its releases.

Pure. Kept apart from the board so the fleet's board builds on the same state.
"""

from __future__ import annotations

from typing import Protocol

from .backoff import Uniform
from .breaker import Breaker
from .rate import RateController

__all__ = ["Random", "SlotState", "next_release"]


class Random(Uniform, Protocol):
    def random(self) -> float: ...


class SlotState:
    """What the board remembers of one slot (a small object: memory per slot matters)."""

    __slots__ = (
        "cooldown_until", "refuse_until", "wake_end", "wake_left", "next_release", "pace", "next_paced", "last_seen",
        "breaker", "tokens",
    )

    def __init__(self) -> None:
        self.cooldown_until = 0.0
        self.refuse_until = 0.0
        self.wake_end = 0.0
        self.wake_left = -1
        self.next_release = 0.0
        self.pace: RateController | None = None
        self.next_paced = 0.0
        self.last_seen = 0.0
        self.breaker: Breaker | None = None
        self.tokens = -1.0
        """Retry budget left (gRPC-style); -1 means full and untouched."""


def next_release(start: float, end: float, left: int, u: float) -> float:
    """The earliest of ``left`` uniform draws in [start, end].

    Drawing the order statistics one at a time spreads the held requests of a
    reopening slot uniformly over the wake window without knowing them all.
    """
    if left <= 1:
        fraction = u
    else:
        fraction = 1.0 - (1.0 - u) ** (1.0 / left)
    return start + (end - start) * fraction
