"""A small crawl against a slow host: what learning costs when there is little to learn for.

    python bench/small.py [--repeat 3]

Eleven pages from a host allowing 2 requests/s (token bucket, burst 1,
Retry-After: 3), CONCURRENT_REQUESTS=16: the ideal is 5.5 s. Each refusal
costs a padded cooldown of 3.75 s, longer than what a faster pace could save
on the pages left. First crawl, then a second crawl of the same host with the
first one's per-host state (memory), with the add-on and with
DOWNLOADER_MIDDLEWARES alone; medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import CONFIGS, run, run_until_done  # noqa: E402  (installs the asyncio reactor)
from twisted.internet import defer, reactor, task  # noqa: E402

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

PAGES = 11
RATE = 2.0
SETUPS: dict[str, dict[str, Any]] = {
    "add-on": CONFIGS["scrapy-retryafter add-on"],
    "middleware alone": {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}},
}


@defer.inlineCallbacks
def pair(settings: dict[str, Any]) -> Any:
    """First and second crawl of one host, the second with the first's state: (seconds, 429s, pages) each."""
    state = str(Path(tempfile.mkdtemp(prefix="bench-small-")) / "parked.jsonl")
    server = ThrottlingServer()
    host = server.add_host(HostConfig(rate=RATE, burst=1.0, penalty=3.0))
    server.start()
    urls = [host.url(f"/page/{i}") for i in range(PAGES)]
    rows = []
    for crawl in range(2):
        if crawl:  # the host's bucket refills: a second crawl comes later, not the same second
            yield task.deferLater(reactor, 2.0, lambda: None)
        before = len(server.arrivals(host, status=429))
        spider, _, elapsed = yield run(urls, {**settings, "RETRY_AFTER_PARK_FILE": state})
        rows.append((elapsed, len(server.arrivals(host, status=429)) - before, len(spider.fetched)))
    yield server.stop()
    return rows


@defer.inlineCallbacks
def main(args: argparse.Namespace) -> Any:
    ideal = PAGES / RATE
    print(f"\n{PAGES} pages, {RATE:g} requests/s, Retry-After: 3; ideal {ideal:.1f} s "
          f"(median of {args.repeat}; targets: first <= 2x, second <= 1.2x)")
    print("| setup | crawl | seconds | x ideal | 429s | pages | runs, s |\n|---|---|---|---|---|---|---|")
    for name, settings in SETUPS.items():
        runs = []
        for _ in range(args.repeat):
            runs.append((yield pair(settings)))
        for index, label in enumerate(("first", "second (memory)")):
            seconds = [r[index][0] for r in runs]
            median = statistics.median(seconds)
            throttled = statistics.median(r[index][1] for r in runs)
            pages = min(r[index][2] for r in runs)
            listed = ", ".join(f"{s:.2f}" for s in seconds)
            print(f"| {name} | {label} | {median:.2f} | {median / ideal:.2f} | {throttled:g} | {pages} / {PAGES} | {listed} |")


def _main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    run_until_done(lambda: main(options))


if __name__ == "__main__":
    _main()
