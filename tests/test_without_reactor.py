"""Scrapy 2.19 can run on asyncio alone (TWISTED_REACTOR_ENABLED=False): timers must still fire."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import scrapy

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in scrapy.__version__.split(".")[:2]) < (2, 19),
    reason="TWISTED_REACTOR_ENABLED=False exists from Scrapy 2.19 on",
)

CRAWL = textwrap.dedent(
    """
    import sys, time
    from scrapy import Request, Spider
    from scrapy.crawler import AsyncCrawlerProcess

    class One(Spider):
        name = "one"
        async def start(self):
            yield Request(sys.argv[1], callback=self.parse)
        def parse(self, response):
            print("STATUS", response.status, flush=True)

    settings = {
        "TWISTED_REACTOR_ENABLED": False,
        "ADDONS": {"scrapy_retryafter.Addon": 500},
        "LOG_LEVEL": "WARNING",
        "ROBOTSTXT_OBEY": False,
    }
    started = time.monotonic()
    process = AsyncCrawlerProcess(settings)
    process.crawl(One)
    process.start()
    print("ELAPSED", time.monotonic() - started, flush=True)
    assert "twisted.internet.reactor" not in sys.modules, "a Twisted reactor got installed"
    """
)


def test_a_cooldown_ends_on_time_without_a_twisted_reactor(tmp_path):
    server = subprocess.Popen(
        [sys.executable, "-m", "scrapy_retryafter.testing.server", json.dumps({"reject_first": 1, "penalty": 2.0})],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip() + "/page"
        script = tmp_path / "crawl.py"
        script.write_text(CRAWL)
        done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
        assert lines["STATUS"] == "200"
        # 2 x 1.25 s cooldown + up to 1 s wake jitter; Scrapy's own 5 s heartbeat would be later.
        assert 2.5 <= float(lines["ELAPSED"]) < 2.5 + 1.0 + 1.0
    finally:
        server.terminate()
        server.wait(timeout=10)
