"""What the board remembers of one slot, and how a reopening slot spreads its releases.

Pure. Kept apart from the board so the fleet's board builds on the same state.
"""

from __future__ import annotations

from array import array
from typing import Protocol

from .backoff import Uniform
from .breaker import CLOSED, OPEN, Breaker
from .rate import RateController, usable
from .ratememory import restore_pace

__all__ = ["Random", "SlotState", "next_release", "restored_state", "saved_state"]


class Random(Uniform, Protocol):
    def random(self) -> float: ...


class SlotState:
    """What the board remembers of one slot (a small object: memory per slot matters)."""

    __slots__ = (
        "cooldown_until", "refuse_until", "wake_end", "wake_left", "next_release", "pace", "next_paced", "last_seen",
        "breaker", "tokens", "steps", "lag",
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
        self.steps: array[float] | None = None
        """Slow start's paces and when each began (startsteps); None out of slow start."""
        self.lag = -1.0
        """Lower envelope of how late a learned pace's releases leave (board._lag_credit); -1: none seen."""


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


def saved_state(state: SlotState, now: float) -> dict[str, float | str]:
    """What a paused crawl must not forget of one slot, in seconds from ``now`` (empty: nothing)."""
    entry: dict[str, float | str] = {}
    if state.cooldown_until > now:
        entry["cooldown"] = state.cooldown_until - now
    if state.refuse_until > now:
        entry["refuse"] = state.refuse_until - now
    breaker = state.breaker
    if breaker is not None and (breaker.state != CLOSED or breaker.consecutive):
        entry["breaker"] = breaker.state
        entry["breaker_open"] = max(0.0, breaker.opened_until - now) if breaker.state == OPEN else 0.0
        entry["breaker_consecutive"] = breaker.consecutive
    if state.pace is not None:
        entry["rate"] = state.pace.rate
    if state.tokens >= 0:
        entry["tokens"] = state.tokens
    return entry


def restored_state(state: SlotState, entry: dict[str, float | str], now: float, elapsed: float) -> SlotState:
    """``state`` with a saved ``entry`` taken ``elapsed`` seconds ago laid over it."""
    cooldown = float(entry.get("cooldown", 0.0)) - elapsed
    if cooldown > 0:
        state.cooldown_until = state.wake_end = max(state.cooldown_until, now + cooldown)
    refuse = float(entry.get("refuse", 0.0)) - elapsed
    if refuse > 0:
        state.refuse_until = max(state.refuse_until, now + refuse)
    if "breaker" in entry:
        breaker = state.breaker = state.breaker or Breaker()
        # Open or half-open when paused: open until its time is up, then one probe.
        open_until = (
            now + max(0.0, float(entry.get("breaker_open", 0.0)) - elapsed) if entry["breaker"] != CLOSED else None
        )
        breaker.restore(int(entry.get("breaker_consecutive", 0)), open_until)
    if "rate" in entry and usable(float(entry["rate"])):  # a NaN or 0 saved: unpaced, learned again
        state.pace = state.pace or RateController()
        restore_pace(state.pace, float(entry["rate"]), now)
    if "tokens" in entry:
        state.tokens = float(entry["tokens"])
    state.last_seen = now
    return state
