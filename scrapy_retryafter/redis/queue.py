"""A scrapy-redis frontier that hands out a host's requests only when the host may take them.

scrapy-redis keeps one sorted set for the whole frontier, so a throttled
host's requests come out of it anyway and wait in each process's downloader,
holding its CONCURRENT_REQUESTS places. Here every slot has a sorted set of
its own and a list of slots (a sorted set keyed by when each may send next)
says which to serve. A pop is one Lua call, so the fleet agrees on it without
locks: it skips the slots whose cooldown or open circuit the Redis board
(same Redis, same prefix) lists, and those this process's own board holds
(pacing, a half-open probe, a cooldown not yet published) or whose
downloader slot is full; the throttled host's requests stay in Redis while
every process keeps crawling the others.

A slot found cooling is re-keyed to the time it reopens, so later pops step
over it without looking; a pop looks at most at the slots this process holds
plus a few, and len() is one counter.

Redis may go away mid-crawl. Each push and pop carries a token of this
process, so one repeated after its answer was lost (Redis killed between
doing it and replying) is applied once: a pop answers again what it took, a
push is not added twice. While Redis is unreachable, pushes wait here in
order and are written first when it is back, pops hand out nothing, and
len() is never 0, so the spider does not close as idle on a frontier it
cannot see.
"""

from __future__ import annotations

import collections
import itertools
import logging
import pickle
import time
import uuid
from typing import TYPE_CHECKING, Any

from scrapy import signals

from .. import scrapy_compat
from ..failures import NOT_BEFORE
from ..hostpause import PROBE
from .link import FrontierLink, FrontierUnreachable

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from scrapy import Request, Spider

    from ..board import CooldownBoard

__all__ = ["CooldownAwareRedisQueue", "SlotFrontier"]

logger = logging.getLogger(__name__)

_SCAN_EXTRA = 16
"""Slots a pop looks at beyond those this process holds (cooling ones found are re-keyed)."""
_MOVE_LATER = 50
"""Retries whose backoff ended, moved into their slots per pop at most."""
_OWNER_MEMORY = 3600
_TIMEOUT_WITHOUT_CRAWL = 0.5
"""Seconds a Redis call may take for a queue built outside a crawl (RETRY_AFTER_REDIS_TIMEOUT's default)."""
"""Seconds a process's last push and pop tokens are kept after its last call."""

# KEYS: slots, count, seq, later, later info, this process's last push;
# ARGV: slot key prefix, slot, score, data, delay, token ('' for none).
PUSH = """
if ARGV[6] ~= '' then
  if redis.call('GET', KEYS[6]) == ARGV[6] then return 0 end  -- a repeat of a push already made
  redis.call('SET', KEYS[6], ARGV[6], 'EX', OWNER_MEMORY)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local id = string.format('%016x', redis.call('INCR', KEYS[3]))
local delay = tonumber(ARGV[5])
redis.call('INCR', KEYS[2])
if delay > 0 then
  redis.call('ZADD', KEYS[4], now + delay, id .. ARGV[4])
  redis.call('HSET', KEYS[5], id, ARGV[3] .. ' ' .. ARGV[2])
else
  redis.call('ZADD', ARGV[1] .. ARGV[2], ARGV[3], id .. ARGV[4])
  redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[2])
end
return 1
""".replace("OWNER_MEMORY", str(_OWNER_MEMORY))

