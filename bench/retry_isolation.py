"""Retries that wait do not occupy concurrency: a failing host beside a healthy one.

    python bench/retry_isolation.py [--repeat 3] [--failure 502]

Host H answers every page after 50 ms (400 pages); host F fails the first 3
attempts of each of its 40 URLs (502 by default, or reset / timeout). With
CONCURRENT_REQUESTS=8 for the whole crawl, H's time beside F is compared with
H's time alone, runs interleaved, medians reported:

- add-on: F's retries wait their backoff in the scheduler;
- waits in the downloader: the same retry decisions without
  CooldownAwarePriorityQueue, so each waiting retry holds a download place;
- stock Scrapy: immediate retries (nothing waits, and F's pages are lost
  after RETRY_TIMES).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import run, run_until_done  # noqa: E402  (installs the asyncio reactor)
from twisted.internet import defer  # noqa: E402

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

BASE: dict[str, Any] = {
    "COOKIES_ENABLED": False,
    "CONCURRENT_REQUESTS": 8,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "DOWNLOAD_TIMEOUT": 2,
    "RETRY_TIMES": 3,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "add-on (waits in the scheduler)": {"ADDONS": {"scrapy_retryafter.Addon": 500}},
    "waits in the downloader": {
        "DOWNLOADER_MIDDLEWARES": {
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
            "scrapy_retryafter.RetryMiddleware": 550,
            "scrapy_retryafter.RetryAfterMiddleware": 560,
        },
        "RETRY_AFTER_ALL_RETRIES": True,
    },
    "stock Scrapy": {},
}


@defer.inlineCallbacks
def healthy_seconds(settings: dict[str, Any], failure: str, with_failing: bool, pages: int) -> Any:
    """(seconds H took from the crawl's start, F pages recovered)."""
    server = ThrottlingServer()
    healthy = server.add_host(HostConfig(latency=0.05))
    failing = server.add_host(HostConfig(fail_first=3, failure=failure))
    server.start()
    urls = [healthy.url(f"/h/{i}") for i in range(pages)]
    if with_failing:
        urls = [failing.url(f"/f/{i}") for i in range(40)] + urls
    spider, started, _ = yield run(urls, {**BASE, **settings})
    yield server.stop()
    done = max(t for url, t in spider.fetched.items() if url.startswith(healthy.base_url)) - started
    recovered = sum(url.startswith(failing.base_url) for url in spider.fetched)
    return done, recovered


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the arguments before the reactor runs: --help then exits at once."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--failure", default="502", help='"502", "reset" or "timeout"')
    return parser.parse_args(argv)


@defer.inlineCallbacks
def main(args: argparse.Namespace) -> Any:
    yield healthy_seconds(CONFIGS["add-on (waits in the scheduler)"], args.failure, False, 50)  # warm-up
    alone: list[float] = []
    beside: dict[str, list[tuple[float, int]]] = {name: [] for name in CONFIGS}
    for _ in range(args.repeat):
        seconds, _ = yield healthy_seconds(CONFIGS["add-on (waits in the scheduler)"], args.failure, False, args.pages)
        alone.append(seconds)
        for name, settings in CONFIGS.items():
            beside[name].append((yield healthy_seconds(settings, args.failure, True, args.pages)))
    solo = statistics.median(alone)
    print(f"\nH: {args.pages} pages, 50 ms each; F: 40 URLs failing 3 times ({args.failure}); "
          f"CONCURRENT_REQUESTS=8, RETRY_TIMES=3 (median of {args.repeat} run(s))")
    print(f"H alone: {solo:.2f} s")
    print("| configuration | H beside F, s | ratio to H alone | F pages recovered |\n|---|---|---|---|")
    for name, rows in beside.items():
        seconds = statistics.median(r[0] for r in rows)
        recovered = statistics.median(r[1] for r in rows)
        print(f"| {name} | {seconds:.2f} | {seconds / solo:.2f} | {recovered:g} / 40 |")


if __name__ == "__main__":
    options = parse_args()
    run_until_done(lambda: main(options))
