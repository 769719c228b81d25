"""Learning a throttled slot's rate: measure, cut on a throttle, grow back (CUBIC).

Obeying Retry-After alone gives a saw-tooth: the slot reopens at full
concurrency and runs straight into the limiter again. After its first
throttle a slot is paced instead, at a rate that starts from what it was
measured to sustain, is cut by ``beta`` on each throttle and grows back along
a cubic curve toward and past the last peak, as the AWS SDKs' adaptive retry
mode does. A limiter with a burst allowance (nginx ``burst=``, a token
bucket) lets a pace far above its rate through until the burst is spent, so
the pace at a refusal overstates its limit; two stretches of sending between
refusals tell the rate it hid (``sustained``). Pure: the caller passes the time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["RateController", "step_pays", "usable"]

SCALE = 0.04
"""Cubic regrowth constant below the last peak. AWS uses 0.4 for API calls; a
crawl that hits a hard limiter pays a whole Retry-After per probe, so it
regrows ten times more slowly (back to the old peak in seconds)."""
PROBE_SCALE = 0.01
"""Growth constant past the last peak: the limit was just under it, so probing
above it is slow (+1 request/s after about 4.6 s on the plateau)."""
STEADY_SCALE = 0.000125
"""Probing constant once the limit is pinned down (two cuts in a row at about
the same rate, or a small last step of slow start): +1 request/s after 20 s
on the plateau. A refused probe costs a whole cooldown; at one probe per 16
cooldowns probing costs about 6 % of the slot's time."""
PROBE_COOLDOWN = 1.25
"""The cooldown the probing times above are for (Retry-After: 1, padded):
after a longer one they stretch in proportion, so that a slot told to wait a
minute does not probe every 20 s and spend most of its time cooling down."""
MARGIN = 0.95
"""The rate that was throttled is over the limit: the plateau sits just under it."""
START = 1.0
"""Requests per second of a slot's first pace when nothing succeeded on it before its first throttle."""
FLOOR = 0.2
"""The slowest a learned pace goes (one request per 5 s). At 1 request/s, the floor before, a
host that allows 1 request/s was paced at its limit and refused whenever two gaps came a ms short."""
GENTLE = 4.0
"""Requests per second under which the growth constants shrink with the peak: they add requests per
second, and +1 after 4.6 s on a plateau of 1/s doubles it, where on one of 5/s it adds a fifth."""
DROP_GUARD = 3.0
"""Seconds after a cut (cooldown included) before the meter is trusted to say the limit dropped."""
DOUBLING = 0.25
"""Seconds of sending per doubling while the pace was never throttled (slow start)."""
AGAIN = 1.0
"""A throttle this soon after sending resumed: the limit is far below the
pace (it dropped), so the cut is deeper (beta squared) and sets no peak."""
RESTART = 1.1
"""Regrowth this far past the last refused pace without a throttle: the
limit moved up, so the slot finds the new one by slow start instead of a
slow cubic."""
PINNED = 1.2
"""Slow start refused after a step up of at most this: the limit lies
between the two paces, so probing past the plateau is as slow as when steady."""
HIDDEN = 0.7
"""A burst hid the limit: what was sustained between two refusals is at most this share of the refused pace."""
APART = 0.25
"""Seconds by which two stretches of sending must differ in length for what they served to say a rate."""
HELD = 3.0
"""Seconds a pinned pace held without a refusal before a refusal right after
the next cooldown counts as a stray, not a drop (see ``throttled``)."""
CLIMBED = 1.1
"""A refused pace this far over the plateau, after SHORT seconds of sending, climbed there one success at
a time: against a limit with no burst each pace on the way was let through (see ``throttled``)."""
COUNTED = 8
"""Successes by which they must differ too: a stretch ends on a fraction of a
token, so the rate is off by up to one success in this many."""
CONFIRMED_MOST = 2
"""A probe past a pinned plateau refused where the last one was confirms the limit: each confirmation
doubles the time to the next probe, up to this many times (x4). Against a fixed limit with Retry-After: 2
a probe every 30 s cost 8 % of the crawl; a limit that rises is still found, within minutes."""
SHORT = 3.0
"""Seconds: a pace far above the rate spends a burst of a second or two's worth within this; a
longer stretch ran near the rate and let tokens go to waste, so what it served says nothing."""
REGROWTH_MOST = 86_400.0
"""Seconds of regrowth the cubic counts at most: past a day it is at any ceiling, and a clock read as
1e120 raised OverflowError."""


def growth(peak: float) -> float:
    """The share of the growth constants a plateau at ``peak`` grows by (see GENTLE): no less than at
    START, so a pace cut to the floor (0.2) by refusals in a row does not take 20 times as long to regrow."""
    return min(1.0, max(peak, START) / GENTLE)


