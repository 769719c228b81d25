"""Several crawler processes of one spider share one park file: each parked URL fetched once, none lost.

Real processes (``scrapy crawl`` in a project directory), the project's
throttling server in the test process, and the server's log as the judge.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor, task

from scrapy_retryafter.parkfile import ParkFile, ParkRecord, read_log
from scrapy_retryafter.testing.server import HostConfig

SPIDER = '''
import scrapy


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, urls="", **kwargs):
        super().__init__(**kwargs)
        self.urls = [url for url in urls.split(",") if url]

    async def start(self):
        for url in self.urls:
            yield scrapy.Request(url, callback=self.parse, errback=self.failed)

    def parse(self, response):
        self.logger.info("PAGE %s %s", response.status, response.url)

    def failed(self, failure):
        self.logger.info("FAILED %s", failure.request.url)
'''

SETTINGS = '''
BOT_NAME = "parkproj"
SPIDER_MODULES = ["parkproj.spiders"]
ADDONS = {"scrapy_retryafter.Addon": 500}
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False
ROBOTSTXT_OBEY = False
LOGSTATS_INTERVAL = 0
RETRY_AFTER_LOGSTATS_INTERVAL = 0
RETRY_AFTER_PAD = 1.0
RETRY_AFTER_WAKE_JITTER = 0
CONCURRENT_REQUESTS_PER_DOMAIN = 2
'''


def make_project(root: Path) -> Path:
    package = root / "parkproj"
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = parkproj.settings\n")
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(textwrap.dedent(SETTINGS))
    (package / "spiders" / "__init__.py").write_text("")
    (package / "spiders" / "pages.py").write_text(textwrap.dedent(SPIDER))
    return root


def start_crawl(project: Path, log: Path, urls: list[str], **settings: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), str(project)])}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    command = [sys.executable, "-m", "scrapy", "crawl", "pages", "-a", f"urls={','.join(urls)}"]
    for key, value in settings.items():
        command += ["-s", f"{key}={value}"]
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT)


async def pause(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def wait_all(processes: list[subprocess.Popen[bytes]], limit: float) -> list[int]:
    deadline = time.monotonic() + limit
    while any(p.poll() is None for p in processes):
        if time.monotonic() > deadline:
            for p in processes:
                if p.poll() is None:
                    p.kill()
            raise AssertionError(f"crawler processes still running after {limit} s")
        await pause(0.1)
    return [p.returncode for p in processes]


def _check_logs(logs: list[Path]) -> str:
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    assert "ParkFileLocked" not in text and "Traceback" not in text and "ERROR" not in text, text[-4000:]
    return text


@pytest_twisted.ensureDeferred
async def test_four_processes_park_together_and_four_more_fetch_each_parked_url_exactly_once(server, tmp_path):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.0, retry_after="4"))
    free = server.add_host(HostConfig())
    server.start()
    project = make_project(tmp_path / "project")
    park_file = project / ".scrapy" / "retry_after" / "pages.parked.jsonl"
    started = time.monotonic()

    # Wave 1: four processes, each its own pages; the capped host answers Retry-After 4 over a 1 s cap.
    logs = [tmp_path / f"wave1-{i}.log" for i in range(4)]
    urls = {i: [capped.url(f"/{i}/{n}") for n in range(6)] + [free.url(f"/{i}/{n}") for n in range(4)] for i in range(4)}
    wave = [start_crawl(project, logs[i], urls[i], RETRY_AFTER_MAX_DELAY=1) for i in range(4)]
    assert await wait_all(wave, 60) == [0, 0, 0, 0]
    _check_logs(logs)
    parked = sorted(entry.url for entry in read_log(park_file).records.values())
    assert parked == sorted(url for i in range(4) for url in urls[i] if url.startswith(capped.base_url))
    assert read_log(park_file).claims == {}
    left = sorted(os.listdir(park_file.parent))
    # No lock or temporary file of the park file; the refusals (host state) stay beside it, with their lock.
    assert [name for name in left if not name.startswith("retry_after.hosts.json")] == ["pages.parked.jsonl"], left
    assert len(server.arrivals(free, status=200)) == 16

    # Wave 2: the host has recovered; four processes start at once and share out the parked requests.
    capped.config.reject_first = 0
    wave2_from = time.monotonic()
    logs2 = [tmp_path / f"wave2-{i}.log" for i in range(4)]
    wave = [start_crawl(project, logs2[i], [], RETRY_AFTER_MAX_DELAY=30) for i in range(4)]
    assert await wait_all(wave, 60) == [0, 0, 0, 0]
    text = _check_logs(logs2)
    loaded = [log.read_text().count("PAGE 200") for log in logs2]
    answered = collections.Counter(capped.url(a.path) for a in server.arrivals(capped, status=200) if a.t >= wave2_from)
    assert sorted(answered) == parked and set(answered.values()) == {1}
    assert text.count("PAGE 200") == len(parked)
    assert not park_file.exists() or read_log(park_file).records == {}
    print(f"two waves of four processes: {time.monotonic() - started:.1f} s, {len(parked)} parked and fetched once "
          f"(per process of the second wave: {loaded})")


@pytest_twisted.ensureDeferred
async def test_a_killed_process_claims_come_back_to_the_next_one_and_not_while_it_lives(server, tmp_path):
    slow = server.add_host(HostConfig(latency=120.0))
    server.start()
    project = make_project(tmp_path / "project")
    park_file = project / ".scrapy" / "retry_after" / "pages.parked.jsonl"
    urls = [slow.url(f"/held/{n}") for n in range(3)]
    with ParkFile(park_file) as lot:
        lot.add_many([
            ParkRecord(url=url, slot=slow.address, reason="over_cap", attempts=1, not_before=time.time(),
                       request=None, spider="pages")
            for url in urls
        ])

    holder = start_crawl(project, tmp_path / "holder.log", [], CONCURRENT_REQUESTS_PER_DOMAIN=8)
    deadline = time.monotonic() + 40
    while len(server.arrivals(slow)) < 3:  # it claimed all three and is fetching them
        assert holder.poll() is None and time.monotonic() < deadline, (tmp_path / "holder.log").read_text()
        await pause(0.1)

    # While it lives, another process of the spider starts and gets none of them.
    other = start_crawl(project, tmp_path / "other.log", [])
    assert await wait_all([other], 40) == [0]
    other_log = _check_logs([tmp_path / "other.log"])
    assert "rescheduled" not in other_log and len(server.arrivals(slow)) == 3

    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    killed_at = time.monotonic()
    assert len(read_log(park_file).claims) == 3  # still claimed, by a process that is gone
    slow.config.latency = 0.0
    after = start_crawl(project, tmp_path / "after.log", [])
    assert await wait_all([after], 40) == [0]
    after_log = _check_logs([tmp_path / "after.log"])
    fetched = collections.Counter(slow.url(a.path) for a in server.arrivals(slow, status=200) if a.t > killed_at)
    assert sorted(fetched) == sorted(urls) and set(fetched.values()) == {1}
    assert after_log.count("PAGE 200") == 3
    assert not park_file.exists() or read_log(park_file).records == {}


BATCHES = '''
import scrapy_retryafter.parkload as parkload

parkload.CLAIM_RECORDS = 5  # a backlog of many batches in a test of seconds
parkload.REFILL_BELOW = 2
'''


@pytest_twisted.ensureDeferred
async def test_processes_loading_one_backlog_at_once_each_claim_batches_of_it_and_fetch_each_url_once(server, tmp_path):
    slow = server.add_host(HostConfig(latency=0.25))
    server.start()
    project = make_project(tmp_path / "project")
    with open(project / "parkproj" / "settings.py", "a") as settings:
        settings.write(textwrap.dedent(BATCHES))
    park_file = project / ".scrapy" / "retry_after" / "pages.parked.jsonl"
    urls = [slow.url(f"/backlog/{n}") for n in range(60)]
    with ParkFile(park_file) as lot:
        lot.add_many([
            ParkRecord(url=url, slot=slow.address, reason="over_cap", attempts=1, not_before=time.time(),
                       request=None, spider="pages")
            for url in urls
        ])

    logs = [tmp_path / f"loader-{i}.log" for i in range(3)]
    wave = [start_crawl(project, log, []) for log in logs]
    assert await wait_all(wave, 90) == [0, 0, 0]
    _check_logs(logs)
    texts = [log.read_text() for log in logs]
    shares = [text.count("PAGE 200") for text in texts]
    batches = [text.count("rescheduled") for text in texts]
    fetched = collections.Counter(slow.url(a.path) for a in server.arrivals(slow, status=200))
    assert sorted(fetched) == sorted(urls) and set(fetched.values()) == {1}
    assert sum(shares) == len(urls) and all(share > 0 for share in shares), shares
    assert all(count <= 5 for text in texts for count in _batch_sizes(text)), texts
    assert not park_file.exists() or read_log(park_file).records == {}
    print(f"60 parked URLs over three processes: {shares} fetched, in {batches} batches")


def _batch_sizes(text: str) -> list[int]:
    return [int(line.split(": ", 2)[-1].split(" ", 1)[0]) for line in text.splitlines() if "rescheduled" in line]
