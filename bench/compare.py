"""Stock Scrapy, AutoThrottle and the add-on, side by side against one limiter.

    python bench/compare.py [--pages 200] [--repeat 1]

Part 1: a host allowing 20 requests/s (token bucket, Retry-After: 1, hits
inside the penalty extend it), 200 pages, CONCURRENT_REQUESTS=16: pages
fetched and 429s received by each configuration.

Part 2, isolation: host A (2 requests/s, 30 pages) and host B (no limit,
1,500 pages) in one crawl with the add-on: A must get every page, and B must
finish within 1.3x the time B takes alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scrapy.utils.reactor import install_reactor  # noqa: E402

install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

from scrapy import Request, Spider  # noqa: E402
from scrapy.crawler import CrawlerRunner  # noqa: E402
from twisted.internet import defer, reactor  # noqa: E402

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

BASE: dict[str, Any] = {
    "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "CONCURRENT_REQUESTS": 16,
    "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "stock Scrapy": {},
    "stock + AutoThrottle": {"AUTOTHROTTLE_ENABLED": True},
    "scrapy-retryafter add-on": {"ADDONS": {"scrapy_retryafter.Addon": 500}},
}


class PagesSpider(Spider):
    name = "pages"

    def __init__(self, urls: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.fetched: dict[str, float] = {}

    async def start(self):  # type: ignore[override]
        for url in self.urls:
            yield Request(url, callback=self.parse)

    def parse(self, response: Any) -> None:
        self.fetched[response.url] = time.monotonic()


def fresh_state(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings with a park file (and so a per-host state file) of the crawl's own, unless they name one.

    The default location is shared by every run from this directory: a run
    would start at the pace the run before it learned, and a bench's repeats
    would measure the memory, not the learning."""
    if "RETRY_AFTER_PARK_FILE" in settings or "JOBDIR" in settings:
        return settings
    return {**settings, "RETRY_AFTER_PARK_FILE": str(Path(tempfile.mkdtemp(prefix="bench-state-")) / "parked.jsonl")}


@defer.inlineCallbacks
def run(urls: list[str], settings: dict[str, Any]):  # type: ignore[no-untyped-def]
    crawler = CrawlerRunner(fresh_state({**BASE, **settings})).create_crawler(PagesSpider)
    started = time.monotonic()
    yield crawler.crawl(urls=urls)
    return crawler.spider, started, time.monotonic() - started


LIMITERS = {
    # the limiter: a one-second burst, hits inside the penalty extend it
    "bursty": dict(rate=20.0, burst=20.0, penalty=1.0, extend_on_hit=True),
    # no burst at all, the rate never told to the crawler
    "strict": dict(rate=20.0, burst=1.0, penalty=1.0),
}


@defer.inlineCallbacks
def limiter_part(pages: int, limiter: str) -> Any:
    rows = {}
    for name, settings in CONFIGS.items():
        server = ThrottlingServer()
        host = server.add_host(HostConfig(**LIMITERS[limiter]))
        server.start()
        spider, _, elapsed = yield run([host.url(f"/page/{i}") for i in range(pages)], settings)
        yield server.stop()
        rows[name] = (len(spider.fetched), len(server.arrivals(host, status=429)), elapsed)
    return rows


@defer.inlineCallbacks
def isolation_part() -> Any:
    server = ThrottlingServer()
    limited = server.add_host(HostConfig(rate=2.0, burst=1.0, penalty=1.0))
    free = server.add_host()
    server.start()
    addon = CONFIGS["scrapy-retryafter add-on"]
    b_urls = [free.url(f"/b/{i}") for i in range(1500)]
    a_urls = [limited.url(f"/a/{i}") for i in range(30)]
    spider, started, _ = yield run(b_urls, addon)
    alone = max(spider.fetched.values()) - started
    spider, started, _ = yield run(a_urls + b_urls, addon)
    b_done = max(t for url, t in spider.fetched.items() if url.startswith(free.base_url)) - started
    a_pages = sum(url.startswith(limited.base_url) for url in spider.fetched)
    a_429 = len(server.arrivals(limited, status=429))
    yield server.stop()
    return alone, b_done, a_pages, a_429


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the arguments before the reactor runs: --help then exits at once."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--limiter", choices=sorted(LIMITERS), default="bursty")
    parser.add_argument("--no-isolation", action="store_true")
    parser.add_argument("--only", choices=sorted(CONFIGS), help="run one configuration")
    return parser.parse_args(argv)


@defer.inlineCallbacks
def main(args: argparse.Namespace) -> Any:
    if args.only:
        for name in list(CONFIGS):
            if name != args.only:
                del CONFIGS[name]
    runs: dict[str, list[tuple[int, int, float]]] = {}
    isolation: list[tuple[float, float, int, int]] = []
    for _ in range(args.repeat):
        rows = yield limiter_part(args.pages, args.limiter)
        for name, row in rows.items():
            runs.setdefault(name, []).append(row)
        if not args.no_isolation:
            isolation.append((yield isolation_part()))

    print(f"\nLimiter ({args.limiter}): 20 requests/s, Retry-After: 1, {args.pages} pages, "
          f"CONCURRENT_REQUESTS=16 (median of {args.repeat} run(s))")
    print("| configuration | pages fetched | responses 429 | seconds |\n|---|---|---|---|")
    for name, rows in runs.items():
        fetched = statistics.median(r[0] for r in rows)
        throttled = statistics.median(r[1] for r in rows)
        seconds = statistics.median(r[2] for r in rows)
        print(f"| {name} | {fetched:g} / {args.pages} | {throttled:g} | {seconds:.1f} |")
    if not isolation:
        return
    alone = statistics.median(r[0] for r in isolation)
    mixed = statistics.median(r[1] for r in isolation)
    print("\nIsolation: host A 2 requests/s (30 pages) + host B unlimited (1,500 pages), add-on")
    print("| B alone, s | B beside A, s | ratio | A pages | A 429s |\n|---|---|---|---|---|")
    print(f"| {alone:.2f} | {mixed:.2f} | {mixed / alone:.2f} | "
          f"{statistics.median(r[2] for r in isolation):g} / 30 | {statistics.median(r[3] for r in isolation):g} |")


def run_until_done(main: Any) -> None:
    """Run the reactor until the Deferred ``main()`` returns has fired."""
    d = main()
    d.addErrback(lambda f: (f.printTraceback(), None))
    d.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


def _main() -> None:
    if os.environ.get("BENCH_LOG_LEVEL"):
        import logging

        logging.basicConfig(level=os.environ["BENCH_LOG_LEVEL"], format="%(relativeCreated)7.0f %(name)s %(message)s")
    options = parse_args()
    run_until_done(lambda: main(options))


if __name__ == "__main__":
    _main()
