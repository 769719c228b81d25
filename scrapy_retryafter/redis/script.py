"""The fleet board's one Lua call per exchange, and how long Redis keeps what it holds.

Kept apart from the Python that sends it: it is the wire format, read by
every process of the fleet, whatever version of the package each runs.
"""

from __future__ import annotations

__all__ = ["CHANGES_MEMORY", "CIRCUIT_MEMORY", "EXCHANGE", "MAX_RATE", "PACE_WINDOW", "PAGE"]

CIRCUIT_MEMORY = 3600
"""Seconds an expired circuit stays listed (the queue reads it; the board treats it as half-open)."""
CHANGES_MEMORY = 60
"""Seconds a change of a cooldown or circuit stays indexed; a process further behind reads them all again."""
PROBE_CLAIM = 5000
"""Milliseconds a process holds the fleet's probe of a circuit before sending it (then the circuit lists it)."""
PAGE = 1000
"""Changes read per exchange at most; more are read by the next exchange, at once."""
MAX_RATE = 10_000.0
"""Requests/s above which a rate read from Redis is not a rate."""
PACE_WINDOW = 1.0
"""Seconds a process's claimed pace for a slot holds the fleet's grants to it (it claims every refresh
while it has requests for the slot)."""
PACERS = 1000
"""Processes' paces kept per slot at most: a lease hash with more fields was not written by the fleet."""
BOOKED = 256
"""Booked send times kept per slot; past it the earliest give way to a floor the next times follow."""

