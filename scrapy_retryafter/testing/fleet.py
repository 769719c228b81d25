"""Crawler processes of a fleet, for the tests and bench/fleet.py.

Each member is a real Scrapy process (``python -m scrapy_retryafter.testing.fleet``)
that crawls its share of the URLs with a User-Agent naming it, so the
throttling server's arrival log tells which process sent what. The processes
start crawling at one agreed wall-clock time, so neither gets a head start
from importing Scrapy faster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scrapy import Request, Spider

from ..timers import sleep

__all__ = [
    "FleetSpider", "Member", "pause", "run_fleet", "run_on_reactor", "scrapy_redis_settings", "sends_inside_cooldowns",
]


class FleetSpider(Spider):
    name = "fleet"

    def __init__(self, urls: str = "", start_at: str = "0", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = Path(urls).read_text().split() if urls else []
        self.start_at = float(start_at)
        self.fetched: list[str] = []
        self.failed: list[str] = []

    async def start(self):
        wait = self.start_at - time.time()
        if wait > 0:
            await sleep(wait)
        for url in self.urls:
            yield Request(url, callback=self.parse, errback=self.error)

    def parse(self, response: Any) -> Any:
        if response.status != 200:
            self.failed.append(response.url)
            return
        self.fetched.append(response.url)
        if "/child/" not in response.url:
            # Links found as the crawl goes, so requests are scheduled all along (FLEET_CHILDREN per page).
            for k in range(self.settings.getint("FLEET_CHILDREN")):
                yield Request(f"{response.url}/child/{k}", callback=self.parse, errback=self.error)

    def error(self, failure: Any) -> None:
        self.failed.append(failure.request.url)


@dataclass
class Member:
    """One crawler process of the fleet and what it reported."""

    name: str
    urls: list[str]
    settings: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    fetched: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    log: str = ""
    seconds: float = 0.0


async def run_fleet(members: list[Member], timeout: float = 120.0, start_delay: float = 3.0) -> list[Member]:
    """Run every member as its own process at once; wait without blocking the caller's loop."""
    workdir = Path(tempfile.mkdtemp(prefix="fleet-"))
    start_at = time.time() + start_delay
    running = []
    for member in members:
        urls = workdir / f"{member.name}.urls"
        urls.write_text("\n".join(member.urls))
        report = workdir / f"{member.name}.json"
        log = workdir / f"{member.name}.log"
        command = [
            sys.executable, "-m", "scrapy_retryafter.testing.fleet", member.name, str(urls), str(start_at),
            # Each process parks in a file of its own: one park file takes one run at a time.
            json.dumps({"RETRY_AFTER_PARK_FILE": str(workdir / f"{member.name}.parked.jsonl"), **member.settings}),
            str(report), str(log),
        ]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
        running.append((member, process, report, log))
    deadline = time.monotonic() + timeout + start_delay
    while any(process.poll() is None for _, process, _, _ in running) and time.monotonic() < deadline:
        await pause(0.1)
    for member, process, report, log in running:
        if process.poll() is None:
            process.kill()
            process.wait()
        member.returncode = process.returncode
        member.log = log.read_text() if log.exists() else ""
        if report.exists():
            data = json.loads(report.read_text())
            member.fetched, member.failed = data["fetched"], data["failed"]
            member.stats, member.seconds = data["stats"], data["seconds"]
    return members


async def pause(seconds: float) -> None:
    """Wait on the Twisted reactor (the tests' and the bench's loop) without blocking it."""
    from twisted.internet import reactor, task

    await task.deferLater(reactor, seconds, lambda: None)


def run_on_reactor(work: Any) -> None:
    """Run the coroutine function ``work`` on the reactor until it ends, printing a failure (the benches' main)."""
    from twisted.internet import defer
    from twisted.internet import reactor as installed
    from twisted.python.failure import Failure

    reactor: Any = installed  # the installed reactor: its type says little of what it has

    def finish(result: Any) -> None:
        if isinstance(result, Failure):
            result.printTraceback(file=sys.stderr)  # the default goes to Twisted's log, unwatched here
        reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(work()).addBoth(finish))
    reactor.run()


def scrapy_redis_settings(redis_url: str, key: str) -> dict[str, Any]:
    """One scrapy-redis frontier (and board) per ``key``, kept when a process of the fleet finishes."""
    return {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_PERSIST": True,  # the first process to finish must not empty the others' frontier
        "SCHEDULER_QUEUE_KEY": f"{key}:%(spider)s:requests",
        "SCHEDULER_DUPEFILTER_KEY": f"{key}:%(spider)s:dupefilter",
        "REDIS_URL": redis_url,
        "RETRY_AFTER_REDIS_PREFIX": key,
    }


def sends_inside_cooldowns(arrivals: list[Any], pad: float = 1.25, grace: float = 0.25) -> list[tuple[Any, Any]]:
    """(429, arrival) pairs where one process sent inside a cooldown another process was told of.

    A 429 answered to one process at t with Retry-After s (in seconds) starts
    a cooldown until t + s * pad; any other process's request arriving from
    t + grace until then should not have been sent.
    """
    bad = []
    for throttle in (a for a in arrivals if a.status == 429 and a.retry_after and a.retry_after.isdigit()):
        who = throttle.headers.get("user-agent")
        end = throttle.t + int(throttle.retry_after) * pad
        for arrival in arrivals:
            if arrival.headers.get("user-agent") != who and throttle.t + grace < arrival.t < end:
                bad.append((throttle, arrival))
    return bad


def main(argv: list[str]) -> None:
    """python -m scrapy_retryafter.testing.fleet NAME URLS_FILE START_AT SETTINGS_JSON REPORT LOG"""
    from scrapy.crawler import CrawlerProcess

    name, urls, start_at, settings_json, report, log = argv
    settings = {
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        "LOGSTATS_INTERVAL": 0,
        "LOG_LEVEL": "INFO",
        "LOG_FILE": log,
        "USER_AGENT": f"fleet/{name}",
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        **json.loads(settings_json),
    }
    started = time.monotonic()
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(FleetSpider)
    process.crawl(crawler, urls=urls, start_at=start_at)
    process.start()
    spider = crawler.spider
    stats = {key: value for key, value in crawler.stats.get_stats().items() if isinstance(value, (int, float, str))}
    Path(report).write_text(
        json.dumps(
            {
                "fetched": getattr(spider, "fetched", []),
                "failed": getattr(spider, "failed", []),
                "stats": stats,
                "seconds": time.monotonic() - started,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
