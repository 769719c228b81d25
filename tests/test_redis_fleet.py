"""Real crawler processes sharing one Redis board, against the throttling server."""

from __future__ import annotations

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.utils.defer import deferred_from_coro

from scrapy_retryafter.redis_board import RedisBoardUnavailable
from scrapy_retryafter.testing.fleet import Member, run_fleet, sends_inside_cooldowns
from scrapy_retryafter.testing.server import HostConfig
from scrapy_retryafter.timers import sleep

from .conftest import ADDON, crawl
from .redis_fixtures import free_port, own_redis, prefix, redis_server, require_redis  # noqa: F401

LIMITED = HostConfig(rate=10, penalty=2.0)
"""10 requests/s, Retry-After: 2 on a throttle."""


def split(host, pages: int, members: int = 2) -> list[list[str]]:
    urls = [host.url(f"/page/{i}") for i in range(pages)]
    return [urls[i::members] for i in range(members)]


def fleet(shares: list[list[str]], settings: dict) -> list[Member]:
    return [Member(name=chr(ord("A") + i), urls=urls, settings={**ADDON, **settings}) for i, urls in enumerate(shares)]


def fetched_everything(members: list[Member]) -> None:
    for member in members:
        assert member.returncode == 0, member.log[-3000:]
        assert sorted(member.fetched) == sorted(member.urls), member.log[-3000:]
        assert member.failed == []


@pytest_twisted.ensureDeferred
async def test_two_processes_on_one_board_take_far_fewer_429s_and_hold_together(server, redis_server, prefix):
    alone_host = server.add_host(HostConfig(**vars(LIMITED)))
    shared_host = server.add_host(HostConfig(**vars(LIMITED)))
    server.start()
    alone = await run_fleet(fleet(split(alone_host, 80), {}))
    shared = await run_fleet(
        fleet(split(shared_host, 80), {"RETRY_AFTER_REDIS_URL": redis_server.url, "RETRY_AFTER_REDIS_PREFIX": prefix})
    )
    fetched_everything(alone)
    fetched_everything(shared)
    alone_429 = len(server.arrivals(alone_host, status=429))
    shared_429 = len(server.arrivals(shared_host, status=429))
    assert shared_429 <= alone_429 / 2, (shared_429, alone_429)
    inside = sends_inside_cooldowns(server.arrivals(shared_host))
    assert inside == [], [(t.headers["user-agent"], t.t, a.headers["user-agent"], a.t - t.t, a.status) for t, a in inside]
    assert any(member.stats.get("retry_after/redis/remote_cooldowns") for member in shared)
    assert all("Sharing cooldowns through the Redis board" in member.log for member in shared)
