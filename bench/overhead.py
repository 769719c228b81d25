"""Cost of the add-on when nothing throttles: stock Scrapy and the add-on, interleaved.

    python -m bench.overhead [--pages 5000] [--runs 15]

A fast unthrottled server runs in its own process; each run crawls --pages
pages with CONCURRENT_REQUESTS=32, alternating stock and add-on so machine
noise hits both alike. Prints the median throughput of each, their ratio and
the spread, and the crawler process's CPU time per page: the crawl keeps one
core busy, so CPU per page moves with throughput but not with the other jobs
on the machine taking turns on the cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time

CRAWL = textwrap.dedent(
    """
    import json, sys, time
    from scrapy import Request, Spider
    from scrapy.crawler import CrawlerProcess

    base, pages, addon = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

    class Pages(Spider):
        name = "pages"
        count = 0
        async def start(self):
            for i in range(pages):
                yield Request(f"{base}/p/{i}", callback=self.parse)
        def parse(self, response):
            Pages.count += 1

    settings = {"LOG_LEVEL": "ERROR", "TELNETCONSOLE_ENABLED": False, "ROBOTSTXT_OBEY": False,
                "CONCURRENT_REQUESTS": 32, "CONCURRENT_REQUESTS_PER_DOMAIN": 32}
    if addon:
        settings["ADDONS"] = {"scrapy_retryafter.Addon": 500}
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(Pages)
    process.crawl(crawler)
    started, cpu_started = time.monotonic(), time.process_time()
    process.start()
    print(json.dumps({"pages": Pages.count, "seconds": time.monotonic() - started,
                      "cpu": time.process_time() - cpu_started}))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-m", "scrapy_retryafter.testing.server", "--quiet", "{}"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        base = server.stdout.readline().strip()
        rates: dict[str, list[float]] = {"stock": [], "add-on": []}
        cpu: dict[str, list[float]] = {"stock": [], "add-on": []}
        for run in range(args.runs):
            order = ("stock", "add-on") if run % 2 == 0 else ("add-on", "stock")
            for name in order:
                out = subprocess.run(
                    [sys.executable, "-c", CRAWL, base, str(args.pages), "1" if name == "add-on" else "0"],
                    capture_output=True, text=True, check=True,
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                assert result["pages"] == args.pages, result
                rates[name].append(result["pages"] / result["seconds"])
                cpu[name].append(result["cpu"] / result["pages"])
        stock, ours = statistics.median(rates["stock"]), statistics.median(rates["add-on"])
        print(f"{args.pages} pages, CONCURRENT_REQUESTS=32, {args.runs} interleaved runs each")
        print("| configuration | median pages/s | min | max | crawler CPU µs/page (median) |\n|---|---|---|---|---|")
        for name, values in rates.items():
            print(f"| {name} | {statistics.median(values):.0f} | {min(values):.0f} | {max(values):.0f} "
                  f"| {statistics.median(cpu[name]) * 1e6:.0f} |")
        ratios = sorted(o / s for o, s in zip(rates["add-on"], rates["stock"]))
        quartiles = statistics.quantiles(ratios, n=4)
        print(f"\nratio add-on / stock (medians): {ours / stock:.3f}; per-pair ratios: median "
              f"{statistics.median(ratios):.3f}, quartiles {quartiles[0]:.3f} .. {quartiles[2]:.3f}, "
              f"range {ratios[0]:.3f} .. {ratios[-1]:.3f}")
        cpu_ratios = sorted(s / o for o, s in zip(cpu["add-on"], cpu["stock"]))
        print(f"CPU per page, stock / add-on (1.0 = no overhead): medians "
              f"{statistics.median(cpu['stock']) / statistics.median(cpu['add-on']):.3f}; per pair: median "
              f"{statistics.median(cpu_ratios):.3f}, range {cpu_ratios[0]:.3f} .. {cpu_ratios[-1]:.3f}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"({time.monotonic() - started:.0f} s)")
