"""A fleet of crawler processes against one throttled host: shared Redis board vs one board each.

    python bench/fleet.py [--pages 300] [--processes 2] [--repeat 1]

Needs redis-server on PATH and the redis package (pip install -e '.[redis]').
The throttling server runs in this process (10 requests/s token bucket,
Retry-After: 2 with a 2 s penalty) and logs every arrival with the
User-Agent naming the crawler process that sent it. Each round runs the
fleet with independent boards, then with the Redis board, side by side, and
prints the 429s of each, their ratio, and how many requests one process sent
to the host from 250 ms after another process was told 429 until that
cooldown ended (acceptance: 0).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import asyncioreactor

asyncioreactor.install()


from scrapy_retryafter.testing.fleet import Member, run_fleet, run_on_reactor, sends_inside_cooldowns  # noqa: E402
from scrapy_retryafter.testing.redis_server import RedisServer  # noqa: E402
from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

ADDON = {"ADDONS": {"scrapy_retryafter.Addon": 500}}


async def one_fleet(pages: int, processes: int, settings: dict[str, Any]) -> dict[str, Any]:
    server = ThrottlingServer()
    host = server.add_host(HostConfig(rate=10, penalty=2.0))
    server.start()
    urls = [host.url(f"/page/{i}") for i in range(pages)]
    members = [
        Member(name=chr(ord("A") + i), urls=urls[i::processes], settings={**ADDON, **settings})
        for i in range(processes)
    ]
    await run_fleet(members, timeout=600)
    await server.stop()
    arrivals = server.arrivals(host)
    fetched = {url for member in members for url in member.fetched}
    return {
        "pages": len(fetched),
        "429s": len(server.arrivals(host, status=429)),
        "inside": len(sends_inside_cooldowns(arrivals)),
        "seconds": max(member.seconds for member in members),
        "ok": all(member.returncode == 0 for member in members),
    }


async def main(args: argparse.Namespace) -> None:
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="bench-redis-"))).start()
    rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
    try:
        for round_number in range(args.repeat):
            alone = await one_fleet(args.pages, args.processes, {})
            shared = await one_fleet(
                args.pages, args.processes,
                {"RETRY_AFTER_REDIS_URL": redis.url, "RETRY_AFTER_REDIS_PREFIX": f"bench{round_number}"},
            )
            rounds.append((alone, shared))
            print(f"round {round_number + 1}: independent {alone}  redis {shared}", flush=True)
    finally:
        redis.kill()
    print()
    print(f"{args.processes} processes, {args.pages} pages, one host at 10 requests/s, Retry-After 2 "
          f"(medians of {args.repeat})")
    print("| boards | pages | responses 429 | sends inside another's cooldown | seconds |")
    print("|---|---|---|---|---|")
    for label, index in (("independent", 0), ("Redis board", 1)):
        runs = [pair[index] for pair in rounds]
        print(
            f"| {label} | {statistics.median(r['pages'] for r in runs):.0f} / {args.pages} "
            f"| {statistics.median(r['429s'] for r in runs):.0f} "
            f"| {statistics.median(r['inside'] for r in runs):.0f} "
            f"| {statistics.median(r['seconds'] for r in runs):.1f} |"
        )
    ratio = statistics.median(shared["429s"] / max(1, alone["429s"]) for alone, shared in rounds)
    print(f"\n429s with the Redis board / independent boards: {ratio:.2f} (target <= 0.33)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    arguments = parser.parse_args()

    run_on_reactor(lambda: main(arguments))