# KEYS: slots, count, board cooldowns, board circuits, later, later info, this process's last pop;
# ARGV: slot key prefix, how many slots to look at, token ('' for none), the slots this process holds...
POP = """
local token = ARGV[3]
if token ~= '' then
  local last = redis.call('HMGET', KEYS[7], 'token', 'slot', 'data')
  if last[1] == token then return {last[2], last[3], '0'} end  -- its answer was lost: the same again
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local prefix = ARGV[1]
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, MOVE_LATER)) do
  local id = string.sub(member, 1, 16)
  local info = redis.call('HGET', KEYS[6], id)
  redis.call('ZREM', KEYS[5], member)
  redis.call('HDEL', KEYS[6], id)
  if info then
    local score, slot = string.match(info, '^(%S+) (.*)$')
    redis.call('ZADD', prefix .. slot, score, member)
    redis.call('ZADD', KEYS[1], 'NX', 0, slot)
  end
end
local held = {}
for i = 4, #ARGV do held[ARGV[i]] = true end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, slot in ipairs(due) do
  if not held[slot] then
    local hold = math.max(tonumber(redis.call('ZSCORE', KEYS[3], slot) or '0'),
                          tonumber(redis.call('ZSCORE', KEYS[4], slot) or '0'))
    if hold > now then
      redis.call('ZADD', KEYS[1], hold, slot)
    else
      local key = prefix .. slot
      local head = redis.call('ZRANGE', key, 0, 0)
      if head[1] then
        redis.call('ZREM', key, head[1])
        redis.call('DECR', KEYS[2])
        if redis.call('ZCARD', key) == 0 then
          redis.call('ZREM', KEYS[1], slot)
        else
          redis.call('ZADD', KEYS[1], now, slot)  -- to the back of the round
        end
        local data = string.sub(head[1], 17)
        if token ~= '' then
          redis.call('HSET', KEYS[7], 'token', token, 'slot', slot, 'data', data)
          redis.call('EXPIRE', KEYS[7], OWNER_MEMORY)
        end
        return {slot, data, '0'}
      end
      redis.call('ZREM', KEYS[1], slot)
    end
  end
end
local waits = {}
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if first[2] then waits[#waits + 1] = tonumber(first[2]) - now end
local later = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
if later[2] then waits[#waits + 1] = tonumber(later[2]) - now end
local wait = -1
if #waits > 0 then wait = math.max(0, math.min(unpack(waits))) end
return {false, false, tostring(wait)}
""".replace("MOVE_LATER", str(_MOVE_LATER)).replace("OWNER_MEMORY", str(_OWNER_MEMORY))


class SlotFrontier:
    """Requests as bytes, per slot, in Redis: the part of the queue that knows no Scrapy."""

    def __init__(self, client: Any, key: str, board_prefix: str, owner: str | None = None) -> None:
        self.client = client
        self.key = key
        owner = owner or uuid.uuid4().hex
        self._owner_keys = [f"{key}:owner:{owner}:pushed", f"{key}:owner:{owner}:popped"]
        self._slot_prefix = f"{key}:slot:"
        self._slots = f"{key}:slots"
        self._count = f"{key}:count"
        self._seq = f"{key}:seq"
        self._later = f"{key}:later"
        self._later_info = f"{key}:later:info"
        self._board_keys = [f"{board_prefix}:cooldown", f"{board_prefix}:circuit"]
        self._push = client.register_script(PUSH)
        self._pop = client.register_script(POP)

    def push(self, slot: str, data: bytes, priority: int = 0, delay: float = 0.0, token: str = "") -> bool:
        """Higher priority first, then first in first out; ``delay`` seconds before it may go.

        ``token``: a push repeated with the token of this owner's last push is
        not made again (False).
        """
        keys = [self._slots, self._count, self._seq, self._later, self._later_info, self._owner_keys[0]]
        return bool(self._push(keys=keys, args=[self._slot_prefix, slot, -priority, data, repr(max(0.0, delay)), token]))

    def pop(self, held: Sequence[str] = (), token: str = "") -> tuple[str, bytes] | float | None:
        """(slot, data) from a slot that may send; else seconds until the board lets one,
        or None when Redis knows of no such time (empty, or only ``held`` slots are due).

        ``held``: slots this process may not send to now, whatever the board says.
        ``token``: a pop repeated with the token of this owner's last pop gets
        the same request again (its first answer was lost on the way).
        """
        keys = [self._slots, self._count, *self._board_keys, self._later, self._later_info, self._owner_keys[1]]
        slot, data, wait = self._pop(keys=keys, args=[self._slot_prefix, len(held) + _SCAN_EXTRA, token, *held])
        if slot is not None:
            return (slot.decode() if isinstance(slot, bytes) else slot), data
        seconds = float(wait)
        return None if seconds < 0 else seconds

    def __len__(self) -> int:
        return int(self.client.get(self._count) or 0)

    def clear(self) -> None:
        slots = self.client.zrange(self._slots, 0, -1)
        infos = self.client.hvals(self._later_info)
        names = {s.decode() if isinstance(s, bytes) else s for s in slots}
        names |= {(i.decode() if isinstance(i, bytes) else i).partition(" ")[2] for i in infos}
        keys = [self._slots, self._count, self._seq, self._later, self._later_info, *self._owner_keys]
        self.client.delete(*keys, *(self._slot_prefix + name for name in names))


