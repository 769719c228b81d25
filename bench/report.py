"""The benchmark report: two charts and a table, drawn from the server's own log.

    pip install -e '.[bench]'
    python -m bench.report [--pages 200] [--repeat 3] [--out docs] [--only compare|learn]

``benchmark.png``: stock Scrapy, stock + AutoThrottle and the add-on crawl
the same limiter as bench/compare.py (20 requests/s token bucket holding 20
tokens, Retry-After: 1, hits inside the penalty extend it;
CONCURRENT_REQUESTS=16), each against a fresh server, --repeat times in
turn. One panel per configuration (its median-time run), all on one y-axis:
responses per one-second bin, the server's limit drawn per the same bin.

``learning.png``: the add-on alone against a strict limiter (no burst, 1 s
penalty) whose limit drops mid-crawl: the pace the add-on learned (sampled
from its board every 0.1 s) against the server's limit over time, the pages
it got per second, and every 429 marked.

``benchmark.md``: the table (medians over the runs), the machine and the date.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import BASE, CONFIGS, LIMITERS, PagesSpider, fresh_state, run, run_until_done  # noqa: E402 (installs the reactor)
from scrapy.crawler import CrawlerRunner  # noqa: E402
from twisted.internet import defer, reactor, task  # noqa: E402

from scrapy_retryafter.testing.server import HostConfig, ThrottlingServer  # noqa: E402

BIN = 1.0
"""Seconds per bar. One second, so the limit per bin is the limit per second
plus what a full bucket lets through at once."""

GREEN, RED, GREY, BLUE = "#2b8a3e", "#e03131", "#495057", "#1c7ed6"


@dataclass
class Run:
    fetched: int
    throttled: int
    seconds: float
    arrivals: list[tuple[float, int]]
    """(seconds since the crawl started, status), as the server saw them."""
    pace: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since the crawl started, the add-on's pace for the slot; 0 while unpaced)."""


@defer.inlineCallbacks
def crawl(name: str, pages: int, limiter: str) -> Any:
    server = ThrottlingServer()
    host = server.add_host(HostConfig(**LIMITERS[limiter]))
    server.start()
    spider, started, elapsed = yield run([host.url(f"/page/{i}") for i in range(pages)], CONFIGS[name])
    yield server.stop()
    arrivals = [(arrival.t - started, arrival.status) for arrival in server.arrivals(host)]
    return Run(len(spider.fetched), len(server.arrivals(host, status=429)), elapsed, arrivals)


