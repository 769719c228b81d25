"""A clock that moves only when a test (or a simulation) says so.

Every time-based part of the package takes its clock as an argument
(``board = CooldownBoard(clock=clock)``), so tests and the benchmarks pass
this one instead of sleeping.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
