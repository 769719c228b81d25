"""The cooldown board of a fleet: the fleet's rules (rules.py) on a wire to Redis (exchange.py).

What one process learns about a host (a cooldown, an open circuit, a cut
pace) is sent to Redis when it happens, and every process folds the
others' facts into its own board at most ``refresh`` seconds later. The
crawl's loop never waits on Redis: it hands jobs to the exchange's worker
thread and takes the answers. Lost, the local board carries on alone (it is
complete, only no longer shared) and is re-published when Redis answers
again.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..board import Random
from ..breaker import CLOSED
from ..policy import SlotPolicy
from ..redisconfig import RedisConfig
from .exchange import Answer, Job, RedisBoardUnavailable, RedisExchange, Writes
from .leases import LEASE_AHEAD
from .rules import FleetRules

__all__ = ["Exchange", "RedisBoard", "RedisBoardUnavailable"]

ACTIVE_WINDOW = 5.0
"""Seconds a process still counts as sending to a slot after it last did."""
ASKS_PER_EXCHANGE = 1000
_DEFAULT_POLICY = SlotPolicy()


class Exchange(Protocol):
    """The wire the rules talk through (RedisExchange; a fake one in the tests)."""

    busy: bool
    on_answer: Callable[[], None]
    on_news: Callable[[], None]

    @property
    def lost(self) -> bool: ...
    @property
    def started(self) -> bool: ...
    def may_try(self) -> bool: ...
    def connect(self) -> BaseException | None: ...
    def start(self, call_soon: Callable[[Callable[[], None]], Any] | None = None) -> None: ...
    def stop(self) -> None: ...
    def send(self, job: Job) -> None: ...
    def wait(self, deadline: float) -> None: ...
    def take(self) -> list[Answer]: ...


class RedisBoard(FleetRules):
    """A CooldownBoard whose cooldowns, circuits and learned rates the whole fleet shares."""

    def __init__(
        self,
        config: RedisConfig,
        clock: Callable[[], float] = time.monotonic,
        rng: Random = random,
        pace_memory: float = 600.0,
        policy: Callable[[str], SlotPolicy] = lambda slot: _DEFAULT_POLICY,
        exchange: Exchange | None = None,
        first_contact: int = 0,
    ) -> None:
        super().__init__(clock=clock, rng=rng, pace_memory=pace_memory, policy=policy, refresh=config.refresh,
                         grant_wait=2 * config.timeout + LEASE_AHEAD * config.refresh, first_contact=first_contact)
        self.redis_config = config
        self.exchange: Exchange = exchange if exchange is not None else RedisExchange(
            config, self.process_id, clock, memory_age=config.memory_age, active_window=ACTIVE_WINDOW,
            horizon=self.leases.horizon, rng=rng,
        )
        self.exchange.on_answer = self._answered
        self.exchange.on_news = self._news
        self._last_job = -math.inf
        self.on_lost: Callable[[BaseException], None] = lambda error: None
        self.on_back: Callable[[int], None] = lambda republished: None

    # -- connection ---------------------------------------------------------

    def connect(self) -> bool:
        """Check Redis once, blocking for at most the socket timeout; False if it is down.

        Down and no fallback allowed: RedisBoardUnavailable naming the URL (without its password).
        """
        error = self.exchange.connect()
        if error is None:
            return True
        if not self.redis_config.fallback:
            raise RedisBoardUnavailable(
                f"RETRY_AFTER_REDIS_URL {self.redis_config.safe_url} is unreachable "
                f"({self.redis_config.scrub(str(error))}): start Redis, fix the URL, or set "
                "RETRY_AFTER_REDIS_FALLBACK = True to start on a local board"
            ) from None
        self.on_lost(error)
        return False

    def start(self, call_soon: Callable[[Callable[[], None]], Any] | None = None) -> None:
        """Start the exchanges; with ``call_soon`` (the loop's call-from-thread), answers and
        the fleet's news are handled the moment they arrive, not at the next tick."""
        self.exchange.start(call_soon)

    def stop(self) -> None:
        """Send what is left to send (and leave the slots' sender counts), then end the exchanges."""
        if not self.exchange.started:
            return
        self._apply_answers()
        if not self.busy and not self.lost:
            for slot in self._active:
                self._writes[("leave", slot)] = "0"
            self._send_job(heartbeat=False)
            self.exchange.wait(time.monotonic() + 2 * self.redis_config.timeout + 0.5)
        self.exchange.stop()
        self._apply_answers()

    @property
    def busy(self) -> bool:
        return self.exchange.busy

    @property
    def lost(self) -> bool:
        """Redis did not answer the last exchange: the board decides alone until it does."""
        return self.exchange.lost

    # -- the reactor side ---------------------------------------------------

    def tick(self) -> None:
        """Fold in the answers; start the next exchange when one is due."""
        self._apply_answers()
        now = self.clock()
        if self.busy or (now - self._last_job < self.redis_config.refresh and not self.again):
            return
        if not self.exchange.may_try():
            return
        self._send_job()

    def sync(self, timeout: float = 2.0) -> bool:
        """One exchange, waited for: for a start, a close, and tests. True if Redis answered."""
        self.start()
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            self.exchange.wait(deadline)
            self._apply_answers()
        if self.busy:
            return False
        self._send_job()
        while self.busy and time.monotonic() < deadline:
            self.exchange.wait(deadline)
            self._apply_answers()
        return not self.busy and not self.lost

    def _send_job(self, heartbeat: bool = True) -> None:
        now = self.clock()
        writes, self._writes = self._writes, {}
        if self.lost:
            writes.update(self._snapshot(now))
        active: list[str] = []
        if heartbeat:
            for slot, seen in list(self._active.items()):
                if now - seen > ACTIVE_WINDOW or slot not in self._slots:
                    del self._active[slot]
                    self._shares.pop(slot, None)
                else:
                    active.append(slot)
        claims = self.leases.claims(self._paced, now) if heartbeat and not self.lost else []
        asks = list(itertools.islice(self._asks, ASKS_PER_EXCHANGE)) if not self.lost else []
        for slot in asks:
            del self._asks[slot]
        probes: list[str] = []
        if not self.lost:
            for slot, asked in list(self._probes.items()):
                if now - asked > 2 * self.leases.horizon:
                    del self._probes[slot]  # not asked again: the slot no longer waits for it
                else:
                    probes.append(slot)
        self.again = bool(self._asks)
        self._last_job = now
        first = self.contact.claims() if not self.lost else []
        self.exchange.send(Job(writes, claims, active, now, asks, probes, first))

    def _paced(self, slot: str) -> tuple[float, float, float] | None:
        state = self._slots.get(slot)
        if state is None or state.pace is None:
            return None
        return state.pace.rate, self.share(slot), state.cooldown_until

    def _snapshot(self, now: float) -> Writes:
        """This process's cooldowns and open circuits, to publish again after an outage."""
        writes: Writes = {}
        for slot, state in self._slots.items():
            if state.cooldown_until > now:
                writes[("cool", slot)] = repr(state.cooldown_until - now)
            if state.breaker is not None and state.breaker.state != CLOSED and state.breaker.opened_until > now:
                writes[("open", slot)] = repr(state.breaker.opened_until - now)
        return writes

    def _answered(self) -> None:
        self._apply_answers()
        if self.again and not self.busy and not self.lost:
            self._send_job()

    def _news(self) -> None:
        """An event here, or news from the fleet: exchange now (after the one in flight)."""
        if self.batching:
            self.batched = True  # sent once the throttle's events are all written
            return
        if self.busy:
            self.again = True
        elif not self.lost:
            self._send_job()

    def _apply_answers(self) -> None:
        for answer in self.exchange.take():
            if answer.error is not None:
                for (kind, slot), value in answer.job.writes.items():
                    # Cooldowns and circuits are sent again from the board's state (_snapshot): these
                    # are seconds from when they left, stale by the outage.
                    if kind not in ("cool", "open"):
                        self._writes.setdefault((kind, slot), value)  # newer events win
                if answer.lost_now:
                    self.on_lost(answer.error)
                continue
            assert answer.reply is not None
            if answer.back_after is not None:
                self.on_back(sum(1 for kind, _ in answer.job.writes if kind in ("cool", "open")))
            self.merge(answer.reply, answer.job.sent, answer.got)