class CooldownAwareRedisQueue:
    """SCHEDULER_QUEUE_CLASS for scrapy-redis: one shared frontier, cooling hosts held in it.

    scrapy-redis's scheduler builds it with (server, spider, key, serializer). A script
    seeding a frontier builds it with a bare ``Spider(name)``, crawler-less: it then
    pushes and pops as a plain priority queue per slot, with no board to consult.
    """

    def __init__(self, server: Any, spider: Spider, key: str, serializer: Any = None) -> None:
        from ..extension import RetryAfterExtension

        self.server = server
        self.spider = spider
        self.key = key % {"spider": spider.name} if "%(" in key else key
        self.serializer = serializer if serializer is not None else pickle
        crawler = getattr(spider, "crawler", None)
        self._crawler = crawler
        self._extension: RetryAfterExtension | None = None
        self._board: CooldownBoard | None = None
        prefix = "retry_after"
        if crawler is not None:
            self._extension = RetryAfterExtension.of(crawler)
            self._extension.queue_holds_slots = True
            self._board = self._extension.board
            redis = self._extension.config.redis
            prefix = redis.prefix if redis is not None else prefix
            self._link = FrontierLink.of(crawler, server)
        else:
            self._link = FrontierLink(server, _TIMEOUT_WITHOUT_CRAWL, spider=spider)
        self._link.flushers.append(self._flush_pending)
        self._frontier = SlotFrontier(self._link.client, self.key, prefix)
        self._tokens = (str(n) for n in itertools.count(1))
        self._pop_token = next(self._tokens)
        self._pending: collections.deque[tuple[str, bytes, int, float, str]] = collections.deque()
        """Pushes Redis has not taken yet: (slot, data, priority, not before (epoch), token), in order."""
        self._last_len = 0
        if crawler is not None and self._extension is not None:
            self._extension.held_requests.append(self._take_pending)
            crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        self._migrate()

    def _encode(self, request: Request) -> bytes:
        return self.serializer.dumps(request.to_dict(spider=self.spider))

    def _decode(self, data: bytes) -> Request:
        from scrapy.utils.request import request_from_dict

        return request_from_dict(self.serializer.loads(data), spider=self.spider)

    def push(self, request: Request) -> None:
        slot = self._extension.slot_of(request) if self._extension is not None else scrapy_compat.slot_key(self._crawler, request)
        not_before = 0.0
        if NOT_BEFORE in request.meta:
            try:
                not_before = float(request.meta[NOT_BEFORE])
            except (TypeError, ValueError):
                not_before = 0.0
        self._pending.append((slot, self._encode(request), request.priority, not_before, next(self._tokens)))
        try:
            self._link.call(self._flush_pending)
        except FrontierUnreachable:
            self._link.count("retry_after/redis/frontier_kept")

    def _flush_pending(self) -> tuple[int, int]:
        """Push what waits here, oldest first; each leaves the deque only once Redis has it."""
        pushed = 0
        while self._pending:
            slot, data, priority, not_before, token = self._pending[0]
            self._frontier.push(slot, data, priority, not_before - time.time() if not_before else 0.0, token)
            self._pending.popleft()
            pushed += 1
        return pushed, 0

    def _take_pending(self) -> Iterator[tuple[Request, str, str]]:
        """At close (the park file asks): one last push; what Redis still does not take is parked."""
        self._push_at_close()
        while self._pending:
            slot, data, _, _, _ = self._pending.popleft()
            yield self._decode(data), slot, "Redis was unreachable"

    def pop(self, timeout: float = 0) -> Request | None:
        """Never blocks: a slot that may send is found now or the engine is woken when one may."""
        board, extension = self._board, self._extension
        held: list[str] = []
        soonest = float("inf")
        now = 0.0
        if board is not None:
            now = board.clock()
            for slot in board:
                when = board.ready_at(slot, 1)
                if when > now:
                    held.append(slot)
                    soonest = min(soonest, when)
        held += [
            key for key, slot in scrapy_compat.downloader_slots(self._crawler).items()  # type: ignore[arg-type]
            if len(slot.active) >= slot.concurrency
        ]
        try:
            answer = self._link.call(lambda: self._frontier.pop(held, self._pop_token))
        except FrontierUnreachable:
            if extension is not None:
                extension.wake_at(self._link.outage.retry_at)
            return None
        self._pop_token = next(self._tokens)
        if isinstance(answer, tuple):
            slot, data = answer
            mark = board.released(slot) if board is not None and board.holds(slot) else None
            request = self._decode(data)
            if mark is not None and request is not None:
                request.meta[PROBE] = mark
            return request
        if extension is None:
            return None
        if answer is not None:
            soonest = min(soonest, now + answer)
        if soonest < float("inf") and len(self):
            extension.wake_at(soonest)
        return None

    def __len__(self) -> int:
        """Never 0 while Redis is unreachable: the spider must not close on a frontier it cannot see."""
        try:
            self._last_len = self._link.call(lambda: len(self._frontier))
        except FrontierUnreachable:
            return max(1, self._last_len + len(self._pending))
        return self._last_len + len(self._pending)

    def clear(self) -> None:
        self._pending.clear()
        self._frontier.clear()

    def close(self) -> None:
        self._push_at_close()

    def _push_at_close(self) -> None:
        if self._pending:
            try:
                self._link.call(self._flush_pending, force=True)
            except FrontierUnreachable:
                pass

    def _spider_closed(self, **kwargs: Any) -> None:
        """Parked by now, unless parking is off: then say which requests are lost."""
        self._push_at_close()
        if not self._pending:
            return
        urls = [self._decode(data).url for _, data, _, _, _ in self._pending]
        self._link.count("retry_after/redis/frontier_lost_at_close", len(urls))
        logger.error(
            "Redis frontier at %(url)s unreachable at close: %(count)d request(s) scheduled while it was down "
            "are lost (RETRY_AFTER_PARKING would have parked them): %(urls)s",
            {"url": self._link.url, "count": len(urls), "urls": urls},
            extra={"spider": self.spider},
        )
        self._pending.clear()

    def _migrate(self) -> None:
        """Move a frontier left by scrapy-redis's own queue (one sorted set or list) into the slots.

        Each request is pushed before it is removed, so a crash mid-way leaves a
        duplicate, never a loss; one process migrates at a time.
        """
        kind = self.server.type(self.key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind not in ("zset", "list"):
            return
        lock = f"{self.key}:migrating"
        if not self.server.set(lock, "1", nx=True, ex=60):
            return
        moved = 0
        try:
            while True:
                if kind == "zset":
                    batch = self.server.zrange(self.key, 0, 99, withscores=True)
                else:
                    batch = [(item, 0) for item in self.server.lrange(self.key, 0, 99)]
                if not batch:
                    break
                for data, _score in batch:
                    request = self._decode(data)
                    self.push(request)
                    if kind == "zset":
                        self.server.zrem(self.key, data)
                    else:
                        self.server.lrem(self.key, 1, data)
                    moved += 1
                self.server.expire(lock, 60)
        finally:
            self.server.delete(lock)
        logger.info(
            "Moved %(count)d request(s) from scrapy-redis's %(kind)s %(key)s into per-slot queues",
            {"count": moved, "kind": kind, "key": self.key},
        )