def usable(rate: float) -> bool:
    """A rate from a file, Redis or a server that can pace a slot: positive and finite (not NaN)."""
    return 0.0 < rate < math.inf


def doubling_step(rate: float) -> float:
    """Slow start's growth per success at ``rate``: doubling every DOUBLING seconds of sending, at most
    x2 per success (no power is taken: 2 ** (1 / rate) overflows for a quota of a few a day)."""
    seconds = rate * DOUBLING
    return 2.0 if seconds <= 1.0 else 2.0 ** (1.0 / seconds)


def burst_hid(last: tuple[int, float, float] | None, served: int, span: float, start: float) -> float | None:
    """The rate a burst allowance hid, from the last two stretches of sending; None when they do not say.

    A token bucket (rate r, burst B) is full when a cooldown ends and
    empty when it refuses again, so a stretch of T seconds between the
    two serves B + r*T, whatever the pace did in between. Two stretches
    of different lengths give r = (served1 - served2) / (T1 - T2). It
    says something only where the pace ran far above it (the bucket hid
    the overshoot); a limiter without burst refuses the first excess and
    its stretches serve what the pace sent. ``last`` is the stretch before
    (served, seconds, the pace it began at), then this one's.
    """
    if last is None:
        return None
    last_served, last_span, last_start = last
    if not 0.0 < last_span <= SHORT or not 0.0 < span <= SHORT or abs(span - last_span) < APART:
        return None
    if abs(served - last_served) < COUNTED:
        return None
    rate = (served - last_served) / (span - last_span)
    # Paces only grow within a stretch: both began far above the rate, so neither
    # wasted tokens (a stretch begun under it serves less and reads lower).
    return rate if 0.0 < rate <= HIDDEN * min(start, last_start) else None


def step_pays(rate: float, grown: float, left: float | None, cooldown: float) -> bool:
    """A rise from ``rate`` to ``grown`` could save more on the ``left`` requests than a refusal costs.

    A refusal costs a cooldown as long as the last one. Slow start's steps
    compound, so the caller judges a whole doubling: ten requests left at
    1.4/s save 3.6 s at 2.8/s; a 2/s host refuses that and its
    Retry-After: 3 costs 3.75 s, so the crawl ends sooner unhurried.
    """
    return left is None or left * (1.0 / rate - 1.0 / grown) >= cooldown


