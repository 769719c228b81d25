"""A scrapy-redis fleet on one frontier: do free hosts keep their pace beside a throttled one?

    python bench/srq.py [--pages 60] [--throttled-pages 30] [--repeat 3]

Needs redis-server on PATH and the scrapy-redis extra (pip install -e '.[scrapy-redis]').
Three crawler processes share one scrapy-redis frontier; two free hosts
(200 ms latency) and, in the runs with it, one host at 5 requests/s that
answers 429 with Retry-After: 1. Per round, side by side: the free hosts
alone, then beside the throttled host with CooldownAwareRedisQueue, then
beside it with scrapy-redis's own PriorityQueue. "Free hosts' seconds" is
from the first to the last arrival at them. Acceptance: with the queue,
at most 1.15 x their time alone, every page fetched exactly once.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import asyncioreactor

asyncioreactor.install()


from scrapy_retryafter.testing.fleet import Member, run_fleet, run_on_reactor, scrapy_redis_settings  # noqa: E402
from scrapy_retryafter.testing.redis_server import RedisServer  # noqa: E402
from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

ADDON = {"ADDONS": {"scrapy_retryafter.Addon": 500}}
QUEUES = {"cooldown-aware": None, "scrapy-redis PriorityQueue": "scrapy_redis.queue.PriorityQueue"}


async def one_fleet(args: argparse.Namespace, redis_url: str, key: str, throttled: bool, queue: str | None) -> dict[str, Any]:
    server = ThrottlingServer()
    free = [server.add_host(HostConfig(latency=0.2)) for _ in range(2)]
    limited = server.add_host(HostConfig(rate=5, penalty=1.0))
    server.start()
    urls = [host.url(f"/page/{i}") for i in range(args.pages) for host in free]
    if throttled:
        urls += [limited.url(f"/page/{i}") for i in range(args.throttled_pages)]
    settings = {
        **ADDON,
        **scrapy_redis_settings(redis_url, key),
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        **({"SCHEDULER_QUEUE_CLASS": queue} if queue else {}),
    }
    members = [Member(name=name, urls=urls[i::3], settings=settings) for i, name in enumerate("ABC")]
    await run_fleet(members, timeout=600)
    await server.stop()
    fetched = collections.Counter(url for member in members for url in member.fetched)
    arrivals = [a.t for host in free for a in server.arrivals(host)]
    return {
        "exactly_once": sorted(fetched) == sorted(urls) and set(fetched.values()) == {1},
        "free_seconds": max(arrivals) - min(arrivals),
        "429s": len(server.arrivals(limited, status=429)),
        "ok": all(member.returncode == 0 for member in members),
    }


async def main(args: argparse.Namespace) -> None:
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="bench-redis-"))).start()
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        for n in range(args.repeat):
            runs = {"free hosts alone": await one_fleet(args, redis.url, f"srq{n}-alone", False, None)}
            for label, queue in QUEUES.items():
                runs[f"beside throttled, {label}"] = await one_fleet(args, redis.url, f"srq{n}-{label[:5]}", True, queue)
            rounds.append(runs)
            print(f"round {n + 1}: {runs}", flush=True)
    finally:
        redis.kill()
    print(f"\n3 processes, 2 free hosts x {args.pages} pages, throttled host {args.throttled_pages} pages "
          f"(medians of {args.repeat})")
    print("| run | every page exactly once | free hosts' seconds | ÷ alone |")
    print("|---|---|---|---|")
    for label in rounds[0]:
        seconds = statistics.median(r[label]["free_seconds"] for r in rounds)
        ratio = statistics.median(r[label]["free_seconds"] / r["free hosts alone"]["free_seconds"] for r in rounds)
        once = all(r[label]["exactly_once"] and r[label]["ok"] for r in rounds)
        print(f"| {label} | {'yes' if once else 'NO'} | {seconds:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--throttled-pages", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()

    run_on_reactor(lambda: main(arguments))