def per_bin(arrivals: list[tuple[float, int]], status: int, until: float) -> tuple[list[float], list[int]]:
    """Bar positions and heights: responses of ``status`` in each BIN-wide bin."""
    counts = collections.Counter(int(t // BIN) for t, code in arrivals if code == status)
    bins = range(int(until // BIN) + 1)
    return [b * BIN for b in bins], [counts.get(b, 0) for b in bins]


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("bench/report.py draws with matplotlib: pip install -e '.[bench]'") from None
    return plt


def chart(runs: dict[str, list[Run]], pages: int, limiter: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    rate, bucket = limiter["rate"], limiter["burst"]
    sustained, most = rate * BIN, rate * BIN + bucket
    shown = {name: median_run(rs) for name, rs in runs.items()}
    until = max(max((t for t, _ in r.arrivals), default=0.0) for r in shown.values()) + BIN
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 2.5 * len(shown) + 1.4), sharex=True, sharey=True)
    peak = 0
    for ax, (name, r) in zip(axes, shown.items()):
        x, ok = per_bin(r.arrivals, 200, until)
        _, throttled = per_bin(r.arrivals, 429, until)
        peak = max(peak, *(a + b for a, b in zip(ok, throttled)))
        ax.bar(x, ok, width=BIN, align="edge", color=GREEN, label="pages (200)")
        ax.bar(x, throttled, width=BIN, align="edge", bottom=ok, color=RED, alpha=0.85, label="429s")
        ax.axhline(sustained, color=GREY, linestyle="--", linewidth=1,
                   label=f"limit: {rate:g}/s = {sustained:g} per {BIN:g}-s bin")
        ax.axhline(most, color=GREY, linestyle=":", linewidth=1,
                   label=f"most one bin can hold: {most:g} (a full bucket of {bucket:g} on top)")
        ax.set_title(f"{name}: {r.fetched} / {pages} pages, {r.throttled} responses 429, {r.seconds:.1f} s",
                     loc="left", fontsize=10)
        ax.set_ylabel(f"responses per {BIN:g} s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    # The shared axis is cut where stock Scrapy's one-second storm would flatten everything else:
    # the panel's title says its real total.
    axes[0].set_ylim(0, max(4 * most, 10))
    if peak > 4 * most:
        for ax, r in zip(axes, shown.values()):
            x, ok = per_bin(r.arrivals, 200, until)
            _, throttled = per_bin(r.arrivals, 429, until)
            heights = [a + b for a, b in zip(ok, throttled)]
            tallest = max(heights)
            if tallest > 4 * most:
                at = x[heights.index(tallest)] + BIN / 2
                left = at < until / 2
                ax.annotate(f"{tallest} in this bin (cut off)", xy=(at, 4 * most), xytext=(14 if left else -14, -16),
                            textcoords="offset points", fontsize=8, color=RED, ha="left" if left else "right",
                            arrowprops={"arrowstyle": "->", "color": RED})
    axes[-1].set_xlabel("seconds since the crawl started (as the server logged each request)")
    fig.suptitle(f"One limiter, three crawlers: {pages} pages, CONCURRENT_REQUESTS=16", fontsize=11)
    fig.text(
        0.01, 0.01,
        "What to look at: the height of the green bars (pages the server served) and of the red bars (429s).\n"
        "Stock Scrapy and AutoThrottle spend their requests on 429s and give up on most pages. The add-on's bars stay\n"
        "under the dotted line (the most the server lets through in one bin) and near the dashed limit; it fetches every page.",
        fontsize=8, va="bottom", ha="left",
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class Learning:
    run: Run
    limit: list[tuple[float, float]]
    """(seconds since the crawl started, the server's limit from then on)."""


@defer.inlineCallbacks
def learning_run(pages: int, rate: float, drop_at: float, drop_to: float) -> Any:
    """The add-on against a strict limiter whose limit drops at ``drop_at``; the pace sampled from the board."""
    from scrapy_retryafter.extension import RetryAfterExtension

    server = ThrottlingServer()
    host = server.add_host(HostConfig(rate=rate, burst=1.0, penalty=1.0))
    server.start()
    crawler = CrawlerRunner(fresh_state({**BASE, **CONFIGS["scrapy-retryafter add-on"]})).create_crawler(PagesSpider)
    started = time.monotonic()
    pace: list[tuple[float, float]] = []
    limit = [(0.0, rate)]

    def sample() -> None:
        if crawler.engine is None:
            return
        board = RetryAfterExtension.of(crawler).board
        pace.append((time.monotonic() - started, board.rate(host.address) or 0.0))

    def drop() -> None:
        host.set_rate(drop_to)
        limit.append((time.monotonic() - started, drop_to))

    sampler = task.LoopingCall(sample)
    sampler.start(0.1, now=False)
    dropper = reactor.callLater(drop_at, drop)  # type: ignore[attr-defined]
    yield crawler.crawl(urls=[host.url(f"/p/{i}") for i in range(pages)])
    elapsed = time.monotonic() - started
    sampler.stop()
    if dropper.active():
        dropper.cancel()
    yield server.stop()
    arrivals = [(arrival.t - started, arrival.status) for arrival in server.arrivals(host)]
    fetched = len(crawler.spider.fetched)
    return Learning(Run(fetched, len(server.arrivals(host, status=429)), elapsed, arrivals, pace), limit)


def learning_chart(learning: Learning, pages: int, path: Path) -> None:
    plt = _pyplot()
    r = learning.run
    until = max([t for t, _ in r.arrivals] + [t for t, _ in r.pace] + [0.0]) + BIN
    fig, ax = plt.subplots(figsize=(9, 5.0))
    x, ok = per_bin(r.arrivals, 200, until)
    ax.bar(x, ok, width=BIN, align="edge", color=GREEN, alpha=0.35, label="pages (200) per second")
    steps = [*learning.limit, (until, learning.limit[-1][1])]
    ax.step([t for t, _ in steps], [v for _, v in steps], where="post", color=GREY, linestyle="--",
            linewidth=1.5, label="server's limit (requests/s)")
    ax.step([t for t, _ in r.pace], [v for _, v in r.pace], where="post", color=BLUE, linewidth=1.6,
            label="add-on's pace (requests/s; 0 = not paced yet)")
    throttles = [t for t, code in r.arrivals if code == 429]
    top = max([v for _, v in r.pace] + [v for _, v in learning.limit] + ok + [1.0]) * 1.15
    ax.vlines(throttles, 0, top, color=RED, linewidth=0.8, alpha=0.7)
    ax.plot(throttles, [top * 0.97] * len(throttles), "v", color=RED, markersize=5,
            label=f"a 429 ({len(throttles)} in all)")
    ax.set_ylim(0, top)
    ax.set_xlim(0, until)
    ax.set_xlabel("seconds since the crawl started")
    ax.set_ylabel("requests per second")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, ncol=4, frameon=False)
    drop = learning.limit[-1]
    ax.set_title(
        f"Learning the limit: {r.fetched} / {pages} pages in {r.seconds:.1f} s, {r.throttled} responses 429; "
        f"the limit drops to {drop[1]:g}/s at {drop[0]:.0f} s", loc="left", fontsize=10,
    )
    fig.text(
        0.01, 0.01,
        "What to look at: the blue line (the pace the add-on learned) against the dashed line (the server's real\n"
        "limit). Every cut of the pace follows a red mark (a 429; a burst answering the requests already on the\n"
        "wire counts once); between cuts the pace grows back towards the last rate that was refused.",
        fontsize=8, va="bottom", ha="left",
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
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


def machine() -> str:
    import scrapy

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{today}; {platform.system()} {platform.machine()}, {os.cpu_count()} cores, load {load:.1f} at the start; "
        f"Python {platform.python_version()}, Scrapy {scrapy.__version__}"
    )


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Draw docs/benchmark.png and docs/learning.png, write docs/benchmark.md.")
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limiter", choices=sorted(LIMITERS), default="bursty")
    parser.add_argument("--learn-pages", type=int, default=360)
    parser.add_argument("--learn-drop-at", type=float, default=12.0, help="seconds into the crawl the limit drops")
    parser.add_argument("--learn-drop-to", type=float, default=8.0, help="requests/s after the drop")
    parser.add_argument("--only", choices=("compare", "learn"), help="draw one chart")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    return parser.parse_args()


@defer.inlineCallbacks
def main(args: argparse.Namespace) -> Any:
    args.out.mkdir(parents=True, exist_ok=True)
    where = machine()
    if args.only != "learn":
        runs: dict[str, list[Run]] = {name: [] for name in CONFIGS}
        for _ in range(args.repeat):
            for name in CONFIGS:  # in turn, so machine noise hits every configuration alike
                runs[name].append((yield crawl(name, args.pages, args.limiter)))
        limiter = LIMITERS[args.limiter]
        chart(runs, args.pages, limiter, args.out / "benchmark.png")
        text = (
            f"Measured {where}.\n\n"
            f"Limiter ({args.limiter}): {limiter['rate']:g} requests/s, a bucket of {limiter['burst']:g}, "
            f"Retry-After: 1, {args.pages} pages, CONCURRENT_REQUESTS=16; medians of {args.repeat} run(s), "
            f"side by side (`python -m bench.report --pages {args.pages} --repeat {args.repeat} "
            f"--limiter {args.limiter}`).\n\n{table(runs, args.pages)}\n"
        )
        (args.out / "benchmark.md").write_text(text, encoding="utf-8")
        print(text)
        print(f"wrote {args.out / 'benchmark.png'} and {args.out / 'benchmark.md'}")
    if args.only != "compare":
        learning = yield learning_run(args.learn_pages, 20.0, args.learn_drop_at, args.learn_drop_to)
        learning_chart(learning, args.learn_pages, args.out / "learning.png")
        r = learning.run
        print(f"learning: {r.fetched} / {args.learn_pages} pages, {r.throttled} x 429, {r.seconds:.1f} s; "
              f"wrote {args.out / 'learning.png'}")


if __name__ == "__main__":
    options = arguments()  # before the reactor runs: --help and bad arguments exit at once
    run_until_done(lambda: main(options))
