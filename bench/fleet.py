"""A fleet of crawler processes on shared hosts: one Redis board against one board each.

    python bench/fleet.py [--processes 2,4,8] [--hosts 1,4] [--pages 600] [--repeat 1] [--arrivals DIR]

Needs redis-server on PATH and the redis package (pip install -e '.[redis]').
The throttling server runs in this process: every host allows 10 requests/s
with no burst (a token bucket of one) and answers a request over it with 429
and Retry-After: 2 (a 2 s penalty). The processes are one spider with one
project directory, each crawling its share of the pages (``--pages`` in all,
spread over the hosts); each parks in a file of its own. For every count of
processes and hosts, the fleet runs with independent boards and then with the
Redis board, both at once on hosts of their own (``--apart``: one after the other), and the table gives:
pages fetched, pages/s and its fraction of the hosts' limit, responses 429
(and those in the first second, before anyone knows the limit), and the time
from the first request to the last page against the ideal (pages / limit),
the seconds the host heard nothing for over 2 s (cooldowns), and the 429s
that came within 3.5 s of the one before (a cut still over the limit).
Acceptance for the Redis board: >= 0.85 of the limit, <= 3 % responses 429.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import asyncioreactor

asyncioreactor.install()

from twisted.internet import defer  # noqa: E402

from scrapy_retryafter.testing.fleet import Member, run_fleet, run_on_reactor  # noqa: E402
from scrapy_retryafter.testing.redis_server import RedisServer  # noqa: E402
from scrapy_retryafter.testing.server import Host, HostConfig, ThrottlingServer  # noqa: E402

ADDON = {"ADDONS": {"scrapy_retryafter.Addon": 500}, "RETRY_AFTER_MAX_RETRIES": 30}
LIMIT = 10.0
BOARDS = ("independent", "Redis board")


def measure(server: ThrottlingServer, hosts: list[Host], members: list[Member], pages: int,
            dump: Path | None = None) -> dict[str, Any]:
    addresses = {host.address for host in hosts}
    arrivals = sorted((a for a in server.arrivals() if a.host in addresses), key=lambda a: a.t)
    if dump is not None:
        with dump.open("w") as out:
            for a in arrivals:
                out.write(json.dumps([a.t, a.status, a.headers.get("user-agent", ""), a.path]) + "\n")
    served = [a for a in arrivals if a.status == 200]
    throttled = [a for a in arrivals if a.status == 429]
    start = arrivals[0].t if arrivals else 0.0
    seconds = (served[-1].t - start) if served else float("inf")
    limit = LIMIT * len(hosts)
    # Where the time goes: silences of a whole cooldown (over 2 s, Retry-After 2), and 429s that came
    # within one cooldown and a second of the one before (a cut still over the limit).
    refused = [a.t for a in throttled]
    return {
        "pages": len({url for member in members for url in member.fetched}),
        "rate": len(served) / seconds if seconds else 0.0,
        "fraction": len(served) / seconds / limit if seconds else 0.0,
        "429s": len(throttled),
        "429%": 100 * len(throttled) / max(1, len(arrivals)),
        "first_second_429s": sum(1 for a in throttled if a.t < start + 1.0),
        "seconds": seconds,
        "vs_ideal": seconds / (pages / limit),
        "ok": all(member.returncode == 0 for member in members),
        "silent_s": sum(gap for gap in (b.t - a.t for a, b in zip(arrivals, arrivals[1:])) if gap > 2.0),
        "chained_429s": sum(1 for a, b in zip(refused, refused[1:]) if b - a < 3.5),
    }


async def side_by_side(pages: int, processes: int, hosts: int, redis_url: str, prefix: str,
                       timeout: float, dump: Path | None = None, apart: bool = False) -> dict[str, dict[str, Any]]:
    """The same fleet twice, on hosts of its own each: independent boards, and the Redis board; at once,
    or with ``apart`` one after the other (twice the processes at once share this machine's cores)."""
    server = ThrottlingServer()
    limited = {label: [server.add_host(HostConfig(rate=LIMIT, penalty=2.0)) for _ in range(hosts)] for label in BOARDS}
    server.start()
    fleets: dict[str, list[Member]] = {}
    for label, own in limited.items():
        settings = {**ADDON, **({} if label == "independent" else {
            "RETRY_AFTER_REDIS_URL": redis_url, "RETRY_AFTER_REDIS_PREFIX": prefix})}
        urls = [own[n % hosts].url(f"/page/{n}") for n in range(pages)]
        fleets[label] = [
            Member(name=f"{label[0]}{i}", urls=urls[i::processes], settings=settings) for i in range(processes)
        ]
    if apart:
        for members in fleets.values():
            await run_fleet(members, timeout=timeout)
    else:
        await defer.gatherResults([
            defer.ensureDeferred(run_fleet(members, timeout=timeout)) for members in fleets.values()
        ])
    await server.stop()
    if dump is not None:
        for label, members in fleets.items():
            for member in members:
                (dump / f"{prefix}-{label.split()[0]}-{member.name}.log").write_text(member.log)
    return {
        label: measure(server, limited[label], fleets[label], pages,
                       dump and dump / f"{prefix}-{label.split()[0]}.jsonl")
        for label in BOARDS
    }


async def main(args: argparse.Namespace) -> None:
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="bench-redis-"))).start()
    table: list[tuple[int, int, str, list[dict[str, Any]]]] = []
    try:
        for hosts in args.hosts:
            for processes in args.processes:
                runs: dict[str, list[dict[str, Any]]] = {label: [] for label in BOARDS}
                for round_number in range(args.repeat):
                    prefix = f"bench-{hosts}-{processes}-{round_number}"
                    results = await side_by_side(args.pages, processes, hosts, redis.url, prefix, args.timeout,
                                                 args.arrivals, args.apart)
                    for label, result in results.items():
                        runs[label].append(result)
                        print(f"{hosts} host(s), {processes} processes, {label}: {result}", flush=True)
                for label, results_of in runs.items():
                    table.append((hosts, processes, label, results_of))
    finally:
        redis.kill()
    print()
    print(f"{args.pages} pages, hosts at {LIMIT:g} requests/s each with no burst, Retry-After 2; "
          f"{'one fleet after the other' if args.apart else 'both fleets at once'} on hosts of their own (medians of {args.repeat}; stopped after {args.timeout:g} s)")
    print("| hosts | processes | boards | pages | pages/s | of the limit | 429s | 429 % | 429s in 1st s "
          "| seconds | × ideal | silent s | chained 429s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for hosts, processes, label, results in table:
        def median(key: str, results: list = results) -> float:
            return statistics.median(r[key] for r in results)

        print(f"| {hosts} | {processes} | {label} | {median('pages'):.0f} / {args.pages} | {median('rate'):.2f} "
              f"| {median('fraction'):.2f} | {median('429s'):.0f} | {median('429%'):.1f} "
              f"| {median('first_second_429s'):.0f} | {median('seconds'):.1f} | {median('vs_ideal'):.2f} "
              f"| {median('silent_s'):.1f} | {median('chained_429s'):.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--processes", type=lambda text: [int(n) for n in text.split(",")], default=[2, 4, 8])
    parser.add_argument("--hosts", type=lambda text: [int(n) for n in text.split(",")], default=[1, 4])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a fleet may crawl")
    parser.add_argument("--apart", action="store_true", help="run the two fleets one after the other, not at once")
    parser.add_argument("--arrivals", type=Path, default=None,
                        help="a directory to write each run's arrival log to (JSON lines: t, status, user-agent, path), "
                             "and each process's log")
    arguments = parser.parse_args()
    if arguments.arrivals is not None:
        arguments.arrivals.mkdir(parents=True, exist_ok=True)

    run_on_reactor(lambda: main(arguments))
