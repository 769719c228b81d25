"""The wire between one crawler process and the fleet's Redis: one Lua round trip per refresh.

This module knows Redis and threads, and no fleet rule: it sends what the board
gives it (the process's events, its claims for paced sends, the slots it sends
to), brings back what changed in the fleet since the last exchange, and checks
every value of it before the board sees it. All Redis I/O runs on one worker
thread, so a dead Redis costs a timeout there, never a frozen crawl.

Reads are incremental: cooldowns and circuits through an index of changes by
server time, rates through an index by update time (which also expires them
after the remembered-limits age), each read in pages from a cursor. A process
that starts, or comes back after an outage, first reads every live cooldown
and circuit once. An exchange costs what changed, not what Redis holds.
"""

from __future__ import annotations

import collections
import hashlib
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..redisconfig import RedisConfig
from .outage import BACKOFF_MAX, Outage
from .ratewire import Rate, bounded, read_rates, text
from .script import EXCHANGE, MAX_RATE, PAGE

__all__ = ["Answer", "Job", "Reply", "RedisBoardUnavailable", "RedisExchange", "read_reply", "slot_key"]

class RedisBoardUnavailable(RuntimeError):
    """Redis could not be reached when the crawl started, and falling back was not allowed."""


def slot_key(slot: str) -> str:
    """A slot's part of a key: a digest, so no slot name ends up spelling another's key
    (``x:next``, braces Redis Cluster reads as hash tags, 10 KB names)."""
    return hashlib.sha1(slot.encode("utf-8", "surrogatepass")).hexdigest()


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
    try:
        return redis.Redis.from_url(config.url, **params)
    except (TypeError, ValueError) as error:
        raise RedisBoardUnavailable(
            f"RETRY_AFTER_REDIS_URL {config.safe_url} cannot be used: {config.scrub(str(error))}"
        ) from None


Writes = dict[tuple[str, str], str]


@dataclass
class Job:
    """One exchange to make: this process's events and what it asks of the fleet."""

    writes: Writes
    claims: list[tuple[str, int, float]] = field(default_factory=list)
    """(slot, send times wanted, the slot's rate)."""
    active: list[str] = field(default_factory=list)
    sent: float = 0.0
    asks: list[str] = field(default_factory=list)
    """Slots this process just met: the fleet's rate for each, if it has one."""
    probes: list[str] = field(default_factory=list)
    """Slots whose circuit expired here: may this process send the fleet's one probe?"""
    first: list[tuple[str, int]] = field(default_factory=list)
    """(slot, how many) first-contact sends asked for, for slots the fleet has not heard from."""


@dataclass
class Reply:
    """What the fleet answered, every value checked: the board trusts it as it is."""

    cooldowns: dict[str, float]
    """Seconds left of a cooldown, per slot that changed (0.0: none)."""
    circuits: dict[str, float | None]
    """Seconds left of an open circuit (<= 0: expired), None: closed, per slot that changed."""
    rates: list[Rate]
    """(slot, rate, a cut?, who wrote it), oldest first: every rate that changed."""
    asked: list[Rate]
    """The same, for the slots asked about."""
    counts: dict[str, int]
    grants: dict[str, list[float]]
    """Send times granted, in seconds from the reply, per slot claimed."""
    snapshot: bool
    """Every live cooldown and circuit is in it (a slot missing is closed)."""
    more: bool
    invalid: int
    rates_cursor: tuple[float, str] | None
    server_now: float
    probes: list[str] = field(default_factory=list)
    """The probes granted to this process."""
    first: dict[str, int] = field(default_factory=dict)
    """First-contact sends granted per slot asked; -1: the fleet has heard from the host."""
    paces: dict[str, float] = field(default_factory=dict)
    """The pace (requests/s) the fleet granted each claimed slot's times at: the slowest its senders claim."""
    plateaus: dict[str, tuple[float, bool, float]] = field(default_factory=dict)
    """Per slot of a cut in ``rates`` or ``asked``: the plateau its cutter regrows to, whether it is pinned down,
    and the pace slow start last passed when the cut was its exit (else 0.0)."""
    gaps: dict[str, float] = field(default_factory=dict)
    """Seconds from the fleet's last granted time before a claim's first one to it, per claimed slot."""


@dataclass
class Answer:
    job: Job
    reply: Reply | None
    error: BaseException | None
    got: float
    lost_now: bool = False
    """This failure lost the connection (report it once)."""
    back_after: float | None = None
    """This reply ended an outage of that many seconds."""


