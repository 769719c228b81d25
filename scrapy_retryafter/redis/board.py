"""The cooldown board of a fleet: every crawler process shares one view of each host, in Redis.

Each process keeps its own CooldownBoard and decides from it alone, so no
request ever waits on a network round trip. What one process learns about a
host (a cooldown, an open circuit, a cut pace) is written to Redis when it
happens, and every process folds the others' facts into its own board at most
``refresh`` seconds later. All Redis I/O runs on one worker thread; the
reactor thread only hands it jobs and reads its answers, so a dead Redis
costs a timeout on that thread, never a frozen crawl. Lost, the local board
carries on alone (it is complete, only no longer shared) and is re-published
when Redis answers again.

Cooldowns and circuits are absolute times on the Redis server's clock (its
TIME), so processes on machines with different clocks agree. Extending a
cooldown is ``ZADD GT``: atomic, monotonic, no lock. The learned rate is a
budget for the whole fleet: a cut is published, every process adopts it, and
each paces at rate / (processes sending to the slot), counted from
heartbeats in the same round trip.
"""

from __future__ import annotations

import collections
import math
import os
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..board import CooldownBoard, Random, SlotState
from ..breaker import CLOSED, Breaker
from .outage import BACKOFF_MAX, Outage
from ..rate import MARGIN, RateController
from ..settings import RedisConfig

__all__ = ["RedisBoard", "RedisBoardUnavailable", "EXCHANGE"]

ACTIVE_WINDOW = 5.0
"""Seconds a process still counts as sending to a slot after it last did."""
CIRCUIT_MEMORY = 3600
"""Seconds an expired circuit stays listed, so it reads as half-open, not closed."""
_SAME = 0.05
"""A remote time this close to the local one is our own write coming back."""
LEASE_AHEAD = 3
"""Refresh periods of paced sends a process books ahead (so it never idles between exchanges)."""
_WANT_MEMORY = 1.0
"""Seconds a slot's last request for sends counts: an emptied queue stops booking."""

# One round trip per refresh: apply this process's events, heartbeat the
# slots it sends to, read every cooling slot, circuit and newer rate.
EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local me, active_prefix = ARGV[1], ARGV[2]
local window, nwrites, since = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local nclaims, horizon = tonumber(ARGV[6]), tonumber(ARGV[7])
local i = 8
local news = 0
for _ = 1, nwrites do
  local kind, slot, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if kind == 'cool' then
    news = news + redis.call('ZADD', KEYS[1], 'GT', 'CH', now + tonumber(value), slot)
  elseif kind == 'open' then
    news = news + redis.call('ZADD', KEYS[2], 'GT', 'CH', now + tonumber(value), slot)
  elseif kind == 'close' then
    news = news + redis.call('ZREM', KEYS[2], slot)
  elseif kind == 'rate' then
    redis.call('HSET', KEYS[3], slot, value .. ' ' .. me .. ' ' .. string.format('%.6f', now))
  elseif kind == 'leave' then
    redis.call('ZREM', active_prefix .. slot, me)
  end
  i = i + 3
end
if news > 0 then
  redis.call('PUBLISH', KEYS[4], me)  -- the others exchange now rather than at their next refresh
