"""Push + pop cost per request: CooldownAwarePriorityQueue against Scrapy's DownloaderAwarePriorityQueue.

    python -m bench.queue_scale [--sizes 10,1000,10000,100000] [--pops 500] [--repeats 5]

Each slot holds one request; 10 % of the slots cool down (for an hour) on the
crawl's board. Each step pops a request, hands it to a real downloader slot as
the engine would (at most --in-flight requests in flight, the oldest finishing
first) and pushes a new request for the same host, so the number of slots
stays put. Only the push and pop calls are timed; both queues run the same
steps on the same crawler, alternating, and the table shows medians.
DownloaderAwarePriorityQueue looks at every slot on every pop, so its cost
grows with the slots; ours should not.
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import time
from typing import Any

from scrapy import Request, Spider
from scrapy.core.downloader import Slot
from scrapy.pqueues import DownloaderAwarePriorityQueue
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.reactor import install_reactor
from scrapy.utils.test import get_crawler

from scrapy_retryafter import CooldownAwarePriorityQueue
from scrapy_retryafter.extension import RetryAfterExtension

COOLING = 0.10


def make_crawler() -> Any:
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    crawler = get_crawler(Spider, {"CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 8})
    crawler.engine = crawler._create_engine()
    return crawler


def run(crawler: Any, queue_cls: type[Any], hosts: list[str], pops: int, in_flight: int) -> float:
    """Seconds per request spent in push + pop."""
    downloader = crawler.engine.downloader
    downloader.slots.clear()
    board = RetryAfterExtension.of(crawler).board
    board._slots.clear()
    queue = queue_cls.from_crawler(crawler, FifoMemoryQueue, "")
    for host in hosts:
        queue.push(Request(f"http://{host}/"))
    for host in hosts[:: int(1 / COOLING)]:
        board.cool(host, 3600.0)
    flying: collections.deque[tuple[Any, Request]] = collections.deque()
    clock = time.perf_counter
    spent = 0.0
    gc.collect()
    gc.disable()
    try:
        for _ in range(pops):
            started = clock()
            request = queue.pop()
            spent += clock() - started
            assert request is not None
            host = downloader.get_slot_key(request)
            slot = downloader.slots.get(host)
            if slot is None:
                slot = downloader.slots[host] = Slot(8, 0.0, 0)
            slot.active.add(request)
            flying.append((slot, request))
            if len(flying) > in_flight:
                done_slot, done = flying.popleft()
                done_slot.active.discard(done)
            request = Request(f"http://{host}/")
            started = clock()
            queue.push(request)
            spent += clock() - started
    finally:
        gc.enable()
    queue.close()
    return spent / pops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,1000,10000,100000")
    parser.add_argument("--pops", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=16)
    args = parser.parse_args()
    crawler = make_crawler()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"{args.pops} pops per run, {args.repeats} runs each, {COOLING:.0%} of slots cooling, "
          f"{args.in_flight} requests in flight; Python {sys.version.split()[0]}")
    print("| slots | DownloaderAwarePriorityQueue µs/request | CooldownAwarePriorityQueue µs/request | ours / Scrapy's |")
    print("|---:|---:|---:|---:|")
    for size in sizes:
        hosts = [f"host{n:07d}.example" for n in range(size)]
        times: dict[str, list[float]] = {"scrapy": [], "ours": []}
        for repeat in range(args.repeats):
            order = [("scrapy", DownloaderAwarePriorityQueue), ("ours", CooldownAwarePriorityQueue)]
            if repeat % 2:
                order.reverse()
            for name, queue_cls in order:
                times[name].append(run(crawler, queue_cls, hosts, args.pops, args.in_flight))
        scrapy, ours = statistics.median(times["scrapy"]), statistics.median(times["ours"])
        print(f"| {size:,} | {scrapy * 1e6:.1f} | {ours * 1e6:.1f} | {ours / scrapy:.3f} |", flush=True)


if __name__ == "__main__":
    main()
