"""Gaps between attempts, from the server's arrival log, against each strategy's bounds.

    python bench/retry_gaps.py [--urls 10]

For each failure mode (reset, timeout, 502) and backoff strategy, a host fails
the first 3 attempts of each URL; the add-on recovers them. Each gap between
two attempts of a URL (minus DOWNLOAD_TIMEOUT for timeouts) is compared with
the least and the most the strategy may draw for that attempt: the table
shows how many gaps fell inside (with DISPATCH seconds allowed past the upper
bound for the engine to wake and connect), the earliest a retry came relative
to its lower bound (never negative: no retry is early) and the latest
relative to its upper bound.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import run, run_until_done  # noqa: E402  (installs the asyncio reactor)
from twisted.internet import defer  # noqa: E402

from scrapy_retryafter.backoff import STRATEGIES, Backoff  # noqa: E402
from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

BASE, CAP, TIMEOUT, FAILURES = 0.5, 4.0, 1.0, 3
DISPATCH = 0.1
"""Allowed past the upper bound: the engine's wake-up and a new connection."""
SEND = 0.02
"""Allowed before the lower bound on timeouts only: the crawler's timer starts
when it sends, a few ms before the server logs the arrival."""


@defer.inlineCallbacks
def gaps(failure: str, strategy: str, urls: int) -> Any:
    server = ThrottlingServer()
    host = server.add_host(HostConfig(fail_first=FAILURES, failure=failure, keep_alive=False))
    server.start()
    settings = {
        "ADDONS": {"scrapy_retryafter.Addon": 500},
        "RETRY_TIMES": FAILURES,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,  # every URL's attempt on the wire at once: no capacity wait
        "DOWNLOAD_TIMEOUT": TIMEOUT,
        "RETRY_AFTER_BACKOFF_STRATEGY": strategy,
        "RETRY_AFTER_BACKOFF_BASE": BASE,
        "RETRY_AFTER_BACKOFF_MAX": CAP,
    }
    spider, _, _ = yield run([host.url(f"/{i}") for i in range(urls)], settings)
    yield server.stop()
    by_path = defaultdict(list)
    for arrival in server.arrivals(host):
        by_path[arrival.path].append(arrival.t)
    backoff = Backoff(strategy, BASE, CAP)
    inside, early, late = 0, float("inf"), float("-inf")
    total = 0
    for times in by_path.values():
        for attempt, (before, after) in enumerate(zip(times, times[1:]), start=1):
            gap = after - before - (TIMEOUT if failure == "timeout" else 0.0)
            low, high = backoff.bounds(attempt, prev=CAP)
            total += 1
            inside += low - (SEND if failure == "timeout" else 0.0) <= gap <= high + DISPATCH
            early = min(early, gap - low)
            late = max(late, gap - high)
    return len(spider.fetched), inside, total, early, late


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the arguments before the reactor runs: --help then exits at once."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", type=int, default=10)
    return parser.parse_args(argv)


@defer.inlineCallbacks
def main(args: argparse.Namespace) -> Any:
    print(f"\n{args.urls} URLs failing {FAILURES} times each; base {BASE} s, cap {CAP} s, DOWNLOAD_TIMEOUT {TIMEOUT} s")
    print(f"| failure | strategy | pages | gaps inside bounds (+{DISPATCH} s) | earliest vs lower bound | latest vs upper bound |")
    print("|---|---|---|---|---|---|")
    for failure in ("reset", "timeout", "502"):
        for strategy in STRATEGIES:
            pages, inside, total, early, late = yield gaps(failure, strategy, args.urls)
            print(f"| {failure} | {strategy} | {pages} / {args.urls} | {inside} / {total} "
                  f"| {early:+.3f} s | {late:+.3f} s |")


if __name__ == "__main__":
    options = parse_args()
    run_until_done(lambda: main(options))
