"""Servers that limit by more than the host, crawled with the add-on: each group's rate against its own limit.

    python -m bench.scopes [--parts keys,paths,proxies] [--scoped] [--pages 1] [--second] [--settings '{...}']

The scoped server (scrapy_retryafter/testing/scoped_server.py) limits:

- keys: two API keys on one host, 5 requests/s each (50 pages per key);
- paths: /search at 1 request/s (10 pages), the rest of the host at 20/s (200 pages);
- proxies: two loopback proxies to one host that limits each client address to 5/s (50 pages each).

Each row: pages fetched, 429s, and the group's rate as a share of its limit:
from the crawl's start to the group's last page, and steady (from 2 s after
the group's first page, past the slow start). ``--scoped`` gives each part
its scope (``header:X-Api-Key``, ``{"path": ["/search"]}``, ``proxy``);
without it the slot scope. ``--pages N`` multiplies every group's pages.
``--second`` crawls each part again on the same server with the first
crawl's per-host memory (one park file for both), and adds its rows: what a
second run of the project gets. ``--settings`` adds settings to the add-on's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import BASE, fresh_state, run_until_done  # noqa: E402  (installs the asyncio reactor)
from scrapy import Request, Spider  # noqa: E402
from scrapy.crawler import CrawlerRunner  # noqa: E402
from twisted.internet import defer, reactor  # noqa: E402
from twisted.internet.task import deferLater  # noqa: E402

from scrapy_retryafter.testing.scoped_server import Limit, LoopbackProxy, ScopedHostConfig, ScopedServer  # noqa: E402

ADDON = {"ADDONS": {"scrapy_retryafter.Addon": 500}, "CLOSESPIDER_TIMEOUT": 180}


class RequestsSpider(Spider):
    name = "scoped"

    def __init__(self, requests: list[Request], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.to_send = requests
        self.fetched = 0

    async def start(self):  # type: ignore[override]
        for request in self.to_send:
            yield request.replace(callback=self.parse)

    def parse(self, response: Any) -> None:
        self.fetched += 1


@defer.inlineCallbacks
def crawl(requests: list[Request], settings: dict[str, Any]) -> Any:
    crawler = CrawlerRunner(fresh_state({**BASE, **ADDON, **settings})).create_crawler(RequestsSpider)
    yield crawler.crawl(requests=requests)
    return crawler


SCOPES = {"keys": ["header:X-Api-Key"], "paths": [{"path": ["/search"]}], "proxies": ["proxy"]}


def row(
    server: ScopedServer, name: str, limit: float, start: float, end: float, **where: Any
) -> tuple[str, int, int, float, float]:
    """One group's row over one crawl: the arrivals from ``start`` (the crawl's) to ``end`` (the next crawl's)."""
    mine = [a for a in server.arrivals(**where) if start <= a.t < end]
    ok = [a for a in mine if a.status == 200]
    refused = sum(a.status == 429 for a in mine)
    span = max(a.t for a in ok) - start if ok else float("inf")
    later = [a.t for a in ok if a.t >= ok[0].t + 2.0]
    steady = (len(later) - 1) / (later[-1] - later[0]) / limit if len(later) > 1 else 0.0
    return name, len(ok), refused, (len(ok) / span) / limit if ok else 0.0, steady


@defer.inlineCallbacks
def crawls(server: ScopedServer, requests: list[Request], settings: dict[str, Any], runs: int) -> Any:
    """(start, end) of each of ``runs`` crawls, one after the other (a pause between: every bucket refills)."""
    starts = []
    for run in range(runs):
        if run:
            yield deferLater(reactor, 2.0, lambda: None)
        starts.append(server.clock())
        yield crawl(requests, settings)
    return list(zip(starts, [*starts[1:], math.inf]))


@defer.inlineCallbacks
def keys_part(settings: dict[str, Any], pages: int, runs: int) -> Any:
    server = ScopedServer()
    host = server.add_host(ScopedHostConfig(key_header="X-Api-Key", key_limit=Limit(rate=5)))
    server.start()
    keys = [Request(host.url(f"/{key}/{i}"), headers={"X-Api-Key": key}) for i in range(50 * pages) for key in ("a", "b")]
    spans = yield crawls(server, keys, settings, runs)
    yield server.stop()
    return [
        [row(server, f"key {key} (5/s)", 5, start, end, host=host, header=("X-Api-Key", key)) for key in ("a", "b")]
        for start, end in spans
    ]


@defer.inlineCallbacks
def paths_part(settings: dict[str, Any], pages: int, runs: int) -> Any:
    server = ScopedServer()
    host = server.add_host(ScopedHostConfig(limit=Limit(rate=20), paths={"/search": Limit(rate=1)}))
    server.start()
    requests = [Request(host.url(f"/search?q={i}")) for i in range(10 * pages)]
    requests += [Request(host.url(f"/items/{i}")) for i in range(200 * pages)]
    spans = yield crawls(server, requests, settings, runs)
    yield server.stop()
    return [
        [
            row(server, "/search (1/s)", 1, start, end, host=host, path="/search"),
            row(server, "the rest (20/s)", 20, start, end, host=host, path="/items/"),
        ]
        for start, end in spans
    ]


@defer.inlineCallbacks
def proxies_part(settings: dict[str, Any], pages: int, runs: int) -> Any:
    server = ScopedServer()
    host = server.add_host(ScopedHostConfig(client_limit=Limit(rate=5)))
    server.start()
    proxies = [LoopbackProxy("127.0.0.11").start(), LoopbackProxy("127.0.0.12").start()]
    requests = [
        Request(host.url(f"/{n}/{i}"), meta={"proxy": proxy.url}) for i in range(50 * pages) for n, proxy in enumerate(proxies)
    ]
    spans = yield crawls(server, requests, settings, runs)
    for proxy in proxies:
        yield proxy.stop()
    yield server.stop()
    return [[row(server, f"proxy {p.address} (5/s)", 5, start, end, host=host, client=p.address) for p in proxies] for start, end in spans]


PARTS = {"keys": keys_part, "paths": paths_part, "proxies": proxies_part}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--scoped", action="store_true", help="each part with its own RETRY_AFTER_SCOPES")
    parser.add_argument("--pages", type=int, default=1, help="multiply every group's pages by this")
    parser.add_argument("--second", action="store_true", help="crawl again with the first crawl's memory")
    parser.add_argument("--settings", default="{}", help="JSON settings added to the add-on's")
    args = parser.parse_args()
    settings = json.loads(args.settings)
    runs = 2 if args.second else 1

    @defer.inlineCallbacks
    def everything() -> Any:
        print(f"settings: {json.dumps(settings) if settings else 'the add-on as is'}; "
              f"{'each part its scope' if args.scoped else 'slot scope'}")
        print("| group | crawl | pages | 429s | rate / its limit | steady / its limit |")
        print("|---|---|---|---|---|---|")
        for part in args.parts.split(","):
            scoped = {"RETRY_AFTER_SCOPES": SCOPES[part]} if args.scoped else {}
            # --second: both crawls share one park file, so the second starts from the first's memory.
            memory = {"RETRY_AFTER_PARK_FILE": str(Path(tempfile.mkdtemp(prefix="bench-scopes-")) / "parked.jsonl")} if args.second else {}
            every_run = yield PARTS[part]({**scoped, **memory, **settings}, args.pages, runs)
            for run, rows in enumerate(every_run):
                for name, pages, refused, share, steady in rows:
                    print(f"| {name} | {('first', 'second')[run]} | {pages} | {refused} | {share:.2f} | {steady:.2f} |", flush=True)

    run_until_done(everything)


if __name__ == "__main__":
    main()
