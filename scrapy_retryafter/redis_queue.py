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
"""

from __future__ import annotations

import logging
import pickle
import time
from typing import TYPE_CHECKING, Any

from .failures import NOT_BEFORE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy import Request, Spider

__all__ = ["CooldownAwareRedisQueue", "SlotFrontier"]

logger = logging.getLogger(__name__)

_SCAN_EXTRA = 16
"""Slots a pop looks at beyond those this process holds (cooling ones found are re-keyed)."""
_MOVE_LATER = 50
"""Retries whose backoff ended, moved into their slots per pop at most."""

# KEYS: slots, count, seq, later, later info; ARGV: slot key prefix, slot, score, data, delay.
PUSH = """
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
"""

# KEYS: slots, count, board cooldowns, board circuits, later, later info;
# ARGV: slot key prefix, how many slots to look at, the slots this process holds...
POP = """
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
for i = 3, #ARGV do held[ARGV[i]] = true end
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
        return {slot, string.sub(head[1], 17), '0'}
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
""".replace("MOVE_LATER", str(_MOVE_LATER))


class SlotFrontier:
    """Requests as bytes, per slot, in Redis: the part of the queue that knows no Scrapy."""

    def __init__(self, client: Any, key: str, board_prefix: str) -> None:
        self.client = client
        self.key = key
        self._slot_prefix = f"{key}:slot:"
        self._slots = f"{key}:slots"
        self._count = f"{key}:count"
        self._seq = f"{key}:seq"
        self._later = f"{key}:later"
        self._later_info = f"{key}:later:info"
        self._board_keys = [f"{board_prefix}:cooldown", f"{board_prefix}:circuit"]
        self._push = client.register_script(PUSH)
        self._pop = client.register_script(POP)

    def push(self, slot: str, data: bytes, priority: int = 0, delay: float = 0.0) -> None:
        """Higher priority first, then first in first out; ``delay`` seconds before it may go."""
        keys = [self._slots, self._count, self._seq, self._later, self._later_info]
        self._push(keys=keys, args=[self._slot_prefix, slot, -priority, data, repr(max(0.0, delay))])

    def pop(self, held: Sequence[str] = ()) -> tuple[str, bytes] | float | None:
        """(slot, data) from a slot that may send; else seconds until the board lets one,
        or None when Redis knows of no such time (empty, or only ``held`` slots are due).

        ``held``: slots this process may not send to now, whatever the board says.
        """
        keys = [self._slots, self._count, *self._board_keys, self._later, self._later_info]
        slot, data, wait = self._pop(keys=keys, args=[self._slot_prefix, len(held) + _SCAN_EXTRA, *held])
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
        keys = [self._slots, self._count, self._seq, self._later, self._later_info]
        self.client.delete(*keys, *(self._slot_prefix + name for name in names))


class CooldownAwareRedisQueue:
    """SCHEDULER_QUEUE_CLASS for scrapy-redis: one shared frontier, cooling hosts held in it.

    scrapy-redis's scheduler builds it with (server, spider, key, serializer).
    """

    def __init__(self, server: Any, spider: Spider, key: str, serializer: Any = None) -> None:
        from .extension import RetryAfterExtension

        self.server = server
        self.spider = spider
        self.key = key % {"spider": spider.name} if "%(" in key else key
        self.serializer = serializer if serializer is not None else pickle
        crawler = spider.crawler
        self._extension = RetryAfterExtension.of(crawler)
        self._extension.queue_holds_slots = True
        self._board = self._extension.board
        redis = self._extension.config.redis
        prefix = redis.prefix if redis is not None else "retry_after"
        self._downloader = crawler.engine.downloader  # type: ignore[union-attr]
        self._frontier = SlotFrontier(server, self.key, prefix)
        self._migrate()

    def _encode(self, request: Request) -> bytes:
        return self.serializer.dumps(request.to_dict(spider=self.spider))

    def _decode(self, data: bytes) -> Request:
        from scrapy.utils.request import request_from_dict

        return request_from_dict(self.serializer.loads(data), spider=self.spider)

    def push(self, request: Request) -> None:
        slot = self._downloader.get_slot_key(request)
        delay = 0.0
        if NOT_BEFORE in request.meta:
            try:
                delay = float(request.meta[NOT_BEFORE]) - time.time()
            except (TypeError, ValueError):
                delay = 0.0
        self._frontier.push(slot, self._encode(request), request.priority, delay)

    def pop(self, timeout: float = 0) -> Request | None:
        """Never blocks: a slot that may send is found now or the engine is woken when one may."""
        board = self._board
        now = board.clock()
        held: list[str] = []
        soonest = float("inf")
        for slot in board:
            when = board.ready_at(slot, 1)
            if when > now:
                held.append(slot)
                soonest = min(soonest, when)
        held += [key for key, slot in self._downloader.slots.items() if len(slot.active) >= slot.concurrency]
        answer = self._frontier.pop(held)
        if isinstance(answer, tuple):
            slot, data = answer
            if board.holds(slot):
                board.released(slot)
            return self._decode(data)
        if answer is not None:
            soonest = min(soonest, now + answer)
        if soonest < float("inf") and len(self._frontier):
            self._extension.wake_at(soonest)
        return None

    def __len__(self) -> int:
        return len(self._frontier)

    def clear(self) -> None:
        self._frontier.clear()

    def close(self) -> None:
        """Nothing to hand back: every request not popped is still in Redis."""

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
                for data, score in batch:
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
