"""One fleet-board exchange against a large Redis: what other spiders and older runs left behind.

    python bench/redis_scale.py [--rates 100000] [--circuits 100000] [--cooling 10000] [--exchanges 300]

Needs redis-server on PATH and the redis package. Fills a fresh Redis with
``--rates`` published rates, ``--circuits`` circuits that expired within the
last hour and ``--cooling`` hosts cooling down, lets one process catch up
(its first exchanges read every live cooldown and circuit, and the rates a
page at a time), then times steady exchanges while another process keeps
publishing a few changes between them: a cooldown, a circuit, a rate. The
same exchanges on an empty Redis, in the same run, are the baseline.
Acceptance: the median exchange on the large Redis <= 5 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapy_retryafter.redis.exchange import Job, RedisExchange
from scrapy_retryafter.redisconfig import RedisConfig
from scrapy_retryafter.testing.redis_server import RedisServer


def fill(client: Any, prefix: str, rates: int, circuits: int, cooling: int) -> None:
    now = float(client.time()[0])
    pipe = client.pipeline(transaction=False)
    for n in range(rates):
        pipe.hset(f"{prefix}:rate", f"rate{n}.example", f"{random.uniform(0.5, 50):.3f}:cut old{n % 50}")
        pipe.zadd(f"{prefix}:rate:at", {f"rate{n}.example": now - random.uniform(0, 6 * 86400)})
        if n % 5000 == 4999:
            pipe.execute()
    for n in range(circuits):
        pipe.zadd(f"{prefix}:circuit", {f"circuit{n}.example": now - random.uniform(1, 3500)})
        if n % 5000 == 4999:
            pipe.execute()
    for n in range(cooling):
        pipe.zadd(f"{prefix}:cooldown", {f"cooling{n}.example": now + random.uniform(60, 3000)})
    pipe.execute()


def one(exchange: RedisExchange, job: Job) -> tuple[float, Any]:
    started = time.perf_counter()
    exchange.send(job)
    exchange.wait(time.monotonic() + 5)
    (answer,) = exchange.take()
    took = time.perf_counter() - started
    if answer.error is not None:
        raise answer.error
    return took, answer.reply


def typical_job(n: int) -> Job:
    """What a crawling process sends: one event, a claim for a paced slot, its heartbeats."""
    slot = f"mine{n % 20}.example"
    writes = {("cool", slot): "2.5"} if n % 10 == 0 else {}
    return Job(writes, claims=[("paced.example", 2, 10.0)], active=[f"mine{k}.example" for k in range(8)])


def run(url: str, prefix: str, exchanges: int, news: Any) -> dict[str, Any]:
    config = RedisConfig(url=url, params={}, prefix=prefix)
    exchange = RedisExchange(config, f"bench-{prefix}")
    exchange.start()
    try:
        catch_up, first = 0, None
        while True:
            took, reply = one(exchange, Job({}))
            first = took if first is None else first
            catch_up += 1
            if not reply.more:
                break
        times = []
        for n in range(exchanges):
            news(n)
            took, _ = one(exchange, typical_job(n))
            times.append(took)
    finally:
        exchange.stop()
    times.sort()
    return {"first": first, "catch_up": catch_up, "median": statistics.median(times),
            "p95": times[int(0.95 * len(times)) - 1], "max": times[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, default=100_000)
    parser.add_argument("--circuits", type=int, default=100_000)
    parser.add_argument("--cooling", type=int, default=10_000)
    parser.add_argument("--exchanges", type=int, default=300)
    args = parser.parse_args()
    server = RedisServer(Path(tempfile.mkdtemp(prefix="bench-redis-"))).start()
    try:
        client = server.client()
        started = time.perf_counter()
        fill(client, "large", args.rates, args.circuits, args.cooling)
        print(f"filled in {time.perf_counter() - started:.1f}s: {client.dbsize()} keys, "
              f"{client.info('memory')['used_memory_human']}", flush=True)

        def news_for(prefix: str) -> Any:
            def news(n: int) -> None:  # another process of the fleet publishes as it crawls
                now = float(client.time()[0])
                client.zadd(f"{prefix}:cooldown", {f"other{n % 30}.example": now + 3}, gt=True)
                client.zadd(f"{prefix}:changed", {f"other{n % 30}.example": now})
                client.hset(f"{prefix}:rate", f"other{n % 7}.example", f"{5 + n % 3}.0:grow other")
                client.zadd(f"{prefix}:rate:at", {f"other{n % 7}.example": now})
            return news

        results = {
            "empty Redis": run(server.url, "empty", args.exchanges, news_for("empty")),
            "large Redis": run(server.url, "large", args.exchanges, news_for("large")),
        }
    finally:
        server.kill()
    print(f"\n{args.rates:,} rates, {args.circuits:,} circuits expired within the hour, "
          f"{args.cooling:,} cooling hosts; {args.exchanges} steady exchanges each")
    print("| Redis | first exchange | exchanges to catch up | median | p95 | max |")
    print("|---|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['first'] * 1000:.1f} ms | {r['catch_up']} | {r['median'] * 1000:.2f} ms "
              f"| {r['p95'] * 1000:.2f} ms | {r['max'] * 1000:.2f} ms |")
    ratio = results["large Redis"]["median"] / results["empty Redis"]["median"]
    print(f"\nmedian exchange, large / empty Redis: {ratio:.2f}; "
          f"large: {results['large Redis']['median'] * 1000:.2f} ms (target <= 5 ms)")


if __name__ == "__main__":
    main()
