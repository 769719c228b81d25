"""The reactor's longest stall while the park file is flushed, at 20,000 and 100,000 records.

    python -m bench.park_flush [--records 20000 100000] [--compare-rev GIT_REV]

For each size: a park file of that many records (each a serialized request
with headers and meta, as parking writes them) is opened by the real Parking
of a crawler (Scrapy's get_crawler) on the asyncio reactor, which claims them
all in its worker, a bounded batch per claim (each due at once and rebuilt, with no engine
to crawl it, so the next batch is claimed as soon as one is through); then half of them are marked handled and one flush runs,
forced to compact the file (the worst flush there is). A 1 ms looping call on
the reactor records the longest gap between its runs while the worker does
the work: that gap minus 1 ms is the stall. The claim at start and the close
(removals, release, compaction) are measured the same way.

``--compare-rev`` also times the removal of the previous design, which
rewrote the whole file on the reactor thread (``ParkFile.remove`` of
``scrapy_retryafter/parkfile.py`` at that git revision).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

INTERVAL = 0.001


def make_file(path: Path, count: int) -> list[str]:
    from scrapy_retryafter.parkfile import ParkFile, ParkRecord, encode_value

    now = time.time()
    records = []
    for i in range(count):
        request: dict[str, Any] = {
            "url": f"http://127.0.0.{2 + i % 50}:8080/item/{i}?page={i % 97}",
            "callback": "parse", "errback": None, "method": "GET",
            "headers": {"Cookie": [b"session=0123456789abcdef"], "Referer": [f"http://127.0.0.2/list/{i // 50}".encode()]},
            "body": b"", "cookies": {}, "meta": {"depth": 2, "tag": f"item-{i}"}, "encoding": "utf-8",
            "priority": 0, "dont_filter": False, "flags": [], "cb_kwargs": {},
        }
        records.append(ParkRecord(url=request["url"], slot=f"127.0.0.{2 + i % 50}", reason="over_cap",
                                  detail="Retry-After 3600s is over the 300s cap", attempts=1,
                                  not_before=now, request=encode_value(request), spider="bench"))
    with ParkFile(path) as lot:
        for start in range(0, count, 5000):
            lot.add_many(records[start:start + 5000])
    return [record.id for record in records]


class StallMeter:
    """The longest gap between runs of a 1 ms looping call, minus the 1 ms."""

    def __init__(self) -> None:
        from twisted.internet import task

        self.last = time.perf_counter()
        self.worst = 0.0
        self.loop = task.LoopingCall(self.tick)

    def tick(self) -> None:
        now = time.perf_counter()
        self.worst = max(self.worst, now - self.last - INTERVAL)
        self.last = now

    def start(self) -> None:
        self.last = self.started = time.perf_counter()
        self.worst = 0.0
        self.loop.start(INTERVAL, now=True)

    def stop(self) -> float:
        self.loop.stop()
        return self.worst


async def until(condition: Any, limit: float = 600.0) -> None:
    from twisted.internet import reactor, task

    deadline = time.monotonic() + limit
    await task.deferLater(reactor, 0, lambda: None)
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not finish")
        await task.deferLater(reactor, 0.005, lambda: None)


async def measure(count: int, folder: Path) -> dict[str, float]:
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_retryafter import parking as parking_module
    from scrapy_retryafter.parking import Parking
    from scrapy_retryafter.settings import load_config

    path = folder / f"bench-{count}.parked.jsonl"
    ids = make_file(path, count)
    crawler = get_crawler(Spider, {"RETRY_AFTER_PARK_FILE": str(path), "RETRY_AFTER_MAX_DELAY": 86400})
    spider = Spider(name="bench")
    crawler.spider = spider
    parking = Parking(crawler, load_config(crawler.settings), lambda: [])
    meter = StallMeter()
    figures: dict[str, float] = {}

    await until(lambda: True)  # the reactor is running from here on
    meter.start()
    started = time.perf_counter()
    parking._spider_opened(spider=spider)
    if parking._flusher is not None:
        parking._flusher.stop()
    assert parking.loader is not None
    await until(lambda: not parking.loader.loading and not parking.loader.more)
    figures["claim_s"] = time.perf_counter() - started
    figures["claim_stall_ms"] = meter.stop() * 1000
    figures["claims"] = parking.loader.claims
    assert len(parking.loader.claimed_in_worker) == count, "every record claimed"

    # The same wait with nothing to do: what the machine alone costs the reactor.
    meter.start()
    await until(lambda: time.perf_counter() - meter.started >= figures["claim_s"] / 2)
    figures["idle_stall_ms"] = meter.stop() * 1000

    parking.tracker.done = set(ids[: count // 2])
    saved, parking_module._COMPACT_AFTER = parking_module._COMPACT_AFTER, 0
    meter.start()
    started = time.perf_counter()
    parking._flush()
    figures["flush_call_ms"] = (time.perf_counter() - started) * 1000
    await until(lambda: parking._flushing is None)
    figures["flush_s"] = time.perf_counter() - started
    figures["flush_stall_ms"] = meter.stop() * 1000
    parking_module._COMPACT_AFTER = saved

    parking.tracker.done = set(ids[count // 2: count // 2 + count // 4])
    meter.start()
    started = time.perf_counter()
    await parking._spider_closed()
    figures["close_s"] = time.perf_counter() - started
    figures["close_stall_ms"] = meter.stop() * 1000
    left = len(parking.file.read().records) if parking.file is not None else -1
    assert left == count - count // 2 - count // 4, left
    return figures


def old_remove_seconds(rev: str, count: int, folder: Path) -> float:
    source = subprocess.run(["git", "show", f"{rev}:scrapy_retryafter/parkfile.py"], capture_output=True, check=True,
                            text=True).stdout
    module_path = folder / "old_parkfile.py"
    module_path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_parkfile", module_path)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules["old_parkfile"] = old
    spec.loader.exec_module(old)
    path = folder / f"old-{count}.parked.jsonl"
    ids = make_file(path, count)
    with old.ParkFile(path) as lot:
        started = time.perf_counter()
        lot.remove(ids[: count // 2])
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--compare-rev", help="also time the previous design's removal at this git revision")
    args = parser.parse_args()

    from scrapy.utils.reactor import install_reactor

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from twisted.internet import defer, task

    results: dict[int, dict[str, float]] = {}

    async def run(reactor: Any) -> None:
        with tempfile.TemporaryDirectory(prefix="park-bench-") as folder:
            for count in args.records:
                results[count] = await measure(count, Path(folder))
                if args.compare_rev:
                    results[count]["old_remove_s"] = old_remove_seconds(args.compare_rev, count, Path(folder))

    try:
        task.react(lambda reactor: defer.ensureDeferred(run(reactor)))
    except SystemExit as done:
        if done.code:
            raise
    for count, figures in results.items():
        line = (
            f"{count:>7} records: flush (half of them done, compacted) longest reactor stall "
            f"{figures['flush_stall_ms']:.1f} ms (the call itself {figures['flush_call_ms']:.2f} ms; worker "
            f"{figures['flush_s']:.2f} s); claim stall {figures['claim_stall_ms']:.1f} ms "
            f"({figures['claims']:.0f} claims of a bounded batch, worker {figures['claim_s']:.2f} s); close stall {figures['close_stall_ms']:.1f} ms "
            f"(worker {figures['close_s']:.2f} s)"
        )
        line += f"; idle reactor's longest stall on this machine {figures['idle_stall_ms']:.1f} ms"
        if "old_remove_s" in figures:
            line += f"; previous design's removal on the reactor {figures['old_remove_s'] * 1000:.0f} ms"
        print(line, flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
