"""How often CooldownAwarePriorityQueue answers None where DownloaderAwarePriorityQueue answers a request.

Runs seeded random sequences of pushes, downloads starting and finishing,
and pops against both queues on one real crawler and its real downloader
slots (concurrency 2), and counts the sequences with at least one pop where
Scrapy's queue hands out a request and the package's holds it because every
slot with requests is full. Numbers for docs/queue-differences.md.

Usage: PYTHONPATH=. python compat/measure_full_slots.py [SEQUENCES] [SEED]
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

from scrapy import Request, Spider
from scrapy.core.downloader import Slot
from scrapy.pqueues import DownloaderAwarePriorityQueue
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.reactor import install_reactor
from scrapy.utils.test import get_crawler

from scrapy_retryafter import CooldownAwarePriorityQueue
from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.extension import RetryAfterExtension

HOSTS = ["a.test", "b.test", "c.test"]
CONCURRENCY = 2
STEPS = 40


def run(sequences: int, seed: int) -> dict[str, int]:
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    park = Path(tempfile.mkdtemp()) / "parked.jsonl"
    crawler = get_crawler(Spider, {"CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY, "RETRY_AFTER_PARK_FILE": str(park)})
    crawler.engine = crawler._create_engine()
    slots = crawler.engine.downloader.slots
    rng = random.Random(seed)
    found = {"sequences": sequences, "sequences_differing": 0, "pops": 0, "pops_differing": 0, "other_mismatch": 0}
    for _ in range(sequences):
        slots.clear()
        extension = RetryAfterExtension.of(crawler)
        extension.board = CooldownBoard()
        ours = CooldownAwarePriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
        theirs = DownloaderAwarePriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
        differed = False
        serial = 0
        for _ in range(STEPS):
            action = rng.random()
            host = rng.choice(HOSTS)
            if action < 0.4:
                serial += 1
                priority = rng.randint(0, 2)
                ours.push(Request(f"http://{host}/{serial}", priority=priority))
                theirs.push(Request(f"http://{host}/{serial}", priority=priority))
            elif action < 0.6:
                slot = slots.setdefault(host, Slot(CONCURRENCY, 0.0, 0))
                if len(slot.active) < CONCURRENCY:  # the engine never has more in flight than a slot takes
                    slot.active.add(Request(f"http://{host}/in-flight/{rng.random()}"))
            elif action < 0.75:
                slot = slots.get(host)
                if slot is not None and slot.active:
                    slot.active.pop()
            else:
                found["pops"] += 1
                mine, stock = ours.pop(), theirs.pop()
                if mine is None and stock is not None:
                    found["pops_differing"] += 1
                    differed = True
                    # Keep both queues holding the same requests: the stock one gets its request back.
                    theirs.push(stock)
                elif (mine is None) != (stock is None):
                    found["other_mismatch"] += 1
        found["sequences_differing"] += differed
        ours.close()
        theirs.close()
    return found


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 18
    print(run(count, seed))
