"""A scrapy-redis fleet on one frontier: do free hosts keep their pace beside a throttled one?

    python bench/srq.py [--pages 60] [--throttled-pages 30] [--repeat 3]
    python bench/srq.py --kill-redis [--parents 12] [--throttled-parents 6] [--outage 2] [--repeat 3]

Needs redis-server on PATH and the scrapy-redis extra (pip install -e '.[scrapy-redis]').
Three crawler processes share one scrapy-redis frontier; two free hosts
(200 ms latency) and, in the runs with it, one host at 5 requests/s that
answers 429 with Retry-After: 1. Per round, side by side: the free hosts
alone, then beside the throttled host with CooldownAwareRedisQueue, then
beside it with scrapy-redis's own PriorityQueue. "Free hosts' seconds" is
from the first to the last arrival at them. Acceptance: with the queue,
at most 1.15 x their time alone, every page fetched exactly once.

--kill-redis: the shared frontier through a Redis outage. Redis with AOF
(appendfsync always); three processes, two free hosts (1 s latency) and the
throttled one, --parents pages per free host (--throttled-parents on the
throttled one) each linking to one more page found when it is fetched. Per round, one crawl with Redis up throughout and one
where Redis is killed once a third of the pages are fetched and started
again on the same port --outage seconds later. Reported: pages fetched,
missing, fetched more than once, the crawl's seconds (first to last
arrival), requests kept in a process while Redis was down.
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

from twisted.internet import defer  # noqa: E402

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


async def outage_fleet(args: argparse.Namespace, key: str, kill: bool) -> dict[str, Any]:
    from scrapy_retryafter.testing.fleet import pause

    redis = RedisServer(Path(tempfile.mkdtemp(prefix="bench-redis-")), appendonly=True).start()
    server = ThrottlingServer()
    hosts = [server.add_host(HostConfig(rate=5, penalty=1.0, latency=0.2))]
    hosts += [server.add_host(HostConfig(latency=1.0)) for _ in range(2)]
    server.start()
    seeds = [host.url(f"/page/{i}") for i in range(args.parents) for host in hosts[1:]]
    seeds += [hosts[0].url(f"/page/{i}") for i in range(args.throttled_parents)]
    urls = seeds + [f"{url}/child/0" for url in seeds]
    settings = {
        **ADDON,
        **scrapy_redis_settings(redis.url, key),
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "RETRY_AFTER_MAX_RETRIES": 30,
        "FLEET_CHILDREN": 1,
    }
    members = [Member(name=name, urls=seeds[i::3], settings=settings) for i, name in enumerate("ABC")]
    try:
        running = defer.ensureDeferred(run_fleet(members, timeout=600))
        if kill:
            while len(server.arrivals(status=200)) < len(urls) // 3 and not running.called:
                await pause(0.05)
            redis.kill()
            await pause(args.outage)
            redis.start()
        await running
    finally:
        redis.kill()
        await server.stop()
    fetched = collections.Counter(host.url(a.path) for host in hosts for a in server.arrivals(host, status=200))
    times = [a.t for a in server.log]
    return {
        "pages": len(urls),
        "fetched": len(set(fetched) & set(urls)),
        "missing": len(set(urls) - set(fetched)),
        "duplicates": sum(1 for n in fetched.values() if n > 1),
        "seconds": max(times) - min(times),
        "kept": sum(member.stats.get("retry_after/redis/frontier_kept", 0) for member in members),
        "ok": all(member.returncode == 0 for member in members),
    }


async def kill_redis(args: argparse.Namespace) -> None:
    rounds = []
    for n in range(args.repeat):
        runs = {
            "Redis up throughout": await outage_fleet(args, f"up{n}", False),
            f"Redis killed for {args.outage:g} s": await outage_fleet(args, f"killed{n}", True),
        }
        rounds.append(runs)
        print(f"round {n + 1}: {runs}", flush=True)
    print(f"\n3 processes on one frontier, 2 free hosts x {args.parents} pages, the throttled one "
          f"{args.throttled_parents}, + 1 link each (medians of {args.repeat})")
    print("| run | pages | fetched | missing | fetched twice | seconds | kept in a process | every process exit 0 |")
    print("|---|---|---|---|---|---|---|---|")
    for label in rounds[0]:
        def median(field: str, label: str = label) -> float:
            return statistics.median(r[label][field] for r in rounds)

        ok = all(r[label]["ok"] for r in rounds)
        print(f"| {label} | {median('pages'):.0f} | {median('fetched'):.0f} | {median('missing'):.0f} | "
              f"{median('duplicates'):.0f} | {median('seconds'):.1f} | {median('kept'):.0f} | {'yes' if ok else 'NO'} |")


async def main(args: argparse.Namespace) -> None:
    if args.kill_redis:
        await kill_redis(args)
        return
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
    parser.add_argument("--kill-redis", action="store_true", help="the frontier through a Redis outage")
    parser.add_argument("--parents", type=int, default=12)
    parser.add_argument("--throttled-parents", type=int, default=6)
    parser.add_argument("--outage", type=float, default=2.0, help="seconds Redis stays down")
    arguments = parser.parse_args()

    run_on_reactor(lambda: main(arguments))
