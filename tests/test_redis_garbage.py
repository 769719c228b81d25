"""What other programs, older runs and other spiders leave in Redis: bounded, counted, never a crash."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.policy import SlotPolicy
from scrapy_retryafter.redis.board import RedisBoard
from scrapy_retryafter.redis.exchange import Job, RedisExchange, slot_key
from scrapy_retryafter.redisconfig import RedisConfig

from .conftest import ADDON, crawl
from .redis_fixtures import own_redis, prefix, redis_server, require_redis  # noqa: F401

SLOT = "shop.example"


def board(url: str, prefix: str, memory_age: float = 604800.0, **policy) -> RedisBoard:
    config = RedisConfig(url=url, params={}, prefix=prefix, memory_age=memory_age)
    local = SlotPolicy(**policy)
    made = RedisBoard(config, policy=lambda slot: local)
    made.invalid = []  # type: ignore[attr-defined]
    made.on_invalid = made.invalid.append  # type: ignore[attr-defined]
    made.connect()
    made.start()
    return made


def plant_rate(client, prefix: str, slot: str, value: str, at: float | None = None) -> None:
    """A rate as another process (or another program) left it."""
    client.hset(f"{prefix}:rate", slot, value)
    seconds, micros = client.time()
    client.zadd(f"{prefix}:rate:at", {slot: at if at is not None else seconds + micros / 1e6})


@pytest.mark.parametrize("value", ["0:cut other", "0:grow other", "garbage:cut other", "nan:cut other",
                                   "inf:grow other",
                                   "-3:cut other", "1e400:cut other", "0.5 other 1700000000.0", "", "5:cut"])
def test_a_garbage_rate_is_ignored_and_counted(redis_server, prefix, value):
    client = redis_server.client()
    plant_rate(client, prefix, SLOT, value)
    plant_rate(client, prefix, "good.example", "4.0:cut other")
    b = board(redis_server.url, prefix)
    try:
        assert SLOT not in b and "good.example" not in b
        assert b.sync() and b.sync()
        assert b.rate(SLOT) is None
        assert b.rate("good.example") == pytest.approx(4.0)
        assert sum(b.invalid) >= (1 if value else 0)
        b.throttled(SLOT, b.clock())  # and this process's own rate goes on as usual
        assert b.sync()
    finally:
        b.stop()


def test_a_rate_older_than_the_memory_age_is_not_adopted_and_is_removed(redis_server, prefix):
    client = redis_server.client()
    now = float(client.time()[0])
    plant_rate(client, prefix, SLOT, "3.5:cut other", at=now - 3 * 86400)
    plant_rate(client, prefix, "fresh.example", "3.5:cut other", at=now - 60)
    b = board(redis_server.url, prefix, memory_age=86400)
    try:
        assert SLOT not in b and "fresh.example" not in b
        assert b.sync() and b.sync()
        assert b.rate(SLOT) is None
        assert b.rate("fresh.example") == pytest.approx(3.5)
        assert client.hexists(f"{prefix}:rate", SLOT) == 0
        assert client.zscore(f"{prefix}:rate:at", SLOT) is None
    finally:
        b.stop()


def test_rates_are_read_incrementally_and_in_pages(redis_server, prefix):
    client = redis_server.client()
    config = RedisConfig(url=redis_server.url, params={}, prefix=prefix)
    plant_rate(client, prefix, "before.example", "2.0:cut other")
    exchange = RedisExchange(config, "me")
    exchange.start()
    try:
        exchange.send(Job({}))
        exchange.wait(time.monotonic() + 5)
        (answer,) = exchange.take()
        assert answer.reply.rates == []  # a process starts at now: the slots it meets are asked about
        seconds, micros = client.time()
        now = seconds + micros / 1e6
        pipe = client.pipeline()
        for n in range(2500):
            pipe.hset(f"{prefix}:rate", f"h{n}", "2.0:cut other")
            pipe.zadd(f"{prefix}:rate:at", {f"h{n}": now + n / 1e6})
        pipe.execute()
        pages = []
        for _ in range(4):
            exchange.send(Job({}))
            exchange.wait(time.monotonic() + 5)
            (answer,) = exchange.take()
            assert answer.error is None, answer.error
            pages.append((len(answer.reply.rates), answer.reply.more))
        assert pages == [(1000, True), (1000, True), (500, False), (0, False)]
        plant_rate(client, prefix, "h7", "3.0:grow other")
        exchange.send(Job({}))
        exchange.wait(time.monotonic() + 5)
        (answer,) = exchange.take()
        assert [(slot, rate) for slot, rate, *_ in answer.reply.rates] == [("h7", 3.0)]
    finally:
        exchange.stop()


def test_a_cooldown_of_a_day_from_another_spider_is_a_refusal_under_the_local_cap(redis_server, prefix):
    client = redis_server.client()
    client.zadd(f"{prefix}:cooldown", {SLOT: float(client.time()[0]) + 100_000})
    client.zadd(f"{prefix}:cooldown", {"endless.example": float("inf")})
    b = board(redis_server.url, prefix, max_delay=300.0)
    refused = []
    b.on_remote_refusal = lambda slot, seconds: refused.append(slot)
    try:
        assert b.sync()
        assert SLOT in b  # met: refused
        assert b.remaining(SLOT) == 0.0 and b.ready_at(SLOT) == 0.0
        assert b.refused(SLOT) > 99_000
        assert refused == [SLOT]
        assert "endless.example" not in b and b.remaining("endless.example") == 0.0
        assert sum(b.invalid) == 1  # the infinite score
    finally:
        b.stop()


def test_a_key_of_the_wrong_type_stops_sharing_with_an_error_naming_it_never_the_crawl(redis_server, prefix):
    client = redis_server.client()
    client.set(f"{prefix}:cooldown", "not a sorted set")
    b = board(redis_server.url, prefix)
    lost: list[BaseException] = []
    b.on_lost = lost.append
    try:
        assert not b.sync()
        assert b.lost and len(lost) == 1
        assert f"{prefix}:cooldown holds a string" in str(lost[0])
        b.cool(SLOT, 5.0)  # the local board goes on
        assert b.remaining(SLOT) > 4
        client.delete(f"{prefix}:cooldown")
        deadline = time.monotonic() + 10
        while b.lost and time.monotonic() < deadline:
            b.tick()
            time.sleep(0.05)
        assert not b.lost
        assert client.zscore(f"{prefix}:cooldown", SLOT) is not None  # re-published
    finally:
        b.stop()


def test_per_slot_keys_of_the_wrong_type_or_value_are_replaced_and_counted(redis_server, prefix):
    client = redis_server.client()
    client.set(f"{prefix}:slot:lease:{slot_key(SLOT)}", "garbage")
    client.rpush(f"{prefix}:slot:senders:{slot_key(SLOT)}", "garbage")
    client.hset(f"{prefix}:slot:lease:{slot_key('late.example')}", "booked", "1e300")
    b = board(redis_server.url, prefix)
    try:
        for slot in (SLOT, "late.example"):
            b.throttled(slot, b.clock())
            b.released(slot)
            b.ready_at(slot, 5)
        assert b.sync() and b.sync()
        assert sum(b.invalid) == 3
        for slot in (SLOT, "late.example"):
            assert b.ready_at(slot) < b.clock() + 2  # a grant came, not one a day away
        assert client.type(f"{prefix}:slot:senders:{slot_key(SLOT)}") == "zset"
    finally:
        b.stop()


def claimed_once(redis_server: Any, prefix: str, rate: float) -> tuple[RedisBoard, int]:
    """A board paced at ``rate`` that claimed send times twice; (the board, garbage counted). Stop it."""
    b = board(redis_server.url, prefix)
    b.throttled(SLOT, b.clock())
    b._slots[SLOT].pace.rate = rate
    b.released(SLOT)
    b.ready_at(SLOT, 5)
    assert b.sync() and b.sync()
    return b, sum(b.invalid)


@pytest.mark.parametrize("field, value", [
    ("pace:other", "nan 5"), ("pace:other", "inf 1"), ("pace:other", "-3 1"), ("pace:other", "0 1"),
    ("pace:other", "1e400 1"), ("pace:other", "garbage"), ("pace:other", ""), ("pace:other", "0.5"),
    ("pace:other", "0.5 nan"), ("stranger", "0.5 1"),
])
def test_a_garbage_pace_in_a_lease_is_dropped_counted_and_never_slows_the_fleet(redis_server, prefix, field, value):
    key = f"{prefix}:slot:lease:{slot_key(SLOT)}"
    client = redis_server.client()
    client.hset(key, field, value)
    b, invalid = claimed_once(redis_server, prefix, 20.0)
    try:
        assert invalid == 1
        assert b.leases.pace(SLOT) == pytest.approx(20.0)
        assert field not in client.hgetall(key)
    finally:
        b.stop()


def test_a_pace_of_a_few_requests_a_year_is_a_pace_not_garbage(redis_server, prefix):
    b, invalid = claimed_once(redis_server, prefix, 1e-7)
    try:
        assert invalid == 0
        assert b.leases.pace(SLOT) == pytest.approx(1e-7)
    finally:
        b.stop()


def test_a_lease_with_more_paces_than_a_fleet_has_senders_is_replaced(redis_server, prefix):
    key = f"{prefix}:slot:lease:{slot_key(SLOT)}"
    client = redis_server.client()
    seconds, _ = client.time()
    client.hset(key, mapping={f"pace:p{n}": f"0.01 {seconds}" for n in range(5000)})
    b = board(redis_server.url, prefix)
    try:
        b.throttled(SLOT, b.clock())
        b._slots[SLOT].pace.rate = 20.0
        b.released(SLOT)
        b.ready_at(SLOT, 5)
        assert b.sync() and b.sync()
        assert sum(b.invalid) == 1
        assert b.leases.pace(SLOT) == pytest.approx(20.0)  # not one request a hundred seconds
        assert client.hlen(key) <= 4  # next, last, slot and this process's pace
    finally:
        b.stop()


@pytest.mark.parametrize("value", ["0:grow other", "0:cut other", "garbage:cut other"])
@pytest_twisted.ensureDeferred
async def test_a_crawl_over_a_garbage_rate_fetches_everything(server, redis_server, prefix, tmp_path, value):
    host = server.add_host()
    server.start()
    plant_rate(redis_server.client(), prefix, host.address, value)
    settings = {**ADDON, "RETRY_AFTER_REDIS_URL": redis_server.url, "RETRY_AFTER_REDIS_PREFIX": prefix,
                "RETRY_AFTER_PARK_FILE": str(tmp_path / "parked.jsonl")}
    urls = [host.url(f"/{n}") for n in range(10)]
    crawler = await crawl([Request(url) for url in urls], settings)
    assert sorted(url for url, _ in crawler.spider.seen) == sorted(urls)
    assert crawler.spider.failures == []
    assert crawler.stats.get_value("retry_after/redis/invalid") >= 1
    assert crawler.stats.get_value("finish_reason") == "finished"


@pytest_twisted.ensureDeferred
async def test_a_crawl_under_a_cooldown_of_a_day_from_another_spider_parks_instead_of_sleeping(
    server, redis_server, prefix, tmp_path
):
    host = server.add_host()
    server.start()
    client = redis_server.client()
    client.zadd(f"{prefix}:cooldown", {host.address: float(client.time()[0]) + 100_000})
    park_file = tmp_path / "parked.jsonl"
    settings = {**ADDON, "RETRY_AFTER_REDIS_URL": redis_server.url, "RETRY_AFTER_REDIS_PREFIX": prefix,
                "RETRY_AFTER_PARK_FILE": str(park_file)}
    started = time.monotonic()
    crawler = await crawl([Request(host.url(f"/{n}")) for n in range(5)], settings)
    assert time.monotonic() - started < 30
    assert server.arrivals(host) == []
    records = [json.loads(line) for line in Path(park_file).read_text().splitlines()]
    assert len(records) == 5  # nothing lost: every request is parked until the fleet's time
    assert crawler.stats.get_value("retry_after/redis/remote_over_cap") == 1


@pytest.mark.parametrize(("field", "value"), [
    *(("booked", value) for value in ("nan", "inf", "garbage", "1e300", "1 x 2", "x" * 10_000)),
    ("booked", "3 2 1"),  # not in order
    ("booked", " ".join(["1"] * 257)),  # more than the fleet books
    *(("floor", value) for value in ("nan", "inf", "garbage", "1e300", "x" * 10_000)),
])
def test_garbage_booked_times_in_a_lease_are_counted_and_replaced(redis_server, prefix, field, value):
    key = f"{prefix}:slot:lease:{slot_key(SLOT)}"
    redis_server.client().hset(key, field, value)
    b, invalid = claimed_once(redis_server, prefix, 20.0)
    try:
        assert invalid == 1
        (granted,) = b.leases.times(SLOT)[:1]
        assert granted < b.clock() + 2  # a grant came, not one a day away
        lease = redis_server.client().hgetall(key)
        for told in (lease["booked"].split(), [lease["floor"]]):
            assert all(math.isfinite(float(time_)) for time_ in told)  # what the fleet granted, not the garbage
    finally:
        b.stop()


def test_a_time_booked_at_a_long_cooldown_s_end_is_no_garbage(redis_server, prefix):
    """A cooldown of two hours books its end two hours ahead: a bound of an hour counted it as garbage."""
    client = redis_server.client()
    seconds, micros = client.time()
    client.hset(f"{prefix}:slot:lease:{slot_key(SLOT)}", "booked", f"{seconds + micros / 1e6 + 7200:.6f}")
    b, invalid = claimed_once(redis_server, prefix, 20.0)
    try:
        assert invalid == 0
        assert b.leases.times(SLOT)
    finally:
        b.stop()


def test_no_time_is_booked_more_than_a_day_ahead(redis_server, prefix):
    """A time pushed past a day by the booked ones was dropped by the reader but stayed booked: each
    claim booked one more, and once past the garbage bound the whole list was wiped."""
    client = redis_server.client()
    key = f"{prefix}:slot:lease:{slot_key(SLOT)}"
    seconds, micros = client.time()
    last = seconds + micros / 1e6 + 86400 - 0.01
    client.hset(key, "floor", f"{last:.6f}")  # the fleet's times run to a day ahead
    b, invalid = claimed_once(redis_server, prefix, 20.0)
    try:
        assert invalid == 0
        assert b.leases.times(SLOT) == []
        assert client.hget(key, "booked") == ""
    finally:
        b.stop()


def test_a_time_after_an_idle_spell_tells_no_gap(redis_server, prefix):
    """A gap that counts an idle spell or a cooldown is no pace: 1/30 s would have cut slow start to the floor."""
    a = board(redis_server.url, prefix)
    try:
        a.throttled(SLOT, sent_at=a.clock())
        a._slots[SLOT].pace.rate = 20.0
        a.ready_at(SLOT, held=1)
        assert a.sync()
        first = a.leases.times(SLOT)[0]
        a.leases.used(SLOT, first)
        time.sleep(1.0)  # the fleet's schedule runs free
        a.ready_at(SLOT, held=1)
        assert a.sync()
        later = a.leases.times(SLOT)[0]
        a.leases.used(SLOT, later)
        refused, _ = a.leases.spaced(SLOT, later)
        assert refused == pytest.approx(20.0)  # the claim's pace, not 1 / (a second)
    finally:
        a.stop()