def read_reply(raw: Any, horizon: float) -> Reply:
    """Check every value of the script's answer: garbage is counted and left out, never raised."""
    changed, rates, counts, leases, server_now, snapshot, more, invalid, asked, cooling, opened, *rest = raw
    since, probes, first = rest[:2], rest[2], rest[3]
    invalid = int(invalid)
    now = float(text(server_now))
    texts = [text(item) for item in changed]
    cooldowns: dict[str, float] = {}
    circuits: dict[str, float | None] = {}
    texts += [item for pair in _pairs(cooling) for item in (pair[0], pair[1], "")]
    texts += [item for pair in _pairs(opened) for item in (pair[0], "", pair[1])]
    for slot, cool, circuit in zip(texts[::3], texts[1::3], texts[2::3]):
        until = bounded(cool, -math.inf, math.inf) if cool else None
        invalid += bool(cool) and until is None
        if slot not in cooldowns or until is not None:
            cooldowns[slot] = max(0.0, until - now) if until is not None else 0.0
        if circuit:
            opened = bounded(circuit, -math.inf, math.inf)
            invalid += opened is None
            circuits[slot] = opened - now if opened is not None else None
        elif slot not in circuits:
            circuits[slot] = None
    plateaus: dict[str, tuple[float, bool, float]] = {}
    rates_read, cursor, garbage = read_rates(rates, plateaus)
    if cursor is None:
        cursor = (float(text(since[0])), text(since[1]))
    read_asked, _, asked_garbage = read_rates(asked, plateaus)
    invalid += garbage + asked_garbage
    texts = [text(item) for item in counts]
    read_counts = {slot: max(1, min(10_000, int(count))) for slot, count in zip(texts[::2], texts[1::2])}
    grants: dict[str, list[float]] = {}
    paces, gaps = dict[str, float](), dict[str, float]()  # the fleet's pace, the gap before a claim's first time
    texts = [text(item) for item in leases]
    for slot, times, pace, gap in zip(texts[::4], texts[1::4], texts[2::4], texts[3::4]):
        offsets = [bounded(offset, -1.0, 86400.0) for offset in times.split()]
        grants[slot] = [offset for offset in offsets if offset is not None]
        invalid += offsets.count(None)
        for told, low, high, into in ((pace, 0.0, MAX_RATE, paces), (gap, 1.0 / MAX_RATE, 3600.0, gaps)):
            value = bounded(told, low, high) if told else None
            into.update({slot: value} if value else {})
            invalid += bool(told) and not value
    return Reply(cooldowns, circuits, rates_read, read_asked, read_counts, grants, bool(int(snapshot)),
                 bool(int(more)), invalid, cursor, now, [text(slot) for slot in probes],
                 {slot: max(-1, min(10_000, int(count))) for slot, count in _pairs(first)}, paces, plateaus, gaps)


def _pairs(flat: list[Any]) -> list[tuple[str, str]]:
    texts = [text(item) for item in flat]
    return list(zip(texts[::2], texts[1::2]))


class KeyspaceError(RuntimeError):
    """A key of the board holds another type than the board writes there (another program's)."""


