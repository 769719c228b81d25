"""Backoff strategies for waits the server did not announce.

Each takes the attempt number (1 for the first retry), the previous wait and
a random source, so a test can pin the randomness and the herd benchmark can
replay the reference table with the very code the middleware runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

__all__ = ["STRATEGIES", "Backoff", "backoff"]


class Uniform(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


Strategy = Callable[[int, float, float, float, Uniform], float]


def _ceiling(attempt: int, base: float, cap: float) -> float:
    # 2 ** 1100 overflows a float; the cap is reached long before.
    exponent = min(max(attempt - 1, 0), 1000)
    return min(cap, base * 2.0**exponent)


def no_jitter(attempt: int, prev: float, base: float, cap: float, rng: Uniform) -> float:
    return _ceiling(attempt, base, cap)


def full_jitter(
    attempt: int, prev: float, base: float, cap: float, rng: Uniform
) -> float:
    return rng.uniform(0.0, _ceiling(attempt, base, cap))


def equal_jitter(
    attempt: int, prev: float, base: float, cap: float, rng: Uniform
) -> float:
    half = _ceiling(attempt, base, cap) / 2
    return half + rng.uniform(0.0, half)


def decorrelated_jitter(
    attempt: int, prev: float, base: float, cap: float, rng: Uniform
) -> float:
    return min(cap, rng.uniform(base, max(base, prev) * 3))


def additive_jitter(
    attempt: int, prev: float, base: float, cap: float, rng: Uniform
) -> float:
    return min(cap, _ceiling(attempt, base, cap) + rng.uniform(0.0, base))


STRATEGIES: dict[str, Strategy] = {
    "none": no_jitter,
    "full": full_jitter,
    "equal": equal_jitter,
    "decorrelated": decorrelated_jitter,
    "additive": additive_jitter,
}


class Backoff:
    """A named strategy with its base and cap, ready to draw waits."""

    __slots__ = ("base", "cap", "name", "_strategy")

    def __init__(self, name: str = "full", base: float = 1.0, cap: float = 60.0) -> None:
        if name not in STRATEGIES:
            raise ValueError(f"unknown backoff strategy {name!r}")
        self.name = name
        self.base = base
        self.cap = cap
        self._strategy = STRATEGIES[name]

    def wait(self, attempt: int, prev: float | None = None, rng: Uniform = random) -> float:
        return self._strategy(attempt, self.base if prev is None else prev, self.base, self.cap, rng)

    def bounds(self, attempt: int, prev: float | None = None) -> tuple[float, float]:
        """The least and the most ``wait`` can draw: what a test of real gaps may assert."""
        ceiling = _ceiling(attempt, self.base, self.cap)
        if self.name == "none":
            return ceiling, ceiling
        if self.name == "full":
            return 0.0, ceiling
        if self.name == "equal":
            return ceiling / 2, ceiling
        if self.name == "decorrelated":
            top = max(self.base, self.base if prev is None else prev) * 3
            return min(self.cap, self.base), min(self.cap, top)
        return ceiling, min(self.cap, ceiling + self.base)


def backoff(attempt: int, base: float = 1.0, cap: float = 60.0, rng: Uniform = random) -> float:
    """Full-jitter exponential backoff: uniform(0, min(cap, base * 2**(attempt-1)))."""
    return full_jitter(attempt, base, base, cap, rng)
