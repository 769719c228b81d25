"""Per-request CPU the add-on adds when nothing throttles, part by part, in µs.

    python -m bench.hooks [--requests 20000] [--repeats 7]

The crawl benchmark (bench/overhead.py) measures the whole, which machine noise
blurs by more than the few percent at stake. Here each part of a request's way
through Scrapy that the add-on touches runs in a loop on real Scrapy objects
(a crawler built with and without the add-on), stock and add-on alternating,
medians of --repeats:

- the downloader middleware chain around a download that answers 200 at once
  (our middleware, our RetryMiddleware in place of Scrapy's, and the chain's
  own cost per middleware method);
- the response_downloaded signal with the receivers each crawler connected;
- the scheduler's priority queue: one push and one pop per request, one host.

The sum, set against the CPU a stock crawl spends per page (bench/overhead.py
prints it), is the overhead to expect from our code alone.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.http import HtmlResponse
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.misc import load_object
from scrapy.utils.reactor import install_reactor
from scrapy.utils.test import get_crawler

BASE = {"CONCURRENT_REQUESTS": 32, "CONCURRENT_REQUESTS_PER_DOMAIN": 32, "TELNETCONSOLE_ENABLED": False}


def make_crawler(addon: bool) -> Any:
    settings = dict(BASE)
    if addon:
        settings["ADDONS"] = {"scrapy_retryafter.Addon": 500}
    crawler = get_crawler(Spider, settings)
    crawler.spider = crawler._create_spider("bench")
    crawler.engine = crawler._create_engine()
    return crawler


def chain(crawler: Any, requests: int) -> float:
    """Seconds per request through the downloader middlewares."""
    downloader = crawler.engine.downloader
    urls = [f"http://127.0.0.1/p/{i}" for i in range(requests)]
    body = b"<html><body>ok</body></html>"

    async def download(request: Request) -> HtmlResponse:
        return HtmlResponse(request.url, status=200, body=body, headers={"Content-Type": "text/html"}, request=request)

    async def loop() -> float:
        clock = time.perf_counter
        started = clock()
        for url in urls:
            await downloader.middleware.download_async(download, Request(url))
        return clock() - started

    return asyncio.get_event_loop().run_until_complete(loop()) / requests


def signal(crawler: Any, requests: int) -> float:
    """Seconds per response_downloaded dispatch."""
    request = Request("http://127.0.0.1/p/1", meta={"download_slot": "127.0.0.1"})
    response = HtmlResponse(request.url, status=200, body=b"ok", request=request)
    send = crawler.signals.send_catch_log
    spider = crawler.spider
    clock = time.perf_counter
    started = clock()
    for _ in range(requests):
        send(signal=signals.response_downloaded, response=response, request=request, spider=spider)
    return (clock() - started) / requests


def queue(crawler: Any, requests: int) -> float:
    """Seconds per push + pop, one host, the queue never holding more than a few."""
    queue_cls = load_object(crawler.settings["SCHEDULER_PRIORITY_QUEUE"])
    pqueue = queue_cls.from_crawler(crawler, FifoMemoryQueue, "")
    batch = [Request(f"http://127.0.0.1/p/{i}") for i in range(requests)]
    clock = time.perf_counter
    started = clock()
    for i in range(0, requests, 4):
        for request in batch[i:i + 4]:
            pqueue.push(request)
        for _ in batch[i:i + 4]:
            pqueue.pop()
    spent = clock() - started
    pqueue.close()
    return spent / requests


PARTS = {"middleware chain": chain, "response_downloaded": signal, "queue push + pop": queue}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    crawlers = {"stock": make_crawler(False), "add-on": make_crawler(True)}
    print(f"{args.requests} requests per run, {args.repeats} runs each (medians), µs per request")
    print("| part | stock | add-on | added |\n|---|---:|---:|---:|")
    total = {"stock": 0.0, "add-on": 0.0}
    for part, measure in PARTS.items():
        times: dict[str, list[float]] = {"stock": [], "add-on": []}
        for repeat in range(args.repeats):
            order = ["stock", "add-on"] if repeat % 2 == 0 else ["add-on", "stock"]
            for name in order:
                gc.collect()
                times[name].append(measure(crawlers[name], args.requests))
        stock, ours = statistics.median(times["stock"]) * 1e6, statistics.median(times["add-on"]) * 1e6
        total["stock"] += stock
        total["add-on"] += ours
        print(f"| {part} | {stock:.2f} | {ours:.2f} | {ours - stock:+.2f} |", flush=True)
    print(f"| total | {total['stock']:.2f} | {total['add-on']:.2f} | {total['add-on'] - total['stock']:+.2f} |")


if __name__ == "__main__":
    main()
