"""A slot's learned pace across runs: what to save, and how a saved pace starts the next run.

Apart from the controller (rate.py) because it is about records, which come
from files and Redis and are hostile: a rate that is not positive and finite
leaves the controller as it was. Pure: the caller passes the time.
"""

from __future__ import annotations

import math

from .rate import MARGIN, STEADY_SCALE, RateController, usable

__all__ = ["learned_pace", "remember_pace", "restore_pace"]


def learned_pace(pace: RateController) -> float | None:
    """The pace to remember for the next run, None when not throttled in this run (a record only
    restored ages out: a host whose limit rose is learned afresh). The plateau just under the last
    refusal; in slow start, the last pace the server let through (the current one is untested)."""
    if not pace.cut_here or not pace.last_cut or not pace.rate:
        return None
    if pace.starting:
        rate = pace.passed or pace.rate
    else:
        rate = max(pace.rate, pace.peak)
        if pace.refused < math.inf:
            rate = min(rate, max(pace.rate, pace.refused * MARGIN))
    return max(pace.min_rate, min(rate, pace.ceiling))


def remember_pace(pace: RateController, rate: float, now: float) -> None:
    """Start at a pace a past run learned (the per-host memory): just under it, back to it
    within seconds, then probing above it slowly. A pace that held to the end of one run
    may sit at the very edge of a limiter with no tolerance; one refusal costs a cooldown
    and a cut, a start x0.95 under it a twentieth of a few seconds."""
    if not usable(rate):
        return
    restore_pace(pace, rate, now)
    pace.rate = max(pace.min_rate, pace.peak * MARGIN)
    pace.regrow_from(math.inf, now)


def restore_pace(pace: RateController, rate: float, now: float) -> None:
    """Resume at a rate saved with a paused job, probing above it only slowly (never past a stated quota)."""
    if not usable(rate):
        return
    pace.rate = max(pace.min_rate, min(rate, pace.ceiling))
    pace.peak = pace.rate
    pace.last_cut = pace.resumed = now
    pace.window = 0.0
    pace.starting = False
    pace.passed = 0.0
    pace.scale, pace.confirmed = STEADY_SCALE, 0
    pace.served, pace.last = 0, None