# KEYS: cooldowns, circuits, rates, rates by update time, changes, news channel.
# ARGV: process, per-slot key prefix, sender window, rate age, lease horizon, changes cursor,
#       rates cursor (time), rates cursor (slot), page, how many writes, claims, asks, probes,
#       then writes (kind, slot, value, slot key), claims (slot, slot key, how many, rate),
#       asks (slot: its rate, for a slot this process meets), probes (slot, slot key: the one
#       probe of a circuit that expired), first contacts (slot, slot key, how many), then the
#       slots it sends to (slot, slot key).
EXCHANGE = """
local function num(v)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return nil end
  return n
end
local kinds = {'zset', 'zset', 'hash', 'zset', 'zset'}
for k = 1, 5 do
  local kind = redis.call('TYPE', KEYS[k])['ok']
  if kind ~= 'none' and kind ~= kinds[k] then return {'wrongtype', KEYS[k], kind} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local me, slot_prefix, window, age = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local horizon, page = tonumber(ARGV[5]), tonumber(ARGV[9])
local nwrites, nclaims, nasks, nprobes = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local nfirst = tonumber(ARGV[14])
local invalid = 0
local i = 15
local news = 0
for _ = 1, nwrites do
  local kind, slot, value, key = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local changed = 0
  if kind == 'cool' then
    changed = redis.call('ZADD', KEYS[1], 'GT', 'CH', now + tonumber(value), slot)
  elseif kind == 'open' then
    changed = redis.call('ZADD', KEYS[2], 'GT', 'CH', now + tonumber(value), slot)
  elseif kind == 'close' then
    changed = redis.call('ZREM', KEYS[2], slot)
  elseif kind == 'rate' then
    redis.call('HSET', KEYS[3], slot, value .. ' ' .. me)
    redis.call('ZADD', KEYS[4], now, slot)
    news = news + 1
  elseif kind == 'seen' then
    local contact = slot_prefix .. 'contact:' .. key
    if redis.call('TYPE', contact)['ok'] ~= 'hash' then redis.call('DEL', contact) end
    if redis.call('HSETNX', contact, 'seen', '1') == 1 then news = news + 1 end
    redis.call('HSET', contact, 'slot', slot)
    redis.call('EXPIRE', contact, 3600)
  elseif kind == 'leave' then
    if redis.call('TYPE', slot_prefix .. 'senders:' .. key)['ok'] == 'zset' then
      redis.call('ZREM', slot_prefix .. 'senders:' .. key, me)
    end
  end
  if changed > 0 then redis.call('ZADD', KEYS[5], now, slot) end
  news = news + changed
  i = i + 4
end
if news > 0 then
  redis.call('PUBLISH', KEYS[6], me)  -- the others exchange now rather than at their next refresh
end
-- Paced slots: send times one fleet interval apart (GCRA), never inside the
-- slot's cooldown, at most ``horizon`` seconds ahead, and a third of it
-- ahead at least: a time already past when its process reads it is sent late.
local leases = {}
for _ = 1, nclaims do
  local slot, key = ARGV[i], slot_prefix .. 'lease:' .. ARGV[i + 1]
  local want, rate = num(ARGV[i + 2]) or 0, ARGV[i + 3]
  if redis.call('TYPE', key)['ok'] ~= 'hash' then
    if redis.call('EXISTS', key) == 1 then invalid = invalid + 1 end
    redis.call('DEL', key)
  end
  if redis.call('HLEN', key) > PACERS + 3 then redis.call('DEL', key); invalid = invalid + 1 end
  -- The fleet's booked times, ascending: a time is granted wherever it is one fleet interval
  -- from each, so a pace that rose takes effect between the times booked at the old one
  -- (eight processes holding a time each at 1.4/s held a doubled pace back 5.7 s). A time
  -- is granted up to a day ahead (a cooldown's end), never later: none for a pace of one a year.
  local booked, told = {}, redis.call('HGET', key, 'booked')
  if told then
    for w in string.gmatch(told, '%S+') do
      local b = num(w)
      if b == nil or b > now + 86400 or #booked >= BOOKED or (#booked > 0 and b < booked[#booked]) then
        booked = {}; invalid = invalid + 1; break
      end
      booked[#booked + 1] = b
    end
  end
  local told_floor = redis.call('HGET', key, 'floor')
  local floor = num(told_floor) or 0
  if told_floor and (num(told_floor) == nil or floor > now + 86400) then floor = 0; invalid = invalid + 1 end
  local lo = math.max(now + horizon / 3, num(redis.call('ZSCORE', KEYS[1], slot)) or 0)
  -- One pace for the fleet: the slowest its senders claimed within PACE_WINDOW s. A
  -- process that grew past the others (or has not heard of a cut yet) sends no
  -- closer than they do; a cut claimed by any one paces every grant from now on.
  rate = num(rate)
  if rate ~= nil and rate > MAX_RATE then rate = MAX_RATE end
  if rate ~= nil and rate <= 0 then rate = nil end
  if rate ~= nil then
    redis.call('HSET', key, 'pace:' .. me, string.format('%.17g %.6f', rate, now))
    redis.call('EXPIRE', key, 60)
    local fields = redis.call('HGETALL', key)
    for f = 1, #fields, 2 do
      local name = fields[f]
      if name ~= 'booked' and name ~= 'floor' and name ~= 'slot' then
        local r, at = string.match(fields[f + 1], '^(%S+) (%S+)$')
        r, at = num(r), num(at)
        if string.sub(name, 1, 5) ~= 'pace:' or r == nil or at == nil or r <= 0 or r > MAX_RATE then
          redis.call('HDEL', key, name); invalid = invalid + 1
        elseif at < now - PACE_WINDOW or at > now + 1 then
          redis.call('HDEL', key, name)
        elseif r < rate then
          rate = r
        end
      end
    end
  end
  -- The first time's gap after the booked time before it, when that one placed it: the pace it
  -- was sent at. After an idle spell or a cooldown a gap says nothing.
  local granted, gap = {}, ''
  if rate ~= nil and lo <= now + 86400 then
    local space = 1 / rate
    local slack = math.min(0.00001, space / 100)  -- times are told to the microsecond
    local t, at = lo, 1
    if floor > 0 then t = math.max(lo, floor + space) end
    for n = 1, want do
      local pushed = false
      while at <= #booked and booked[at] < t + space - slack do
        if booked[at] > t - space + slack then t = booked[at] + space; pushed = true end
        at = at + 1
      end
      if (n > 1 and t > now + horizon) or t > now + 86400 then break end
      if n == 1 and pushed then gap = string.format('%.6f', t - booked[at - 1]) end
      table.insert(booked, at, t)
      at = at + 1
      granted[#granted + 1] = string.format('%.6f', t - now)
      t = t + space
    end
    local keep, out = {}, #booked - BOOKED
    for k, b in ipairs(booked) do
      if k <= out then floor = math.max(floor, b)
      elseif b >= math.min(now - 1, lo - space) then keep[#keep + 1] = string.format('%.6f', b) end
    end
    redis.call('HSET', key, 'booked', table.concat(keep, ' '), 'floor', string.format('%.6f', floor), 'slot', slot)
    redis.call('EXPIRE', key, 60)
  end
  leases[#leases + 1] = slot
  leases[#leases + 1] = table.concat(granted, ' ')
  leases[#leases + 1] = rate and string.format('%.17g', rate) or ''
  leases[#leases + 1] = gap
  i = i + 4
end
local asked = {}
for _ = 1, nasks do
  local value = redis.call('HGET', KEYS[3], ARGV[i])
  local at = redis.call('ZSCORE', KEYS[4], ARGV[i])
  if value and at and tonumber(at) > now - age then
    asked[#asked + 1] = ARGV[i]
    asked[#asked + 1] = value
    asked[#asked + 1] = at
  end
  i = i + 1
end
-- One probe for the fleet: to the first process to ask once the circuit expired, for
-- PROBE_CLAIM ms (it publishes the probe's hold as an open circuit when it sends it).
local probes = {}
for _ = 1, nprobes do
  local slot, key = ARGV[i], slot_prefix .. 'probe:' .. ARGV[i + 1]
  if (num(redis.call('ZSCORE', KEYS[2], slot)) or 0) <= now then
    if redis.call('SET', key, me, 'NX', 'PX', PROBE_CLAIM) or redis.pcall('GET', key) == me then
      probes[#probes + 1] = slot
    end
  end
  i = i + 2
end
-- First contact: until one process had a response from the host, the fleet sends it at most
-- ``limit`` requests; -1 once it has.
local first = {}
for _ = 1, nfirst do
  local slot, key, limit = ARGV[i], slot_prefix .. 'contact:' .. ARGV[i + 1], tonumber(ARGV[i + 2])
  if redis.call('TYPE', key)['ok'] ~= 'hash' then
    if redis.call('EXISTS', key) == 1 then invalid = invalid + 1 end
    redis.call('DEL', key)
  end
  local n = -1
  if not redis.call('HGET', key, 'seen') then
    local used = math.max(0, num(redis.call('HGET', key, 'first')) or 0)
    n = math.max(0, limit - used)
    redis.call('HSET', key, 'first', tostring(used + n), 'slot', slot)
    redis.call('EXPIRE', key, 3600)
  end
  first[#first + 1] = slot
  first[#first + 1] = tostring(n)
  i = i + 3
end
local counts = {}
for j = i, #ARGV, 2 do
  local key = slot_prefix .. 'senders:' .. ARGV[j + 1]
  if redis.call('TYPE', key)['ok'] ~= 'zset' then
    if redis.call('EXISTS', key) == 1 then invalid = invalid + 1 end
    redis.call('DEL', key)
  end
  redis.call('ZADD', key, now, me)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  redis.call('EXPIRE', key, 60)
  counts[#counts + 1] = ARGV[j]
  counts[#counts + 1] = tostring(redis.call('ZCARD', key))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - CIRCUIT_MEMORY)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - CHANGES_MEMORY)
for _, slot in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - age, 'LIMIT', 0, page)) do
  redis.call('HDEL', KEYS[3], slot)
  redis.call('ZREM', KEYS[4], slot)
end
-- What changed since the cursor, from the changes index; with no cursor (a
-- start, a return after an outage), every live cooldown and open circuit.
local changed, cooling, circuits = {}, {}, {}
local since = num(ARGV[6])
local snapshot = since == nil or since < now - CHANGES_MEMORY / 2
if snapshot then
  cooling = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', 'WITHSCORES')
  circuits = redis.call('ZRANGEBYSCORE', KEYS[2], now, '+inf', 'WITHSCORES')
else
  for _, slot in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. ARGV[6], now)) do
    changed[#changed + 1] = slot
    changed[#changed + 1] = tostring(redis.call('ZSCORE', KEYS[1], slot) or '')
    changed[#changed + 1] = tostring(redis.call('ZSCORE', KEYS[2], slot) or '')
  end
end
-- Rates updated after the cursor (time, then slot for updates of one instant), a page at most.
-- A process starts at now: the rates of the slots it meets come with its asks.
local rates = {}
local rate_since = num(ARGV[7]) or now
rate_since = math.max(rate_since, now - age)
local rate_slot = ARGV[8]
local offset, more = 0, 0
while #rates < 3 * page do
  local batch = redis.call('ZRANGEBYSCORE', KEYS[4], rate_since, '+inf', 'WITHSCORES', 'LIMIT', offset, page)
  if #batch == 0 then break end
  for k = 1, #batch, 2 do
    local slot, at = batch[k], tonumber(batch[k + 1])
    if at > rate_since or slot > rate_slot then
      if #rates >= 3 * page then more = 1; break end
      rates[#rates + 1] = slot
      rates[#rates + 1] = redis.call('HGET', KEYS[3], slot) or ''
      rates[#rates + 1] = batch[k + 1]
    end
  end
  offset = offset + page
  if #batch < 2 * page then break end
end
if #rates >= 3 * page then more = 1 end
return {changed, rates, counts, leases, string.format('%.6f', now), snapshot and 1 or 0, more, invalid, asked,
        cooling, circuits, string.format('%.17g', rate_since), rate_since == num(ARGV[7]) and rate_slot or '',
        probes, first}
""".replace("CIRCUIT_MEMORY", str(CIRCUIT_MEMORY)).replace("PACE_WINDOW", repr(PACE_WINDOW)).replace(
    "PACERS", str(PACERS)).replace("MAX_RATE", repr(MAX_RATE)).replace("CHANGES_MEMORY", str(CHANGES_MEMORY)).replace(
    "PROBE_CLAIM", str(PROBE_CLAIM)).replace("BOOKED", str(BOOKED))