class RateController:
    """The pace of one throttled slot, in requests per second."""

    __slots__ = (
        "rate", "peak", "last_cut", "resumed", "window", "beta", "min_rate", "ceiling", "starting", "scale", "passed",
        "refused", "stretch", "served", "last", "cut_here", "confirmed",
    )

    def __init__(self, beta: float = 0.7, min_rate: float = FLOOR) -> None:
        if not 0.0 < beta < 1.0 or not usable(min_rate):
            raise ValueError(f"beta must lie in (0, 1) and min_rate be positive, not {beta!r} and {min_rate!r}")
        self.beta = beta
        self.min_rate = min_rate
        self.rate = self.peak = self.last_cut = self.resumed = 0.0
        """When sending resumed after the last cut's cooldown: regrowth counts from here."""
        self.window = 0.0
        self.ceiling = math.inf
        """A rate the server announced: growth never passes it."""
        self.starting = True
        """Slow start: the first rate came from an unpaced burst and says little."""
        self.scale = SCALE
        self.passed = 0.0
        """Slow start: the pace before the last step up, the last one the server let through."""
        self.refused = math.inf
        """The pace of the last throttle: the limit was below it."""
        self.stretch = 1.0
        """How much slower than the probing constants say to probe: the last cooldown over PROBE_COOLDOWN."""
        self.served = 0
        """Successes since sending resumed after the last cut's cooldown."""
        self.cut_here = False
        """Throttled in this run: a pace only remembered or restored teaches the next run nothing new."""
        self.confirmed = 0
        """Probes refused in a row at the pinned plateau (CONFIRMED_MOST at most)."""
        self.last: tuple[int, float, float] | None = None
        """The stretch of sending before the last cut: what it served, how long it lasted, and
        the pace it began at (this one's is ``start``); one field, None until a stretch ended,
        as a broad crawl keeps a controller per throttled host. A stretch begun under the
        sustained rate let tokens go to waste, so its count says nothing about the rate."""

    def sustained(self, now: float) -> float | None:
        """The rate a burst allowance hid (``burst_hid``); None when the last two stretches do not say."""
        return burst_hid(self.last, self.served, now - self.resumed, self.start)

    @property
    def start(self) -> float:
        """Where the cubic curve of the last cut starts (derived: a broad crawl keeps a controller per host)."""
        return self.peak - SCALE * growth(self.peak) * self.window**3

    def throttled(self, measured: float, now: float) -> float:
        """Cut the rate: the server said this pace is too fast."""
        self.cut_here = True
        measured = measured if usable(measured) else 0.0
        # When paced, the pace is what was too fast; else what succeeded, START when nothing did.
        base = self.rate or max(measured, min(START, self.ceiling) / self.beta)
        probed, confirmed, self.confirmed = self.scale == STEADY_SCALE, self.confirmed, 0
        hidden = self.sustained(now) if self.rate and now >= self.resumed else None
        climbed = bool(self.rate) and now - self.resumed >= SHORT and base * MARGIN > CLIMBED * self.peak
        held = self.last is not None and self.last[1] >= HELD
        if self.rate and now >= self.resumed:
            self.last = (self.served, now - self.resumed, self.start)
        else:
            self.last = None
        self.served = 0
        if not self.starting and measured and measured < base / 2 and now - self.last_cut >= DROP_GUARD:
            # Out of slow start, and long enough after the last cut for the
            # meter to have caught up, a success rate under half the pace
            # means the limit itself dropped. Under START it counts demand, not a
            # limit: a success every 10 s and one stray 429 sent a 20/s pace to the floor.
            base = max(measured, min(base, START))
            climbed = False
        leaving_start = self.starting and bool(self.rate)
        again = not self.starting and self.refused < math.inf and now - self.resumed < AGAIN
        if again and self.scale == STEADY_SCALE and held:
            # A pinned pace that held for seconds, refused once right after
            # the next cooldown: a limiter with no tolerance (nginx limit_req
            # without burst) refuses two requests that arrive a few ms too
            # close, and after a pause they often do. A stray, cut like one at
            # the plateau; a limit that dropped refuses the next stretch at
            # once too, and that one is cut deep.
            again = False
        passed, self.passed = self.passed, 0.0
        if self.rate:
            self.starting = False
        base = max(base, self.min_rate)
        self.scale = PROBE_SCALE
        if leaving_start:
            self.rate = max(self.min_rate, base * self.beta)
            # Slow start overshoots by up to double: its last pace is no peak
            # to regrow to, the one before its last step up is.
            self.peak = max(self.rate, passed * MARGIN)
            if base <= PINNED * passed:
                # The limit lies between the last two paces: resume just under it.
                self.scale = STEADY_SCALE
                self.rate = max(self.min_rate, self.peak)
            else:
                self.passed = passed  # if the pace between the two is refused at once, the limit is under it
        elif again and base > passed > 0.0:
            # Slow start's exit guessed a pace between the last two and it was
            # refused at once: the limit lies between the pace slow start
            # passed and that guess, it did not drop.
            self.peak = self.rate = max(self.min_rate, passed * MARGIN)
            if base <= PINNED * passed:
                self.scale = STEADY_SCALE
        elif again:
            self.peak = self.rate = max(self.min_rate, base * self.beta * self.beta)
        elif climbed:
            # The pace climbed well past the plateau for seconds, every step let
            # through: the limit is just under where it was refused, not a beta cut below.
            self.peak = self.rate = max(self.min_rate, base * MARGIN)
            self.scale = STEADY_SCALE
        else:
            self.rate = max(self.min_rate, base * self.beta)
            if self._at_peak(base):
                self.scale = STEADY_SCALE
                self.confirmed = min(confirmed + (probed and base > self.peak), CONFIRMED_MOST)
                if base > self.peak:
                    # A probe just past the plateau was refused: the limit is where it was.
                    self.rate = max(self.rate, min(base * MARGIN, self.peak))
            self.peak = base * MARGIN
        if hidden is not None:
            # The pace ran far past what the server sustains while a burst
            # allowance lasted: resume just under the sustained rate, pinned.
            self.peak = self.rate = max(self.min_rate, hidden * MARGIN)
            self.starting = False
            self.passed = 0.0
            self.scale, self.confirmed = STEADY_SCALE, 0
        self.regrow_from(base, now)
        return self.rate

    def ran_ahead(self, sent: float, passed: float = 0.0) -> None:
        """Slow start's pace ran ahead of the ``sent`` rate (a fleet's grants, booked ahead, lag its steps): that
        rate is what was refused, ``passed`` (if known) the last let through, not the paces (before ``throttled``)."""
        if self.starting and self.rate >= sent > 0.0:
            self.rate = max(self.min_rate, sent)
            # Its own steps ran ahead too: only the fleet's sends say what was let through.
            self.passed = passed if 0.0 < passed < self.rate else 0.0

    def _at_peak(self, refused: float) -> bool:
        """A pace refused about where the last one was: the limit is pinned down."""
        return abs(refused * MARGIN - self.peak) <= 0.1 * self.peak

    def regrow_from(self, refused: float, now: float) -> None:
        """The cut is made: the cubic curve restarts now, back up to ``peak``."""
        self.refused = refused
        self.window = (max(self.peak - self.rate, 0.0) / (SCALE * growth(self.peak))) ** (1 / 3)
        self.last_cut = self.resumed = now

    def adopted(self, rate: float, now: float, plateau: tuple[float, bool, float] | None = None) -> None:
        """Another process cut the fleet's pace to ``rate`` (no throttle here: counted as one, the processes cut
        each other to the floor). With the cutter's ``plateau`` (peak, pinned?, passed) it regrows as the cutter
        does, else the next refusal here (they take turns) was never "at the peak" and probed fast. Without, the
        cut is the plateau: regrowing toward ``rate / beta``, the fleet was refused again after the cooldown.
        The pace slow start passed goes too: slow start's exit refused at once here was cut by beta twice
        (10.9 to 5.3 of a limit of 10), not resumed under the pace passed."""
        if not usable(rate):
            return
        rate = min(rate, self.ceiling)
        paused = self.resumed
        base = rate / self.beta
        self.starting = False
        self.passed = plateau[2] if plateau and 0.0 < plateau[2] < rate else 0.0
        pinned = plateau[1] if plateau else self._at_peak(base) or abs(rate - self.peak) <= 0.1 * self.peak
        self.rate = max(self.min_rate, rate)
        # Bounded: a cut by beta regrows to at most just under the pace it cut, rate / beta.
        self.peak = max(self.rate, min(plateau[0], base * MARGIN)) if plateau else self.rate
        self.scale = STEADY_SCALE if pinned else PROBE_SCALE
        self.confirmed = self.confirmed if pinned else 0
        self.served, self.last = 0, None
        # Refused no lower than before: from rate / beta alone (4.9 of 10) slow start restarted at 7.7.
        self.regrow_from(max(base, self.refused if self.refused < math.inf else 0.0), now)
        self.resumed = max(self.resumed, paused)

    def paused(self, until: float, now: float) -> None:
        """The slot sends nothing until ``until`` (a cooldown): regrowth waits for it."""
        self.resumed = max(self.resumed, until)
        self.stretch = min(max(1.0, (until - now) / PROBE_COOLDOWN), REGROWTH_MOST / PROBE_COOLDOWN)

    def succeeded(self, measured: float, now: float, left: Callable[[], float | None] | None = None) -> float:
        """Grow back: slowly near the last peak, faster once past it.

        ``left`` counts the slot's requests still to send (None: unknown):
        slow start does not probe when a doubling cannot pay (``step_pays``); it
        still rises to what the throttled burst was measured to get through.
        """
        if not self.rate:
            return 0.0
        measured = measured if usable(measured) else 0.0
        if now >= self.resumed:
            self.served += 1
        if self.starting:
            # Each success at rate r stands for 1/r seconds of sending: no growth while idle.
            grown = max(self.min_rate, min(self.rate * doubling_step(self.rate), self.ceiling))
            if grown > self.rate and left is not None and not step_pays(
                self.rate, min(2.0 * self.rate, self.ceiling), left(), self.stretch * PROBE_COOLDOWN
            ):
                # No probe, but no need to stay under what the throttled burst got through either.
                grown = min(grown, self.refused * MARGIN)
                if grown <= self.rate:
                    self.passed = self.rate  # it held: a success at this pace
                    return self.rate
            if grown > self.rate:
                self.passed = self.rate
            self.rate = grown
            return self.rate
        since = min(max(0.0, now - self.resumed) - self.window, REGROWTH_MOST)
        scale = SCALE if since < 0 else self.scale / (self.stretch * 2**self.confirmed) ** 3
        cubic = scale * growth(self.peak) * since**3 + self.peak
        # At most double what the slot really sends, so an idle slot's pace does not run away.
        ceiling = 2 * max(measured, self.rate)
        self.rate = max(self.min_rate, min(cubic, ceiling, self.ceiling))
        if self.rate >= RESTART * self.refused and self.rate < self.ceiling:
            self.starting, self.confirmed = True, 0
            self.passed = self.rate
        return self.rate

    def announced(self, rate: float) -> None:
        """The server stated its quota: never pace above it; follow it unless throttled (then only drop)."""
        if not usable(rate):
            return
        self.ceiling = rate
        # A quota under the floor (6 a minute) lowers the floor: never pace above what the server allows.
        self.min_rate = min(self.min_rate, rate)
        self.rate = rate if not self.last_cut or not self.rate else min(self.rate, rate)

    def unannounced(self) -> RateController | None:
        """The stated quota no longer binds (its budget covers what is wanted): None when only it
        paced the slot; else the learned pace, uncapped, at no less than its last cut would give."""
        if not self.last_cut:
            return None
        self.ceiling = math.inf
        self.min_rate = max(self.min_rate, FLOOR)  # lowered by a quota under the floor
        self.rate = max(self.min_rate, self.rate, self.peak * self.beta)
        return self
