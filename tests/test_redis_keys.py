"""Slot names in Redis keys: no name, however written, spells another slot's key."""

from __future__ import annotations

import pytest

from scrapy_retryafter.redis.board import RedisBoard
from scrapy_retryafter.redis.exchange import slot_key
from scrapy_retryafter.redisconfig import RedisConfig

from .redis_fixtures import prefix, redis_server  # noqa: F401

NAMES = [
    "x", "x:next", "x:next:next", "x:active", "{x}", "{x}:next", "a b", " spaced ", "tab\there",
    "ünïcödé.example", "例え.テスト", "emoji-🦀", "h" * 10240, "h" * 10240 + ":next",
]


def board(url: str, prefix: str) -> RedisBoard:
    made = RedisBoard(RedisConfig(url=url, params={}, prefix=prefix))
    made.invalid = []  # type: ignore[attr-defined]
    made.on_invalid = made.invalid.append  # type: ignore[attr-defined]
    made.connect()
    made.start()
    return made


def test_every_slot_keeps_its_own_cooldown_rate_senders_and_send_times(redis_server, prefix):
    a, b = board(redis_server.url, prefix), board(redis_server.url, prefix)
    lost: list[BaseException] = []
    a.on_lost = b.on_lost = lost.append
    try:
        for n, name in enumerate(NAMES):
            assert name not in a
            a.throttled(name, a.clock())
            a.cool(name, 5.0 + n * 0.25)
            a.released(name)
            a.ready_at(name, 3)
        assert a.sync() and a.sync()
        for name in NAMES:
            assert name not in b  # met: b asks for its rate
        assert b.sync() and b.sync()
        for n, name in enumerate(NAMES):
            assert b.remaining(name) == pytest.approx(5.0 + n * 0.25, abs=0.3), name[:20]
            assert b.rate(name) == pytest.approx(a.rate(name)), name[:20]
        assert lost == [] and a.invalid == [] and b.invalid == []
        client = redis_server.client()
        leases = [key for key in client.scan_iter(f"{prefix}:slot:lease:*")]
        senders = [key for key in client.scan_iter(f"{prefix}:slot:senders:*")]
        assert len(leases) == len(senders) == len(NAMES)
        assert {client.hget(key, "slot") for key in leases} == set(NAMES)  # the readable name, in a value
        assert all(client.type(key) == "hash" for key in leases) and all(client.type(key) == "zset" for key in senders)
    finally:
        a.stop()
        b.stop()


def test_slot_keys_are_fixed_length_digests_without_braces():
    keys = {slot_key(name) for name in NAMES}
    assert len(keys) == len(NAMES)
    assert all(len(key) == 40 and key.isalnum() for key in keys)
    assert slot_key("\udcff") != slot_key("?")  # undecodable bytes still get a key of their own


def test_a_slot_name_with_a_lone_surrogate_does_not_stop_the_fleet_sharing(redis_server, prefix):
    """download_slot meta (or a park file) can name a slot no strict UTF-8 encodes: it was sent as
    str, every exchange failed, and the board stayed lost for the rest of the crawl."""
    a, b = board(redis_server.url, prefix), board(redis_server.url, prefix)
    lost: list[BaseException] = []
    a.on_lost = b.on_lost = lost.append
    odd = "h\udcff"
    try:
        a.throttled(odd, a.clock())
        a.cool(odd, 5.0)
        assert a.sync()
        a.throttled("good.test", a.clock())
        a.cool("good.test", 6.0)
        assert a.sync() and a.sync()
        assert odd not in b and "good.test" not in b
        assert b.sync() and b.sync()
        assert b.remaining("good.test") == pytest.approx(6.0, abs=0.3)
        assert b.remaining(odd) == pytest.approx(5.0, abs=0.3)
        assert lost == []
    finally:
        a.stop()
        b.stop()
