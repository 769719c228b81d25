"""Learning a host's rate: every configuration side by side in one run.

    python bench/learn.py [--pages 400] [--repeat 1] [--parts 1,2,3,4] [--change-at 15]

With --repeat N every row runs N times, the rows taking turns so that
machine noise hits them alike; the tables give medians (and each run's
seconds).

1. Strict limiter (no burst, 20 requests/s, Retry-After: 1 with a penalty),
   rate unknown to the crawler: stock Scrapy, AutoThrottle, the add-on.
2. The same limit announced in rate-limit headers (IETF, X-RateLimit with an
   epoch reset), fixed one-second windows.
3. The limit raised from 5 to 20 requests/s mid-crawl (time until the add-on
   runs at >= 16/s), and lowered from 20 to 5 (429s after the change); with
   --change-at 8,15,25 at each of those times (a raise is found by a probe,
   so how long it takes depends on when it comes).
4. One throttled host beside ten free hosts: the free hosts' throughput with
   and without the throttled one.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import CONFIGS, run  # noqa: E402  (installs the asyncio reactor)
from twisted.internet import defer, reactor  # noqa: E402

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

ADDON = CONFIGS["scrapy-retryafter add-on"]
RATE = 20.0


def per_second(arrivals: list[Any], since: float) -> dict[int, int]:
    bins: dict[int, int] = collections.Counter()
    for arrival in arrivals:
        if arrival.status == 200 and arrival.t >= since:
            bins[int(arrival.t - since)] += 1
    return bins


@defer.inlineCallbacks
def limiter(config: HostConfig, settings: dict[str, Any], pages: int) -> Any:
    server = ThrottlingServer()
    host = server.add_host(config)
    server.start()
    spider, _, elapsed = yield run([host.url(f"/p/{i}") for i in range(pages)], settings)
    yield server.stop()
    sent = len(server.arrivals(host))
    throttled = len(server.arrivals(host, status=429))
    return len(spider.fetched), throttled, sent, elapsed


@defer.inlineCallbacks
def rate_change(start: float, end: float, change_at: float, pages: int) -> Any:
    server = ThrottlingServer()
    host = server.add_host(HostConfig(rate=start, burst=1.0, penalty=1.0))
    server.start()
    changed: list[float] = []

    def change() -> None:
        host.set_rate(end)
        changed.append(server.clock())

    reactor.callLater(change_at, change)  # type: ignore[attr-defined]
    spider, _, elapsed = yield run([host.url(f"/p/{i}") for i in range(pages)], ADDON)
    yield server.stop()
    at = changed[0] if changed else float("inf")
    after = [a for a in server.log if a.t >= at]
    bins = per_second(after, at)
    reached = next((second for second in sorted(bins) if bins[second] >= 0.8 * end), None)
    return len(spider.fetched), sum(a.status == 429 for a in after), reached, elapsed


@defer.inlineCallbacks
def neighbours(pages_free: int) -> Any:
    results = {}
    for with_throttled in (False, True):
        server = ThrottlingServer()
        free = [server.add_host() for _ in range(10)]
        throttled = server.add_host(HostConfig(rate=2.0, burst=1.0, penalty=1.0))
        server.start()
        urls = [host.url(f"/f/{i}") for i in range(pages_free) for host in free]
        if with_throttled:
            urls = [throttled.url(f"/t/{i}") for i in range(40)] + urls
        spider, started, _ = yield run(urls, {**ADDON, "CONCURRENT_REQUESTS": 32})
        free_times = [t for url, t in spider.fetched.items() if not url.startswith(throttled.base_url)]
        results[with_throttled] = len(free_times) / (max(free_times) - started)
        yield server.stop()
    return results


@defer.inlineCallbacks
def main(args: argparse.Namespace) -> Any:
    parts = set(args.parts.split(","))
    ideal = args.pages / RATE

    print(f"\n1-2. {args.pages} pages, limit {RATE:g} requests/s, CONCURRENT_REQUESTS=16; ideal {ideal:.0f} s")
    print("| limiter | configuration | pages | 429s (share of requests) | seconds | x ideal |\n|---|---|---|---|---|---|")
    strict = HostConfig(rate=RATE, burst=1.0, penalty=1.0)
    rows = [("strict, rate not told", name, strict, settings) for name, settings in CONFIGS.items() if "1" in parts]
    for dialect in ("ietf", "x-epoch") if "2" in parts else ():
        announced = HostConfig(rate=RATE, window=1.0, penalty=1.0, ratelimit=dialect)
        rows.append((f"1 s windows, {dialect} headers", "scrapy-retryafter add-on", announced, ADDON))
    runs: list[list[Any]] = [[] for _ in rows]
    for _ in range(args.repeat):
        for row, (_, _, config, settings) in enumerate(rows):
            runs[row].append((yield limiter(HostConfig(**vars(config)), settings, args.pages)))
    for (label, name, _, _), results in zip(rows, runs):
        fetched = min(r[0] for r in results)
        throttled = median(r[1] for r in results)
        share = median(100 * r[1] / r[2] for r in results)
        elapsed = median(r[3] for r in results)
        each = ", ".join(f"{r[3]:.1f}" for r in results)
        print(f"| {label} | {name} | {fetched} / {args.pages} | {throttled:g} ({share:.1f} %) "
              f"| {elapsed:.1f}{f' ({each})' if args.repeat > 1 else ''} | {elapsed / ideal:.2f} |")

    print("\n3. Limit changed mid-crawl (strict limiter, add-on)")
    print("| change | at | pages | 429s after the change | first second at >= 80 % of the new rate |\n|---|---|---|---|---|")
    at_times = [float(t) for t in args.change_at.split(",")]
    changes = [(s, e, 400, at) for at in at_times for s, e in ((5.0, 20.0), (20.0, 5.0))] if "3" in parts else []
    changed: list[list[Any]] = [[] for _ in changes]
    for _ in range(args.repeat):
        for row, (start, end, pages, at) in enumerate(changes):
            changed[row].append((yield rate_change(start, end, at, pages)))
    for (start, end, pages, at), results in zip(changes, changed):
        fetched = min(r[0] for r in results)
        after = median(r[1] for r in results)
        reached = median(math.inf if r[2] is None else r[2] for r in results)
        each = f" (each: {', '.join(str(r[1]) for r in results)} / {', '.join(str(r[2]) for r in results)})"
        print(f"| {start:g} -> {end:g} requests/s | {at:g} s | {fetched} / {pages} | {after:g} | "
              f"{'never' if math.isinf(reached) else f'{reached:g} s after'}{each if args.repeat > 1 else ''} |")

    if "4" not in parts:
        return
    pairs = []
    for _ in range(args.repeat):
        pairs.append((yield neighbours(150)))
    alone, beside = median(r[False] for r in pairs), median(r[True] for r in pairs)
    ratio = median(r[True] / r[False] for r in pairs)
    print("\n4. Ten free hosts (150 pages each), with and without a host limited to 2 requests/s beside them")
    print("| free hosts alone, pages/s | beside the throttled host, pages/s | ratio |\n|---|---|---|")
    print(f"| {alone:.0f} | {beside:.0f} | {ratio:.2f} |")


def _main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--parts", default="1,2,3,4", help="comma-separated parts to run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row, interleaved; medians are printed")
    parser.add_argument("--change-at", default="15", help="part 3: seconds into the crawl the limit changes, comma-separated")
    d = main(parser.parse_args())
    d.addErrback(lambda f: (f.printTraceback(), None))
    d.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    _main()
