"""What a crawl does per request when nothing throttles, stock Scrapy against the add-on.

    python -m bench.mechanics [--pages 3000] [--runs 3] [--variants stock,add-on]

Throughput on a shared machine is noisy; these counts are not. Each variant
crawls --pages pages from the fast unthrottled server (in its own process)
with CONCURRENT_REQUESTS=32 and reports, besides pages/s:

- requests in flight, sampled every 10 ms: in the downloader (engine's view),
  on the wire (transferring) and waiting in downloader slots;
- signal dispatches and receivers called per request (pydispatcher costs per
  receiver);
- engine loops (``_start_scheduled_requests``) and scheduler pops that came
  back empty, per request;
- timer wake-ups the add-on scheduled.

Variants run in their own process, interleaved, importing this checkout's
scrapy_retryafter. --per-domain 8 --feed callback fills the scheduler, so the
queue's "downloader slot full" test comes into play; --profile writes a
cProfile dump per run; --script only writes the crawl script, for
valgrind --tool=callgrind or strace -c.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from typing import Any

CRAWL = textwrap.dedent(
    """
    import collections, json, sys, time
    from scrapy import Request, Spider
    from scrapy.crawler import CrawlerProcess
    from scrapy.core.engine import ExecutionEngine
    from scrapy.core.scheduler import Scheduler
    from scrapy.signalmanager import SignalManager

    base, pages, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    per_domain, feed = int(sys.argv[4]), sys.argv[5]

    counts = collections.Counter()
    receivers = collections.Counter()
    samples = {"active": [], "transferring": [], "queued": [], "slots": []}

    from scrapy import signals as scrapy_signals
    from scrapy_retryafter import signals as our_signals
    signal_names = {v: k for module in (scrapy_signals, our_signals) for k, v in vars(module).items()
                    if type(v) is object}
    original_send = SignalManager.send_catch_log
    def send_catch_log(self, signal, **kwargs):
        result = original_send(self, signal, **kwargs)
        counts["signal " + signal_names.get(signal, "other")] += 1
        receivers["receivers " + signal_names.get(signal, "other")] += len(result)
        receivers["receivers"] += len(result)
        return result
    SignalManager.send_catch_log = send_catch_log

    original_loop = ExecutionEngine._start_scheduled_requests
    def loop(self):
        counts["engine loops"] += 1
        return original_loop(self)
    ExecutionEngine._start_scheduled_requests = loop

    original_next = Scheduler.next_request
    def next_request(self):
        request = original_next(self)
        counts["scheduler pops" if request is not None else "scheduler pops empty"] += 1
        return request
    Scheduler.next_request = next_request

    if variant != "stock":
        from scrapy_retryafter import timers
        original_call_later = timers.call_later
        def call_later(delay, func):
            counts["add-on timers"] += 1
            return original_call_later(delay, func)
        timers.call_later = call_later
        import scrapy_retryafter.extension as extension_module
        extension_module.call_later = call_later

    class Pages(Spider):
        name = "pages"
        count = 0
        async def start(self):
            if feed == "callback":
                yield Request(f"{base}/links", callback=self.links)
                return
            for i in range(pages):
                yield Request(f"{base}/p/{i}", callback=self.parse)
        def links(self, response):
            for i in range(pages):
                yield Request(f"{base}/p/{i}", callback=self.parse)
        def parse(self, response):
            Pages.count += 1

    settings = {"LOG_LEVEL": "ERROR", "TELNETCONSOLE_ENABLED": False, "ROBOTSTXT_OBEY": False,
                "CONCURRENT_REQUESTS": 32, "CONCURRENT_REQUESTS_PER_DOMAIN": per_domain}
    if variant != "stock":
        settings["ADDONS"] = {"scrapy_retryafter.Addon": 500}
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(Pages)

    def sample():
        engine = crawler.engine
        if engine is None or engine.downloader is None:
            return
        slots = engine.downloader.slots.values()
        samples["active"].append(len(engine.downloader.active))
        samples["transferring"].append(sum(len(s.transferring) for s in slots))
        samples["queued"].append(sum(len(s.queue) for s in slots))
        samples["slots"].append(len(engine.downloader.slots))

    from scrapy import signals
    from scrapy.utils.asyncio import create_looping_call
    sampler = []
    phases = {}
    def first_response(**kwargs):
        phases.setdefault("first response", time.monotonic() - started)
        phases["last response"] = time.monotonic() - started
    crawler.signals.connect(first_response, signal=signals.response_received)
    crawler.signals.connect(lambda **kw: phases.setdefault("engine started", time.monotonic() - started), signal=signals.engine_started, weak=False)
    crawler.signals.connect(lambda **kw: phases.setdefault("spider closed", time.monotonic() - started), signal=signals.spider_closed, weak=False)
    crawler.signals.connect(lambda **kw: phases.setdefault("spider opened", time.monotonic() - started), signal=signals.spider_opened, weak=False)
    def opened(**kwargs):
        sampler.append(create_looping_call(sample))
        sampler[0].start(0.01, now=False)
    def closed(**kwargs):
        if sampler and sampler[0].running:
            sampler[0].stop()
    crawler.signals.connect(opened, signal=signals.spider_opened)
    crawler.signals.connect(closed, signal=signals.spider_closed)
    process.crawl(crawler)
    started, cpu_started = time.monotonic(), time.process_time()
    if len(sys.argv) > 6:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    process.start()
    seconds, cpu = time.monotonic() - started, time.process_time() - cpu_started
    if len(sys.argv) > 6:
        profiler.disable()
        profiler.dump_stats(sys.argv[6])
    mean = {k: (sum(v) / len(v) if v else 0.0) for k, v in samples.items()}
    print(json.dumps({"pages": Pages.count, "seconds": seconds, "cpu": cpu, "mean": mean, "phases": phases, "module": our_signals.__file__,
                      "counts": dict(counts), "receivers": dict(receivers)}))
    """
)


def _median(runs: list[dict[str, Any]], measure: Callable[[dict[str, Any]], float]) -> float:
    return statistics.median(measure(run) for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", default="stock,add-on")
    parser.add_argument("--per-domain", type=int, default=32, help="CONCURRENT_REQUESTS_PER_DOMAIN")
    parser.add_argument("--feed", choices=("start", "callback"), default="start",
                        help="pages yielded by start() (the scheduler stays nearly empty) or by one callback (it fills)")
    parser.add_argument("--profile", help="directory for one cProfile dump per variant and run")
    parser.add_argument("--script", help="only write the crawl script here (to run it under valgrind or strace)")
    args = parser.parse_args()
    if args.script:
        with open(args.script, "w", encoding="utf-8") as script_file:
            script_file.write(CRAWL)
        print(f"python {args.script} BASE_URL PAGES stock|add-on PER_DOMAIN start|callback [PROFILE_FILE]")
        return
    variants = args.variants.split(",")
    server = subprocess.Popen(
        [sys.executable, "-m", "scrapy_retryafter.testing.server", "--quiet", "{}"], stdout=subprocess.PIPE, text=True
    )
    # A file, not -c: Scrapy reads a generator callback's source to check for return values.
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    script.write(CRAWL)
    script.close()
    try:
        assert server.stdout is not None
        base = server.stdout.readline().strip()
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for run in range(args.runs):
            order = variants if run % 2 == 0 else variants[::-1]
            for name in order:
                dump = [f"{args.profile}/{name}-{run}.prof"] if args.profile else []
                out = subprocess.run(
                    [sys.executable, script.name, base, str(args.pages), name, str(args.per_domain), args.feed, *dump],
                    capture_output=True, text=True, check=True, env=env,
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                assert result["pages"] == args.pages, result
                assert result["module"].startswith(env["PYTHONPATH"]), result["module"]
                results[name].append(result)
        print(f"{args.pages} pages, CONCURRENT_REQUESTS=32, CONCURRENT_REQUESTS_PER_DOMAIN={args.per_domain}, "
              f"fed by {args.feed}, {args.runs} runs each (medians)")
        print("| variant | pages/s | CPU µs/page | in downloader | on the wire | queued in slots | engine loops /req "
              "| empty pops /req | signals /req | receivers /req | add-on timers |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, runs in results.items():
            med = functools.partial(_median, runs)
            n = args.pages
            signals = med(lambda r: sum(v for k, v in r["counts"].items() if k.startswith("signal")))
            print(f"| {name} | {med(lambda r: r['pages'] / r['seconds']):.0f} | {med(lambda r: r['cpu']) / n * 1e6:.0f} "
                  f"| {med(lambda r: r['mean']['active']):.1f} | {med(lambda r: r['mean']['transferring']):.1f} "
                  f"| {med(lambda r: r['mean']['queued']):.1f} "
                  f"| {med(lambda r: r['counts'].get('engine loops', 0)) / n:.2f} "
                  f"| {med(lambda r: r['counts'].get('scheduler pops empty', 0)) / n:.2f} "
                  f"| {signals / n:.2f} | {med(lambda r: r['receivers']['receivers']) / n:.2f} "
                  f"| {med(lambda r: r['counts'].get('add-on timers', 0)):.0f} |")
        print("\nphases, seconds after process.start() (median):")
        for key in ("engine started", "spider opened", "first response", "last response", "spider closed"):
            row = " ".join(f"{name}={statistics.median(r['phases'].get(key, 0) for r in runs):.3f}"
                           for name, runs in results.items())
            print(f"  {key}: {row}")
        row = " ".join(f"{name}={statistics.median(r['seconds'] for r in runs):.3f}" for name, runs in results.items())
        print(f"  process.start() returned: {row}")
        print("\nsignal dispatches per request (median):")
        names = sorted({k for runs in results.values() for r in runs for k in r["counts"] if k.startswith("signal")})
        for key in names:
            row = " ".join(f"{name}={statistics.median(r['counts'].get(key, 0) for r in runs) / args.pages:.3f}"
                           for name, runs in results.items())
            receivers = " ".join(
                f"{name}={statistics.median(r['receivers'].get('receivers ' + key[7:], 0) for r in runs) / args.pages:.3f}"
                for name, runs in results.items())
            print(f"  {key[7:]}: dispatches {row}; receivers {receivers}")
    finally:
        os.unlink(script.name)
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
