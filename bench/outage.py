"""Host outages finish in the same run, at a probe's pace (issue 16, items 1 and 2).

    python bench/outage.py [--repeat 1]

Two cases, each with the add-on and with DOWNLOADER_MIDDLEWARES alone where
it applies, Scrapy's defaults otherwise (RETRY_TIMES 2, 16 requests at once,
8 per host):

- a gateway outage: 502 for 6 s from the crawl's start, 50 pages (the
  add-on only: with the middleware alone, stock RetryMiddleware retries 502s);
- a long throttle outage: 503 without Retry-After for 15 s, 100 pages.

From the server's arrival log: pages fetched in the run, requests the host
saw during its outage and their average rate, and how long the crawl took.
The suite tests the 6 s 502 case and a 6 s version of the 503 case
(tests/test_crawl_outage.py); the 15 s figure comes from here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ARGS = None
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    ARGS = parser.parse_args()  # before the reactor: --help returns at once

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import run, run_until_done  # noqa: E402  (installs the asyncio reactor)
from twisted.internet import defer  # noqa: E402

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

MODES = {
    "add-on": {"ADDONS": {"scrapy_retryafter.Addon": 500}},
    "middleware alone": {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}},
}
CASES = [
    # (label, status, outage seconds, pages, modes)
    ("502 for 6 s", 502, 6.0, 50, ("add-on",)),
    ("503 without Retry-After for 15 s", 503, 15.0, 100, ("add-on", "middleware alone")),
]


@defer.inlineCallbacks
def one(status: int, length: float, pages: int, mode: str) -> Any:
    server = ThrottlingServer()
    host = server.add_host(HostConfig(status=status, outage=(0.0, length), retry_after="absent"))
    server.start()
    park = Path(tempfile.mkdtemp(prefix="outage-")) / "parked.jsonl"
    settings = {**MODES[mode], "RETRY_AFTER_PARK_FILE": str(park)}
    spider, _, elapsed = yield run([host.url(f"/{i}") for i in range(pages)], settings)
    yield server.stop()
    inside = [a for a in server.arrivals(host) if a.t - server.started < length]
    parked = len(park.read_text().splitlines()) if park.exists() else 0
    return len(spider.fetched), len(inside), len(inside) / length, parked, elapsed


@defer.inlineCallbacks
def main() -> Any:
    repeat = ARGS.repeat if ARGS is not None else 1
    print("| case | mode | fetched | parked | requests in the outage | rate over the outage | crawl took |")
    print("|---|---|---|---|---|---|---|")
    for label, status, length, pages, modes in CASES:
        for mode in modes:
            for _ in range(repeat):
                fetched, count, rate, parked, elapsed = yield one(status, length, pages, mode)
                print(f"| {label} | {mode} | {fetched} / {pages} | {parked} | {count} | {rate:.2f}/s | {elapsed:.1f} s |")


if __name__ == "__main__":
    run_until_done(main)
