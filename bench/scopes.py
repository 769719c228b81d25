"""Servers that limit by more than the host, crawled with the add-on: each group's rate against its own limit.

    python -m bench.scopes [--parts keys,paths,proxies] [--scoped] [--settings '{"RETRY_AFTER_...": ...}']

The scoped server (scrapy_retryafter/testing/scoped_server.py) limits:

- keys: two API keys on one host, 5 requests/s each (50 pages per key);
- paths: /search at 1 request/s (10 pages), the rest of the host at 20/s (200 pages);
- proxies: two loopback proxies to one host that limits each client address to 5/s (50 pages each).

Each row: pages fetched, 429s, and the group's rate as a share of its limit:
from the crawl's start to the group's last page, and steady (from 2 s after
the group's first page, past the slow start). ``--scoped`` gives each part
its scope (``header:X-Api-Key``, ``{"path": ["/search"]}``, ``proxy``);
without it the slot scope. ``--settings`` adds settings to the add-on's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import BASE, fresh_state, run_until_done  # noqa: E402  (installs the asyncio reactor)
from scrapy import Request, Spider  # noqa: E402
from scrapy.crawler import CrawlerRunner  # noqa: E402
from twisted.internet import defer  # noqa: E402

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


def row(server: ScopedServer, name: str, limit: float, start: float, **where: Any) -> tuple[str, int, int, float, float]:
    ok = [a for a in server.arrivals(**where) if a.status == 200]
    refused = len(server.arrivals(status=429, **where))
    span = max(a.t for a in ok) - start if ok else float("inf")
    later = [a.t for a in ok if a.t >= ok[0].t + 2.0]
    steady = (len(later) - 1) / (later[-1] - later[0]) / limit if len(later) > 1 else 0.0
    return name, len(ok), refused, (len(ok) / span) / limit if ok else 0.0, steady


@defer.inlineCallbacks
def keys_part(settings: dict[str, Any]) -> Any:
    server = ScopedServer()
    host = server.add_host(ScopedHostConfig(key_header="X-Api-Key", key_limit=Limit(rate=5)))
    server.start()
    requests = [Request(host.url(f"/{key}/{i}"), headers={"X-Api-Key": key}) for i in range(50) for key in ("a", "b")]
    start = server.clock()
    yield crawl(requests, settings)
    yield server.stop()
    return [row(server, f"key {key} (5/s)", 5, start, host=host, header=("X-Api-Key", key)) for key in ("a", "b")]


@defer.inlineCallbacks
def paths_part(settings: dict[str, Any]) -> Any:
    server = ScopedServer()
    host = server.add_host(ScopedHostConfig(limit=Limit(rate=20), paths={"/search": Limit(rate=1)}))
    server.start()
    requests = [Request(host.url(f"/search?q={i}")) for i in range(10)]
    requests += [Request(host.url(f"/items/{i}")) for i in range(200)]
    start = server.clock()
    yield crawl(requests, settings)
    yield server.stop()
    return [
        row(server, "/search (1/s)", 1, start, host=host, path="/search"),
        row(server, "the rest (20/s)", 20, start, host=host, path="/items/"),
    ]


@defer.inlineCallbacks
def proxies_part(settings: dict[str, Any]) -> Any:
    server = ScopedServer()
    host = server.add_host(ScopedHostConfig(client_limit=Limit(rate=5)))
    server.start()
    proxies = [LoopbackProxy("127.0.0.11").start(), LoopbackProxy("127.0.0.12").start()]
    requests = [Request(host.url(f"/{n}/{i}"), meta={"proxy": proxy.url}) for i in range(50) for n, proxy in enumerate(proxies)]
    start = server.clock()
    yield crawl(requests, settings)
    for proxy in proxies:
        yield proxy.stop()
    yield server.stop()
    return [row(server, f"proxy {p.address} (5/s)", 5, start, host=host, client=p.address) for p in proxies]


PARTS = {"keys": keys_part, "paths": paths_part, "proxies": proxies_part}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--scoped", action="store_true", help="each part with its own RETRY_AFTER_SCOPES")
    parser.add_argument("--settings", default="{}", help="JSON settings added to the add-on's")
    args = parser.parse_args()
    settings = json.loads(args.settings)

    @defer.inlineCallbacks
    def everything() -> Any:
        print(f"settings: {json.dumps(settings) if settings else 'the add-on as is'}; "
              f"{'each part its scope' if args.scoped else 'slot scope'}")
        print("| group | pages | 429s | rate / its limit | steady / its limit |")
        print("|---|---|---|---|---|")
        for part in args.parts.split(","):
            scoped = {"RETRY_AFTER_SCOPES": SCOPES[part]} if args.scoped else {}
            rows = yield PARTS[part]({**scoped, **settings})
            for name, pages, refused, share, steady in rows:
                print(f"| {name} | {pages} | {refused} | {share:.2f} | {steady:.2f} |", flush=True)

    run_until_done(everything)


if __name__ == "__main__":
    main()
