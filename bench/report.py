"""The benchmark report: a chart and a table from one side-by-side run.

    pip install -e '.[bench]'
    python bench/report.py [--pages 200] [--repeat 3] [--out docs]

Stock Scrapy, stock + AutoThrottle and the add-on crawl the same limiter as
bench/compare.py (20 requests/s token bucket with a one-second burst,
Retry-After: 1, hits inside the penalty extend it; CONCURRENT_REQUESTS=16),
each against a fresh server, --repeat times in turn. Writes
``benchmark.png`` (pages and 429s per second over time, one panel per
configuration, from each configuration's median-time run, as the server
logged them) and ``benchmark.md`` (medians over the runs).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import CONFIGS, LIMITERS, run, run_until_done  # noqa: E402  (installs the asyncio reactor)
from twisted.internet import defer  # noqa: E402

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

BIN = 0.5
"""Seconds per bar in the chart; counts are scaled to per second."""


@dataclass
class Run:
    fetched: int
    throttled: int
    seconds: float
    arrivals: list[tuple[float, int]]
    """(seconds since the crawl started, status), as the server saw them."""


@defer.inlineCallbacks
def crawl(name: str, pages: int, limiter: str) -> Any:
    server = ThrottlingServer()
    host = server.add_host(HostConfig(**LIMITERS[limiter]))
    server.start()
    spider, started, elapsed = yield run([host.url(f"/page/{i}") for i in range(pages)], CONFIGS[name])
    yield server.stop()
    arrivals = [(arrival.t - started, arrival.status) for arrival in server.arrivals(host)]
    return Run(len(spider.fetched), len(server.arrivals(host, status=429)), elapsed, arrivals)


def per_second(arrivals: list[tuple[float, int]], status: int, until: float) -> tuple[list[float], list[float]]:
    """Bar positions and heights: responses of ``status`` per second, in BIN-wide bins."""
    counts = collections.Counter(int(t // BIN) for t, code in arrivals if code == status)
    bins = range(int(until // BIN) + 1)
    return [b * BIN for b in bins], [counts.get(b, 0) / BIN for b in bins]


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def chart(runs: dict[str, list[Run]], pages: int, rate: float, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("bench/report.py draws with matplotlib: pip install -e '.[bench]'") from None
    shown = {name: median_run(rs) for name, rs in runs.items()}
    until = max(max((t for t, _ in r.arrivals), default=0.0) for r in shown.values()) + BIN
    # Each panel on its own scale: stock Scrapy's 429 storm would flatten the others.
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.4 * len(shown) + 0.6), sharex=True)
    for ax, (name, r) in zip(axes, shown.items()):
        x, ok = per_second(r.arrivals, 200, until)
        _, throttled = per_second(r.arrivals, 429, until)
        ax.bar(x, ok, width=BIN, align="edge", color="#2b8a3e", label="pages (200) per second")
        ax.bar(x, throttled, width=BIN, align="edge", bottom=ok, color="#e03131", alpha=0.85,
               label="429 per second")
        ax.axhline(rate, color="#495057", linestyle="--", linewidth=1, label=f"server limit, {rate:g}/s")
        ax.set_title(f"{name}: {r.fetched} / {pages} pages, {r.throttled} responses 429, {r.seconds:.1f} s",
                     loc="left", fontsize=10)
        ax.set_ylabel("responses / s")
        ax.set_ylim(0, max(2.5 * rate, max(a + b for a, b in zip(ok, throttled)) * 1.1))
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8, ncol=3)
    axes[-1].set_xlabel("seconds since the crawl started (as the server logged each request)")
    fig.suptitle(f"One limiter, three crawlers: {pages} pages, CONCURRENT_REQUESTS=16", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(runs: dict[str, list[Run]], pages: int) -> str:
    lines = ["| configuration | pages fetched | responses 429 | seconds |", "|---|---|---|---|"]
    for name, rs in runs.items():
        fetched = statistics.median(r.fetched for r in rs)
        throttled = statistics.median(r.throttled for r in rs)
        seconds = statistics.median(r.seconds for r in rs)
        lines.append(f"| {name} | {fetched:g} / {pages} | {throttled:g} | {seconds:.1f} |")
    return "\n".join(lines)


@defer.inlineCallbacks
def main() -> Any:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limiter", choices=sorted(LIMITERS), default="bursty")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Run]] = {name: [] for name in CONFIGS}
    for _ in range(args.repeat):
        for name in CONFIGS:  # in turn, so machine noise hits every configuration alike
            runs[name].append((yield crawl(name, args.pages, args.limiter)))
    rate = LIMITERS[args.limiter]["rate"]
    chart(runs, args.pages, rate, args.out / "benchmark.png")
    text = (
        f"Limiter ({args.limiter}): {rate:g} requests/s, Retry-After: 1, {args.pages} pages, "
        f"CONCURRENT_REQUESTS=16; medians of {args.repeat} run(s), side by side "
        f"(`python bench/report.py --pages {args.pages} --repeat {args.repeat} --limiter {args.limiter}`).\n\n"
        f"{table(runs, args.pages)}\n\n![pages and 429s per second](benchmark.png)\n"
    )
    (args.out / "benchmark.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {args.out / 'benchmark.png'} and {args.out / 'benchmark.md'}")


if __name__ == "__main__":
    run_until_done(main)
