"""The middleware alone keeps a cooling host's requests out of the downloader: another host is not starved."""

from __future__ import annotations

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

MIDDLEWARE_ONLY = {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}
A_PAGES, B_PAGES = 20, 48
SETTINGS = {"CONCURRENT_REQUESTS": 8, "RETRY_AFTER_ADAPTIVE": False}


def b_time(arrivals, b):
    """From the crawl's first arrival to B's last."""
    return max(x.t for x in arrivals if x.host == b.address) - min(x.t for x in arrivals)


def requests_for(a, b):
    # A first: without a waiting room its held requests take every download place.
    pages = [Request(a.url(f"/a/{i}")) for i in range(A_PAGES)] if a is not None else []
    return pages + [Request(b.url(f"/b/{i}")) for i in range(B_PAGES)]


@pytest.mark.parametrize("mode", [ADDON, MIDDLEWARE_ONLY], ids=["add-on", "middleware only"])
@pytest_twisted.ensureDeferred
async def test_a_cooling_host_does_not_starve_a_free_one(server, mode, record_property):
    a = server.add_host(HostConfig(reject_first=1, penalty=3.0), address="127.0.0.2")
    b = server.add_host(HostConfig(latency=0.1), address="127.0.0.3")
    server.start()
    crawler = await crawl(requests_for(None, b), {**mode, **SETTINGS})
    alone = b_time(server.arrivals(b), b)
    assert len({u for u, s in crawler.spider.seen if s == 200}) == B_PAGES
    before = len(server.arrivals())
    crawler = await crawl(requests_for(a, b), {**mode, **SETTINGS})
    arrivals = server.arrivals()[before:]
    beside = b_time(arrivals, b)
    seen = {u for u, s in crawler.spider.seen if s == 200}
    assert seen == {r.url for r in requests_for(a, b)}
    assert server.arrivals(a, status=429)  # A was throttled, and every A page came in the end
    record_property("b_alone", round(alone, 3))
    record_property("b_beside", beside)
    print(f"B alone {alone:.3f}s, beside A {beside:.3f}s")
    assert beside <= 1.3 * alone, (alone, beside)
