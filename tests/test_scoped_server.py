"""The scoped test server: per path, per key, per client limits, CAPTCHA pages, robots.txt, loopback proxies."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.testing.scoped_server import (
    Captcha,
    Limit,
    LoopbackProxy,
    ScopedHostConfig,
    ScopedServer,
)

from .conftest import ListSpider, crawl


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def admitted(config: ScopedHostConfig, calls: list[tuple[float, str, dict[str, str], str]]) -> list[tuple[int, Any, tuple[str, ...]]]:
    clock = Clock()
    host = ScopedServer(clock=clock).add_host(config)
    results = []
    for at, path, headers, client in calls:
        clock.now = at
        status, wait, refused, captcha = host.admit(at, path, headers, client)
        results.append((status, None if wait is None else round(wait, 3), refused + (("captcha",) if captcha else ())))
    return results


def test_search_has_its_own_bucket_beside_the_rest_of_the_host() -> None:
    config = ScopedHostConfig(limit=Limit(rate=20), paths={"/search": Limit(rate=1)})
    assert admitted(config, [
        (0.00, "/search?q=1", {}, "c"),
        (0.10, "/search?q=2", {}, "c"),
        (0.10, "/items/1", {}, "c"),
        (0.12, "/items/2", {}, "c"),
        (0.15, "/items/3", {}, "c"),
        (0.20, "/searchable", {}, "c"),
        (1.00, "/search/deep", {}, "c"),
    ]) == [
        (200, None, ()),
        (429, 0.9, ("path:/search",)),
        (200, None, ()),
        (429, 0.03, ("host",)),
        (200, None, ()),
        (200, None, ()),
        (200, None, ()),
    ]


def test_each_api_key_has_its_own_bucket() -> None:
    config = ScopedHostConfig(key_header="X-Api-Key", key_limit=Limit(rate=5))
    a, b = {"x-api-key": "a"}, {"x-api-key": "b"}
    assert admitted(config, [(0.0, "/", a, "c"), (0.0, "/", b, "c"), (0.1, "/", a, "c"), (0.2, "/", a, "c")]) == [
        (200, None, ()),
        (200, None, ()),
        (429, 0.1, ("key",)),
        (200, None, ()),
    ]


def test_each_client_address_has_its_own_bucket_and_every_bucket_must_admit() -> None:
    config = ScopedHostConfig(limit=Limit(rate=100), client_limit=Limit(rate=2, penalty=1.0))
    assert admitted(config, [
        (0.0, "/", {}, "127.0.0.11"),
        (0.0, "/", {}, "127.0.0.12"),
        (0.1, "/", {}, "127.0.0.11"),
        (0.6, "/", {}, "127.0.0.11"),  # inside the penalty
        (1.2, "/", {}, "127.0.0.11"),
        (1.2, "/", {}, "127.0.0.13"),  # the client's bucket is full, the host's is empty
    ]) == [
        (200, None, ()),
        (429, 0.01, ("host",)),
        (429, 1.0, ("client",)),
        (429, 0.5, ("client",)),
        (200, None, ()),
        (429, 0.01, ("host",)),
    ]


@pytest.mark.parametrize(
    ("captcha", "expected"),
    [
        (Captcha(after=1, wait=2.0), [200, "captcha", "captcha", 200, 200]),
        (Captcha(after=1, wait=2.0, extend_on_hit=True), [200, "captcha", "captcha", "captcha", 200]),
    ],
)
def test_a_captcha_page_is_served_until_the_wait_has_passed(captcha: Captcha, expected: list[Any]) -> None:
    results = admitted(ScopedHostConfig(captcha=captcha), [(t, "/", {}, "c") for t in (0.0, 0.5, 2.4, 2.6, 4.7)])
    assert [("captcha" if "captcha" in refused else status) for status, _, refused in results] == expected
    assert all(status == 200 for status, _, _ in results)


def test_a_captcha_may_announce_its_wait() -> None:
    results = admitted(ScopedHostConfig(captcha=Captcha(wait=3.0, retry_after=True)), [(0.0, "/", {}, "c"), (1.0, "/", {}, "c")])
    assert results == [(200, 3.0, ("captcha",)), (200, 2.0, ("captcha",))]


def test_only_loopback_addresses() -> None:
    with pytest.raises(ValueError, match="not a loopback address"):
        ScopedServer().add_host(address="10.0.0.1")
    with pytest.raises(ValueError, match="not a loopback address"):
        LoopbackProxy("192.168.1.1")


@pytest.fixture
def scoped():
    srv = ScopedServer()
    proxies: list[LoopbackProxy] = []
    yield srv, proxies
    for proxy in proxies:
        pytest_twisted.blockon(proxy.stop())
    pytest_twisted.blockon(srv.stop())


class PageSpider(ListSpider):
    def parse(self, response: Any) -> None:
        self.seen.append((response.url, response.status, "captcha" in response.text))  # type: ignore[arg-type]


@pytest_twisted.ensureDeferred
async def test_two_proxies_reach_the_host_from_their_own_addresses_without_the_credentials(scoped: Any) -> None:
    srv, proxies = scoped
    host = srv.add_host(ScopedHostConfig(client_limit=Limit(rate=100, burst=10)))
    srv.start()
    proxies += [LoopbackProxy("127.0.0.11").start(), LoopbackProxy("127.0.0.12").start()]
    requests = [
        Request(host.url(f"/p/{i}?x={i}"), meta={"proxy": proxies[i % 2].url.replace("http://", "http://bob:secret@")})
        for i in range(6)
    ]
    crawler = await crawl(requests, {"CONCURRENT_REQUESTS": 4})
    assert len(crawler.spider.seen) == 6
    assert sorted(a.client for a in srv.arrivals(host)) == ["127.0.0.11"] * 3 + ["127.0.0.12"] * 3
    assert all("proxy-authorization" not in a.headers for a in srv.arrivals(host))
    assert sorted(url for _, url in proxies[0].forwarded) == sorted(host.url(f"/p/{i}?x={i}") for i in (0, 2, 4))
    assert {a.path for a in srv.arrivals(host, client="127.0.0.12")} == {f"/p/{i}?x={i}" for i in (1, 3, 5)}


@pytest_twisted.ensureDeferred
async def test_robots_txt_the_captcha_page_and_the_key_header_over_the_wire(scoped: Any) -> None:
    srv, _ = scoped
    host = srv.add_host(ScopedHostConfig(
        robots_txt="User-agent: *\nCrawl-delay: 0.5\n", captcha=Captcha(after=0, wait=60), key_header="X-Api-Key",
        key_limit=Limit(rate=100, burst=10),
    ))
    srv.start()
    requests = [Request(host.url(f"/p/{i}"), headers={"X-Api-Key": "k1" if i < 2 else "k2"}) for i in range(3)]
    crawler = await crawl(requests, {"ROBOTSTXT_OBEY": True}, PageSpider)
    assert [a.path for a in srv.arrivals(host)][0] == "/robots.txt"
    assert sorted(crawler.spider.seen) == [(host.url(f"/p/{i}"), 200, True) for i in range(3)]
    assert len(srv.arrivals(host, header=("X-Api-Key", "k1"))) == 2
    assert all(a.captcha for a in srv.arrivals(host, path="/p/"))