end
-- Paced slots: hand out send times one fleet interval apart (GCRA), never
-- inside the slot's cooldown, at most ``horizon`` seconds ahead, and one
-- refresh period ahead at least: a time that is already past when its
-- process reads it would be sent late, too close to the next process's.
local leases = {}
for _ = 1, nclaims do
  local slot, want, rate = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local key = active_prefix .. slot .. ':next'
  local t = math.max(now + horizon / LEASE_AHEAD, tonumber(redis.call('GET', key) or '0'), tonumber(redis.call('ZSCORE', KEYS[1], slot) or '0'))
  local granted = {}
  for n = 1, want do
    if n > 1 and t > now + horizon then break end
    granted[#granted + 1] = tostring(t - now)
    t = t + 1 / rate
  end
  redis.call('SET', key, tostring(t), 'EX', 60)
  leases[#leases + 1] = slot
  leases[#leases + 1] = table.concat(granted, ' ')
  i = i + 3
end
local counts = {}
for j = i, #ARGV do
  local key = active_prefix .. ARGV[j]
  redis.call('ZADD', key, now, me)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  redis.call('EXPIRE', key, 60)
  counts[#counts + 1] = ARGV[j]
  counts[#counts + 1] = tostring(redis.call('ZCARD', key))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local cooling = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for k = 2, #cooling, 2 do cooling[k] = tostring(tonumber(cooling[k]) - now) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - CIRCUIT_MEMORY)
local circuits = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for k = 2, #circuits, 2 do circuits[k] = tostring(tonumber(circuits[k]) - now) end
local rates = {}
local all = redis.call('HGETALL', KEYS[3])
for k = 1, #all, 2 do
  local rate, who, at = string.match(all[k + 1], '^(%S+) (%S+) (%S+)$')
  if at and tonumber(at) > since then
    rates[#rates + 1] = all[k]
    rates[#rates + 1] = all[k + 1]
  end
end
return {cooling, circuits, rates, counts, leases, string.format('%.6f', now)}
""".replace("CIRCUIT_MEMORY", str(CIRCUIT_MEMORY)).replace("LEASE_AHEAD", str(LEASE_AHEAD))


class RedisBoardUnavailable(RuntimeError):
    """Redis could not be reached when the crawl started, and falling back was not allowed."""


def redis_client(config: RedisConfig) -> Any:
    """A redis-py client that gives up fast: no retries, short socket timeouts."""
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise RedisBoardUnavailable(
            f"RETRY_AFTER_REDIS_URL {config.safe_url} needs the redis package: "
            "pip install 'scrapy-retryafter[redis]'"
        ) from None
    params = {
        **config.params,
        "socket_timeout": config.timeout,
        "socket_connect_timeout": config.timeout,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_timeout": False,
    }
    return redis.Redis.from_url(config.url, **params)


Writes = dict[tuple[str, str], str]


class RedisBoard(CooldownBoard):
    """A CooldownBoard whose cooldowns, circuits and learned rates the whole fleet shares."""

    def __init__(
        self,
        config: RedisConfig,
        clock: Callable[[], float] = time.monotonic,
        rng: Random = random,  # type: ignore[assignment]
        pace_memory: float = 600.0,
        jitter: Callable[[str], float] = lambda slot: 0.0,
        client: Any = None,
    ) -> None:
        super().__init__(clock=clock, rng=rng, pace_memory=pace_memory)
        self.redis_config = config
        self.jitter = jitter
        """The wake spread of a slot's policy, for cooldowns learned from the fleet."""
        self.process_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.client = client if client is not None else redis_client(config)
        prefix = config.prefix
        self._keys = [f"{prefix}:cooldown", f"{prefix}:circuit", f"{prefix}:rate", f"{prefix}:news"]
        self._active_prefix = f"{prefix}:active:"
        self._script = self.client.register_script(EXCHANGE)
        self._writes: Writes = {}
        self._active: dict[str, float] = {}
        self._shares: dict[str, int] = {}
        self._opened_at: dict[str, float] = {}
        self._leases: dict[str, collections.deque[float]] = {}
        """Send times the fleet granted this process, per paced slot (local clock)."""
        self._want: dict[str, tuple[int, float]] = {}
        self._published: dict[str, float] = {}
        """The last pace this process wrote or adopted, per slot."""
        self._rates_since = 0.0
        self._jobs: queue.SimpleQueue[tuple[Writes, list[str], list[str], float, float] | None] = queue.SimpleQueue()
        self._answers: collections.deque[tuple[Writes, float, Any, float, BaseException | None]] = collections.deque()
        self._busy = False
        self._last_job = -float("inf")
        self._thread: threading.Thread | None = None
        self._listener: threading.Thread | None = None
        self._stopping = threading.Event()
        self._call_soon: Callable[[Callable[[], None]], Any] | None = None
        """Runs a call on the crawl's loop from another thread (None outside a running crawl)."""
        self._again = False
        self._outage = Outage(clock, rng)
        self.on_remote_cool: Callable[[str, float], None] = lambda slot, seconds: None
        self.on_remote_circuit: Callable[[str, bool], None] = lambda slot, opened: None
        self.on_sooner: Callable[[str], None] = lambda slot: None
        """A granted send time came before the one the slot was held for."""
        self.on_late_lease: Callable[[str], None] = lambda slot: None
        """A granted send time went by before this process could use it."""
        self.on_lost: Callable[[BaseException], None] = lambda error: None
        self.on_back: Callable[[int], None] = lambda republished: None
        self.on_wake: Callable[[float], None] = lambda when: None
        """A granted send time: the queue should look again then."""

    # -- connection ---------------------------------------------------------

    def connect(self) -> bool:
        """Check Redis once, blocking for at most the socket timeout; False if it is down.

        Down and no fallback allowed: RedisBoardUnavailable naming the URL.
        """
        try:
            self.client.ping()
        except Exception as error:  # redis-py raises its own errors and OSError alike
            if not self.redis_config.fallback:
                raise RedisBoardUnavailable(
                    f"RETRY_AFTER_REDIS_URL {self.redis_config.safe_url} is unreachable ({error}): start "
                    "Redis, fix the URL, or set RETRY_AFTER_REDIS_FALLBACK = True to start on a local board"
                ) from error
            self._lose(error)
            return False
        return True

    def start(self, call_soon: Callable[[Callable[[], None]], Any] | None = None) -> None:
        """Start the worker; with ``call_soon`` (the loop's call-from-thread), answers and
        the fleet's news are handled the moment they arrive, not at the next tick."""
        if self._thread is None:
            self._call_soon = call_soon
            self._stopping.clear()
            self._thread = threading.Thread(target=self._work, name="retry-after-redis", daemon=True)
            self._thread.start()
            if call_soon is not None:
                self._listener = threading.Thread(target=self._listen, name="retry-after-redis-news", daemon=True)
                self._listener.start()

    def stop(self) -> None:
        """Send what is left to send (and leave the slots' sender counts), then end the worker."""
        if self._thread is None:
            return
        self._apply_answers()
        if not self.busy and not self.lost:
            for slot in self._active:
                self._writes[("leave", slot)] = "0"
            self._send_job(heartbeat=False)
        self._stopping.set()
        self._jobs.put(None)
        self._thread.join(timeout=2 * self.redis_config.timeout + 0.5)
        if self._listener is not None:
            self._listener.join(timeout=2 * self.redis_config.timeout + 0.5)
        self._thread = self._listener = None
        self._call_soon = None
        self._apply_answers()

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def lost(self) -> bool:
        """Redis did not answer the last exchange: the board decides alone until it does."""
        return self._outage.lost

    # -- the reactor side ---------------------------------------------------

    def tick(self) -> None:
        """Fold in the worker's answers; start the next exchange when one is due."""
        self._apply_answers()
        now = self.clock()
        if self._busy or (now - self._last_job < self.redis_config.refresh and not self._again):
            return
        if not self._outage.may_try():
            return
        self._send_job()

    def sync(self, timeout: float = 2.0) -> bool:
        """One exchange, waited for: for a start, a close, and tests. True if Redis answered."""
        self.start()
        deadline = time.monotonic() + timeout
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.001)
            self._apply_answers()
        if self._busy:
            return False
        self._send_job()
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.001)
            self._apply_answers()
        return not self._busy and not self.lost

    def _kick(self) -> None:
        """An event: send it now rather than at the next refresh."""
        self._news()

    def _write(self, kind: str, slot: str, value: float | str) -> None:
        key = (kind, slot)
        if kind in ("cool", "open") and key in self._writes:
            value = max(float(self._writes[key]), float(value))
        self._writes[key] = value if isinstance(value, str) else repr(float(value))
        if kind == "open":
            self._writes.pop(("close", slot), None)
        elif kind == "close":
            self._writes.pop(("open", slot), None)

    def _send_job(self, heartbeat: bool = True) -> None:
        now = self.clock()
        writes, self._writes = self._writes, {}
        if self.lost:
            writes = {**self._snapshot(now), **writes}
        active: list[str] = []
        if heartbeat:
            for slot, seen in list(self._active.items()):
                if now - seen > ACTIVE_WINDOW or slot not in self._slots:
                    del self._active[slot]
                    self._shares.pop(slot, None)
                else:
                    active.append(slot)
        claims: list[str] = []
        if heartbeat and not self.lost:
            claims = self._claims(now)
        self._busy = True
        self._again = False
        self._last_job = now
        self._jobs.put((writes, claims, active, self._rates_since, now))

    def _claims(self, now: float) -> list[str]:
        """(slot, how many, rate) for each paced slot that will run out of granted sends."""
        claims: list[str] = []
        for slot, (held, asked) in list(self._want.items()):
            state = self._slots.get(slot)
            if state is None or state.pace is None or (now - asked > _WANT_MEMORY and now >= state.cooldown_until):
                del self._want[slot]
                continue
            rate = state.pace.rate
            ahead = max(1, math.ceil(rate / self.share(slot) * LEASE_AHEAD * self.redis_config.refresh))
            have = len(self._leases.get(slot, ()))
            want = min(held, ahead) - have
            if want > 0:
                claims += [slot, str(want), repr(rate)]
        return claims

    def _snapshot(self, now: float) -> Writes:
        """This process's cooldowns and open circuits, to publish again after an outage."""
        writes: Writes = {}
        for slot, state in self._slots.items():
            if state.cooldown_until > now:
                writes[("cool", slot)] = repr(state.cooldown_until - now)
            if state.breaker is not None and state.breaker.state != CLOSED and state.breaker.opened_until > now:
                writes[("open", slot)] = repr(state.breaker.opened_until - now)
        return writes

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            writes, claims, active, since, sent = job
            args: list[Any] = [self.process_id, self._active_prefix, ACTIVE_WINDOW, len(writes), repr(since)]
            args += [len(claims) // 3, repr(LEASE_AHEAD * self.redis_config.refresh)]
            for (kind, slot), value in writes.items():
                args += [kind, slot, value]
            args += claims
            args += active
            try:
                answer = self._script(keys=self._keys, args=args)
            except Exception as error:  # the worker must outlive any Redis failure
                self._answers.append((writes, sent, None, self.clock(), error))
            else:
                self._answers.append((writes, sent, answer, self.clock(), None))
            call_soon = self._call_soon
            if call_soon is not None:
                call_soon(self._answered)

    def _answered(self) -> None:
        self._apply_answers()
        if self._again and not self._busy and not self.lost:
            self._again = False
            self._send_job()

    def _news(self) -> None:
        """An event here, or news from the fleet: exchange now (after the one in flight)."""
        if self._busy:
            self._again = True
        elif not self.lost:
            self._send_job()

    def _listen(self) -> None:
        """Wait for the fleet's news on a connection of its own (one per process)."""
        channel = self._keys[3]
        while not self._stopping.is_set():
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(channel)
                while not self._stopping.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is None:
                        continue
                    sender = message["data"].decode() if isinstance(message["data"], bytes) else str(message["data"])
                    call_soon = self._call_soon
                    if sender != self.process_id and call_soon is not None:
                        call_soon(self._news)
            except Exception:  # lost: the exchanges notice and report it; listen again later
                self._stopping.wait(BACKOFF_MAX / 2)

    def _apply_answers(self) -> None:
        while self._answers:
            writes, sent, answer, got, error = self._answers.popleft()
            self._busy = False
            if error is not None:
                for key, value in writes.items():
                    self._writes.setdefault(key, value)  # newer events win
                self._lose(error)
                continue
            if self._outage.succeeded() is not None:
                self.on_back(sum(1 for kind, _ in writes if kind in ("cool", "open")))
            self._merge(answer, sent, got)

    def _lose(self, error: BaseException) -> None:
        if self._outage.failed():
            self.on_lost(error)

    def _merge(self, answer: Any, sent: float, got: float) -> None:
        cooling, circuits, rates, counts, leases, _server_now = answer
        now = self.clock()
        for slot, remaining in _pairs(cooling):
            self._remote_cooldown(slot, got + float(remaining) - now)
        listed = dict(_pairs(circuits))
        for slot, remaining in listed.items():
            self._remote_circuit(slot, got + float(remaining), now)
        for slot, state in list(self._slots.items()):
            breaker = state.breaker
            if (
                breaker is not None
                and breaker.state != CLOSED
                and slot not in listed
                and self._opened_at.get(slot, -1.0) < sent
            ):
                breaker.succeeded()  # closed by a success elsewhere
                self._opened_at.pop(slot, None)
                self.on_remote_circuit(slot, False)
        for slot, value in _pairs(rates):
            rate, who, at = value.split(" ")
            self._rates_since = max(self._rates_since, float(at))
            if who != self.process_id:
                number, _, kind = rate.partition(":")
                self._adopt_rate(slot, float(number), now, cut=kind == "cut")
        for slot, count in _pairs(counts):
            self._shares[slot] = max(1, int(count))
        for slot, times in _pairs(leases):
            state = self._slots.get(slot)
            if state is None or state.pace is None or not times:
                continue
            granted = self._leases.setdefault(slot, collections.deque())
            # A claim that crossed this process's own throttle on the way may fall inside the cooldown.
            granted.extend(t for t in (got + float(offset) for offset in times.split(" ")) if t >= state.cooldown_until)
            if granted:
                sooner = granted[0] < state.next_paced
                state.next_paced = granted[0]
                if sooner:
                    # The queue holds the slot until the time it last read
                    # (a fallback, or a later grant): it must look again.
                    self.on_sooner(slot)
                self.on_wake(granted[0])

    def _pace_after_cooldown(self, slot: str) -> None:
        """Drop granted sends the cooldown overtook; start the fleet's paced senders apart."""
        state = self._slots[slot]
        granted = self._leases.get(slot)
        while granted and granted[0] < state.cooldown_until:
            granted.popleft()
        if state.pace is not None:
            spread = self.rng.random() * self.share(slot) / state.pace.rate
            if not self.lost:
                spread += LEASE_AHEAD * self.redis_config.refresh  # a granted time comes first
            state.next_paced = granted[0] if granted else state.cooldown_until + spread

    def _remote_cooldown(self, slot: str, seconds: float) -> None:
        state = self._slots.get(slot)
        known = state.cooldown_until if state is not None else 0.0
        if CooldownBoard.cool(self, slot, seconds, self.jitter(slot)):
            self._pace_after_cooldown(slot)
            if self.clock() + seconds > known + _SAME:  # not our own write coming back a little later
                self.on_remote_cool(slot, seconds)

    def _remote_circuit(self, slot: str, until: float, now: float) -> None:
        if until <= now:
            return  # expired: half-open, each breaker probes on its own
        state = self._state(slot)
        if state.breaker is None:
            state.breaker = Breaker()
        breaker = state.breaker
        if breaker.state == CLOSED or until > breaker.opened_until + _SAME:
            was_closed = breaker.force_open(until)
            self._opened_at[slot] = now
            if was_closed:
                self.on_remote_circuit(slot, True)

    def _adopt_rate(self, slot: str, rate: float, now: float, cut: bool) -> None:
        """Follow the fleet's pace: a cut restarts the cubic curve here, growth is taken as is.

        Every process grows the one fleet rate from its own successes, as one
        crawler would from all of them.
        """
        state = self._state(slot)
        if state.pace is None:
            state.pace = RateController()
        pace = state.pace
        if cut:
            pace.adopted(rate, now)
        else:
            pace.rate = rate
        self._published[slot] = pace.rate
        state.last_seen = now

    def _state(self, slot: str) -> SlotState:
        state = self._slots.get(slot)
        if state is None:
            state = self._slots[slot] = SlotState()
        return state

    # -- the board's events, published ---------------------------------------

    def cool(self, slot: str, seconds: float, wake_jitter: float = 0.0) -> float:
        added = super().cool(slot, seconds, wake_jitter)
        if added:
            self._pace_after_cooldown(slot)
            self._write("cool", slot, self._slots[slot].cooldown_until - self.clock())
            self._kick()
        return added

    def breaker_throttled(self, slot: str, sent_at: float, threshold: int, open_seconds: float) -> bool:
        opened = super().breaker_throttled(slot, sent_at, threshold, open_seconds)
        if opened:
            self._opened_at[slot] = self.clock()
            self._write("open", slot, open_seconds)
            self._kick()
        return opened

    def success(self, slot: str, token_ratio: float, max_tokens: float) -> bool:
        closed = super().success(slot, token_ratio, max_tokens)
        if closed:
            self._opened_at.pop(slot, None)
            self._write("close", slot, "0")
            self._kick()
        return closed

    def released(self, slot: str) -> None:
        state = self._slots.get(slot)
        probing = state is not None and state.breaker is not None and state.breaker.probing
        super().released(slot)
        now = self.clock()
        self._active[slot] = now
        if state is not None and state.pace is not None:
            granted = self._leases.get(slot)
            while granted and granted[0] <= now + 0.001:
                granted.popleft()  # the one just used, and any that went by unused
            if self.lost:
                self._leases.pop(slot, None)  # paced on this process's share alone
            else:
                self._next_granted(slot, state, granted, now)
        if state is not None and state.breaker is not None and state.breaker.probing and not probing:
            # This process sends the probe: the rest of the fleet holds meanwhile.
            self._opened_at[slot] = self.clock()
            self._write("open", slot, state.breaker.opened_until - self.clock())
            self._kick()

    def ready_at(self, slot: str, held: int = 1) -> float:
        state = self._slots.get(slot)
        if state is not None:
            now = self.clock()
            self._active[slot] = now
            if state.pace is not None:
                self._want[slot] = (held, now)
                self._skip_late_leases(slot, state, now)
        return super().ready_at(slot, held)

    def _skip_late_leases(self, slot: str, state: SlotState, now: float) -> None:
        """Give up granted send times this process is too late for (its loop stalled).

        The fleet's times are one fleet interval apart: a send later than the
        pace's margin under the limit comes too close to the next process's,
        which a limiter with no burst answers with a 429 and a cooldown for
        the whole fleet. Skipping costs one interval.
        """
        granted = self._leases.get(slot)
        if not granted or granted[0] >= now or self.lost or state.pace is None:
            return
        late = (1 - MARGIN) / state.pace.rate
        skipped = False
        while granted and granted[0] < now - late:
            granted.popleft()
            skipped = True
        if skipped:
            self.on_late_lease(slot)
            self._next_granted(slot, state, granted, now)

    def _next_granted(self, slot: str, state: SlotState, granted: Any, now: float) -> None:
        """The slot's next send: its next granted time, or a fallback if none comes by then."""
        assert state.pace is not None
        wait = max(self.share(slot) / state.pace.rate, LEASE_AHEAD * self.redis_config.refresh)
        state.next_paced = granted[0] if granted else now + wait

    def throttled(self, slot: str, sent_at: float, beta: float = 0.7) -> float | None:
        rate = super().throttled(slot, sent_at, beta)
        if rate is not None:
            self._active[slot] = self.clock()
            self._published[slot] = rate
            self._write("rate", slot, f"{rate!r}:cut")
            self._kick()
        return rate

    def succeeded(self, slot: str) -> None:
        super().succeeded(slot)
        rate = self.rate(slot)
        if rate is not None and abs(rate - self._published.get(slot, 0.0)) > 0.01 * rate:
            self._published[slot] = rate
            self._write("rate", slot, f"{rate!r}:grow")  # sent with the next refresh

    def _sooner(self, slot: str, state: SlotState, before: float, after: float, now: float) -> bool:
        return False  # the fleet's send times are granted by Redis, one fleet interval apart

    def share(self, slot: str) -> float:
        return float(self._shares.get(slot, 1))


def _pairs(flat: list[Any]) -> list[tuple[str, str]]:
    texts = [item.decode() if isinstance(item, bytes) else str(item) for item in flat]
    return list(zip(texts[::2], texts[1::2]))
