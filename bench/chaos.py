"""Chaos: nothing lost, nothing fetched twice, through throttles, an outage, Ctrl-C and a resume.

A 2,000-page crawl over three hosts of one throttling server (its own
process): random throttle windows on every host (Retry-After), a token-bucket
limiter on one, RateLimit headers on another, and an outage (503 without
Retry-After) on the third. The crawl runs with JOBDIR, gets SIGINT in the
middle of the outage, and is resumed until it finishes; a last run stands for
"the next run" and takes the parked requests back (not_before moved to now).
The server's arrival log is the judge: every page answered 200 exactly once,
or waiting in the park file with its reason.

    python bench/chaos.py [--pages 2000] [--seed 7] [--sigint-after 9]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

CRAWL = textwrap.dedent(
    """
    import json, sys
    from scrapy import Request, Spider
    from scrapy.crawler import CrawlerProcess

    urls_file, jobdir, log_file = sys.argv[1:4]

    class Chaos(Spider):
        name = "chaos"
        async def start(self):
            for url in json.load(open(urls_file)):
                yield Request(url, callback=self.parse)
        def parse(self, response):
            pass
        def closed(self, reason):
            stats = self.crawler.stats.get_stats()
            shown = {k: v for k, v in stats.items() if k.startswith("retry_after/")}
            print(json.dumps({**shown, "finish_reason": reason}, default=str), flush=True)

    process = CrawlerProcess({
        "ADDONS": {"scrapy_retryafter.Addon": 500},
        "JOBDIR": jobdir,
        "LOG_FILE": log_file,
        "LOG_LEVEL": "INFO",
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "RETRY_AFTER_CIRCUIT_THRESHOLD": 10,
        "RETRY_AFTER_CIRCUIT_OPEN_SECONDS": 4.0,
        "RETRY_AFTER_BACKOFF_BASE": 0.5,
        "RETRY_AFTER_BACKOFF_MAX": 2.0,
    })
    process.crawl(Chaos)
    process.start()
    """
)


def windows(rng: random.Random, count: int, horizon: float) -> list[tuple[float, float]]:
    starts = sorted(rng.uniform(2.0, horizon) for _ in range(count))
    return [(round(s, 2), round(s + rng.uniform(1.0, 3.0), 2)) for s in starts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sigint-after", type=float, default=9.0, help="seconds after the server starts")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    outage = (6.0, 16.0)
    hosts = [
        {"rate": 40, "burst": 5, "penalty": 1.0, "windows": windows(rng, 3, 30)},
        {"rate": 50, "burst": 10, "penalty": 0.0, "window": 1.0, "ratelimit": "ietf", "windows": windows(rng, 3, 30)},
        {"status": 503, "outage": outage, "latency": 0.2, "windows": windows(rng, 3, 30)},
    ]
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    print(f"work directory (logs, JOBDIR, park file): {work}")
    server = subprocess.Popen(
        [sys.executable, "-m", "scrapy_retryafter.testing.server", *map(json.dumps, hosts)],
        stdout=subprocess.PIPE, text=True,
    )
    assert server.stdout is not None
    bases = [server.stdout.readline().strip() for _ in hosts]
    started = time.monotonic()
    arrivals: list[dict] = []
    threading.Thread(target=lambda: arrivals.extend(json.loads(line) for line in server.stdout), daemon=True).start()

    urls = [f"{bases[i % 3]}/page/{i}" for i in range(args.pages)]
    (work / "urls.json").write_text(json.dumps(urls))
    (work / "crawl.py").write_text(CRAWL)
    jobdir = work / "job"
    runs = []

    def run(label: str, sigint_at: float | None = None) -> None:
        began = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, str(work / "crawl.py"), str(work / "urls.json"), str(jobdir), str(work / f"{label}.log")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        stop_took = None
        if sigint_at is not None:
            delay = sigint_at - (time.monotonic() - started)
            try:
                proc.wait(timeout=max(0.0, delay))
            except subprocess.TimeoutExpired:
                sent = time.monotonic()
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
                stop_took = time.monotonic() - sent
        out, err = proc.communicate(timeout=600)
        stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        runs.append((label, time.monotonic() - began, stop_took, proc.returncode, stats))
        if proc.returncode != 0:
            print(err[-2000:], file=sys.stderr)

    run("run1-interrupted", sigint_at=args.sigint_after)
    run("run2-resumed")
    park_file = jobdir / "retry_after.parked.jsonl"
    parked_before_rerun = [json.loads(line) for line in park_file.read_text().splitlines()] if park_file.exists() else []
    if parked_before_rerun:
        # "The next run", after the hosts' not_before: move it to now.
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 1))
        park_file.write_text("".join(json.dumps({**r, "not_before": now}) + "\n" for r in parked_before_rerun))
        run("run3-next")
    time.sleep(0.3)
    server.terminate()
    server.wait(timeout=10)

    parked_now = {json.loads(line)["url"] for line in park_file.read_text().splitlines()} if park_file.exists() else set()
    host_of = {base.split("//")[1].split(":")[0]: base for base in bases}
    ok = collections.Counter(host_of[a["host"]] + a["path"] for a in arrivals if a["status"] == 200)
    duplicates = sorted(url for url, n in ok.items() if n > 1)
    lost = sorted(url for url in urls if ok[url] == 0 and url not in parked_now)
    statuses = collections.Counter(a["status"] for a in arrivals)
    # The server's clock is CLOCK_MONOTONIC too; it started just before printing its URLs.
    outage_host = bases[2].split("//")[1].split(":")[0]
    in_outage = [a for a in arrivals if a["host"] == outage_host and outage[0] <= a["t"] - started < outage[1]]

    print(f"pages {args.pages}, hosts 3, seed {args.seed}, throttle windows {[h['windows'] for h in hosts]}, outage {outage} s")
    print("| run | seconds | stop after SIGINT | exit | retry_after stats |")
    print("|---|---|---|---|---|")
    for label, took, stop_took, code, stats in runs:
        keys = ("retry_after/throttled", "retry_after/parked", "retry_after/unparked", "retry_after/circuit_opened",
                "retry_after/host_paused", "retry_after/paused_retries", "finish_reason")
        shown = ", ".join(f"{k.split('/')[-1]}={stats.get(k)}" for k in keys if k in stats)
        print(f"| {label} | {took:.1f} | {'' if stop_took is None else f'{stop_took:.1f} s'} | {code} | {shown} |")
    print(f"responses by status: {dict(sorted(statuses.items()))}; requests to the outage host during "
          f"its outage: {len(in_outage)} (8 may be in flight at once; the host is then paused and probed one "
          f"request per interval, its requests held, not parked as budget_spent)")
    print(f"parked after run 2: {len(parked_before_rerun)} "
          f"({dict(collections.Counter(r['reason'] for r in parked_before_rerun))}); still parked at the end: {len(parked_now)}")
    print(f"fetched once: {sum(1 for u in urls if ok[u] == 1)}/{args.pages}; duplicates: {len(duplicates)}; lost: {len(lost)}")
    if duplicates[:5] or lost[:5]:
        print("examples:", duplicates[:5], lost[:5])
    return 0 if not duplicates and not lost and all(code == 0 for _, _, _, code, _ in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