class RedisExchange:
    """One process's exchanges with Redis, on a worker thread; answers are taken on the crawl's."""

    def __init__(self, config: RedisConfig, process_id: str, clock: Callable[[], float] = time.monotonic,
                 client: Any = None, memory_age: float = 604800.0, active_window: float = 5.0,
                 horizon: float = 0.3, rng: Any = None) -> None:
        import random

        self.config = config
        self.process_id = process_id
        self.clock = clock
        self.memory_age = memory_age
        self.active_window = active_window
        self.horizon = horizon
        self.client = client if client is not None else redis_client(config)
        prefix = config.prefix
        self._keys = [f"{prefix}:cooldown", f"{prefix}:circuit", f"{prefix}:rate", f"{prefix}:rate:at",
                      f"{prefix}:changed", f"{prefix}:news"]
        self._slot_prefix = f"{prefix}:slot:"
        self._script = self.client.register_script(EXCHANGE)
        self.outage = Outage(clock, rng if rng is not None else random)
        self._changes_cursor: str = ""
        self._rates_cursor: tuple[float, str] | None = None
        """Where the rates read last ended; None: at the first exchange's time."""
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._answers: collections.deque[Answer] = collections.deque()
        self._done = threading.Condition()
        self.busy = False
        self._thread: threading.Thread | None = None
        self._listener: threading.Thread | None = None
        self._stopping = threading.Event()
        self._call_soon: Callable[[Callable[[], None]], Any] | None = None
        self.on_answer: Callable[[], None] = lambda: None
        self.on_news: Callable[[], None] = lambda: None

    @property
    def lost(self) -> bool:
        return self.outage.lost

    def may_try(self) -> bool:
        return self.outage.may_try()

    def connect(self) -> BaseException | None:
        """Ping once, blocking for at most the socket timeout; the error if Redis is down."""
        try:
            self.client.ping()
        except Exception as error:  # redis-py raises its own errors and OSError alike
            self.outage.failed()
            return error
        return None

    def start(self, call_soon: Callable[[Callable[[], None]], Any] | None = None) -> None:
        if self._thread is None:
            self._call_soon = call_soon
            self._stopping.clear()
            self._thread = threading.Thread(target=self._work, name="retry-after-redis", daemon=True)
            self._thread.start()
            if call_soon is not None:
                self._listener = threading.Thread(target=self._listen, name="retry-after-redis-news", daemon=True)
                self._listener.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._jobs.put(None)
        self._thread.join(timeout=2 * self.config.timeout + 0.5)
        if self._listener is not None:
            self._listener.join(timeout=2 * self.config.timeout + 0.5)
        self._thread = self._listener = None
        self._call_soon = None

    def send(self, job: Job) -> None:
        self.busy = True
        self._jobs.put(job)

    def wait(self, deadline: float) -> None:
        """Block until an answer is in or ``deadline`` (time.monotonic()) passes."""
        with self._done:
            while not self._answers and time.monotonic() < deadline:
                self._done.wait(max(0.0, min(0.05, deadline - time.monotonic())))

    def take(self) -> list[Answer]:
        """The answers in, with the outage state they changed."""
        taken = []
        while self._answers:
            answer = self._answers.popleft()
            self.busy = False
            if answer.error is not None:
                answer.lost_now = self.outage.failed()
                self._changes_cursor = ""  # a return reads every live cooldown and circuit again
            else:
                answer.back_after = self.outage.succeeded()
            taken.append(answer)
        return taken

    def _args(self, job: Job) -> list[Any]:
        args: list[Any] = [
            self.process_id, self._slot_prefix, self.active_window, repr(self.memory_age), repr(self.horizon),
            self._changes_cursor, *(("", "") if self._rates_cursor is None else
                                    (repr(self._rates_cursor[0]), self._rates_cursor[1])), PAGE,
            len(job.writes), len(job.claims), len(job.asks), len(job.probes), len(job.first),
        ]
        for (kind, slot), value in job.writes.items():
            args += [kind, slot, value, slot_key(slot)]
        for slot, want, rate in job.claims:
            args += [slot, slot_key(slot), want, repr(rate)]
        args += job.asks
        for slot in job.probes:
            args += [slot, slot_key(slot)]
        for slot, limit in job.first:
            args += [slot, slot_key(slot), limit]
        for slot in job.active:
            args += [slot, slot_key(slot)]
        # A slot name is any str (download_slot meta, a park file): one with a lone
        # surrogate must not make the client's strict UTF-8 fail every exchange.
        return [arg.encode("utf-8", "surrogatepass") if isinstance(arg, str) else arg for arg in args]

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                raw = self._script(keys=self._keys, args=self._args(job))
                if raw and text(raw[0]) == "wrongtype":
                    raise KeyspaceError(
                        f"key {text(raw[1])} holds a {text(raw[2])}, not what the board keeps there: another "
                        "program writes under RETRY_AFTER_REDIS_PREFIX; give this fleet a prefix of its own"
                    )
                reply = read_reply(raw, self.horizon)
            except Exception as error:  # the worker must outlive any Redis failure or garbage
                answer = Answer(job, None, error, self.clock())
            else:
                self._changes_cursor = f"{reply.server_now:.6f}"
                if reply.rates_cursor is not None:
                    self._rates_cursor = reply.rates_cursor
                answer = Answer(job, reply, None, self.clock())
            with self._done:
                self._answers.append(answer)
                self._done.notify_all()
            call_soon = self._call_soon
            if call_soon is not None:
                call_soon(self.on_answer)

    def _listen(self) -> None:
        """Wait for the fleet's news on a connection of its own (one per process)."""
        channel = self._keys[5]
        while not self._stopping.is_set():
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(channel)
                while not self._stopping.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is None:
                        continue
                    call_soon = self._call_soon
                    if text(message["data"]) != self.process_id and call_soon is not None:
                        call_soon(self.on_news)
            except Exception:  # lost: the exchanges notice and report it; listen again later
                self._stopping.wait(BACKOFF_MAX / 2)
