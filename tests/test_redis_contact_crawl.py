"""A host new to the fleet, in a real crawl: first-contact sends that fail still count as answered."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl
from .redis_fixtures import prefix, redis_server  # noqa: F401

MODES = [ADDON, {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}]


@pytest.mark.parametrize("mode", MODES, ids=["addon", "middleware-only"])
@pytest_twisted.ensureDeferred
async def test_first_contact_sends_that_fail_open_the_host_with_its_last_answer(server, redis_server, prefix, mode):
    """Four of the eight first-contact sends are reset: they leave the downloader with no response.
    Counted only by their responses, the host waited a second past its last answer (SETTLE) for them."""
    slow = server.add_host(HostConfig(latency=0.3))
    resets = server.add_host(HostConfig(fail_first=1, failure="reset", keep_alive=False))
    server.start()
    first = [host.url(f"/first/{i}") for i in range(4) for host in (resets, slow)]
    rest = [slow.url(f"/rest/{i}") for i in range(8)]
    requests = [Request(url, meta={"download_slot": "shared"}) for url in first + rest]
    crawler = await crawl(requests, {
        **mode, "RETRY_AFTER_REDIS_URL": redis_server.url, "RETRY_AFTER_REDIS_PREFIX": prefix,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8, "RETRY_TIMES": 3,
    })
    assert sorted(url for url, _ in crawler.spider.seen) == sorted(first + rest)
    arrivals = sorted(server.arrivals(), key=lambda arrival: arrival.t)
    assert sorted(arrival.path for arrival in arrivals[:8]) == sorted(urlsplit(url).path for url in first)
    assert sum(arrival.failure == "reset" for arrival in arrivals[:8]) == 4
    answered = arrivals[7].t + 0.3  # the last first-contact answer, about when it came (the latency)
    gap = arrivals[8].t - answered
    assert gap < 0.5, f"the host opened {gap:.2f} s after its last first-contact answer"
