"""A small online store on loopback that rate-limits like real ones do.

Two hostnames, as a store with a CDN or an API host would have:

- ``www`` (127.0.0.2) serves the product listing (12 products a page, with
  pagination) and half the product pages. It allows 8 requests/s; past that
  it answers 429 with ``Retry-After: 2``, and a request arriving inside those
  2 seconds restarts them.
- ``shop`` (127.0.0.3) serves the other product pages. It allows 8 requests
  per one-second window and says so on every response in the IETF
  ``RateLimit`` / ``RateLimit-Policy`` headers; over the quota, 429.

The markup follows books.toscrape.com's, so the same spider crawls both. The
store also watches its own door: it counts pages asked for again before the
Retry-After it had announced for them, which is what "throttles obeyed"
means from the server's side.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from scrapy_retryafter.testing.server import Host, HostConfig, ThrottlingServer

__all__ = ["CATALOGUE", "EmbeddedStore", "Product", "WWW", "SHOP"]

WWW = "127.0.0.2"
SHOP = "127.0.0.3"
PER_PAGE = 12

_ADJECTIVES = ["Sturdy", "Quiet", "Golden", "Compact", "Vintage", "Nimble", "Woollen", "Crisp", "Bright", "Gentle"]
_NOUNS = ["Kettle", "Lantern", "Notebook", "Teapot", "Backpack", "Umbrella"]


@dataclass(frozen=True)
class Product:
    sku: str
    title: str
    price: str
    host: str

    @property
    def path(self) -> str:
        return f"/product/{self.sku}"


CATALOGUE: tuple[Product, ...] = tuple(
    Product(
        sku=f"sku-{i:04d}",
        title=f"{_ADJECTIVES[i % len(_ADJECTIVES)]} {_NOUNS[i // len(_ADJECTIVES) % len(_NOUNS)]} No. {i}",
        price=f"£{5 + (i * 37) % 90}.{(i * 13) % 100:02d}",
        host=WWW if i % 2 == 0 else SHOP,
    )
    for i in range(1, 121)
)

_BY_PATH = {product.path: product for product in CATALOGUE}


def _page(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><title>{html.escape(title)}</title></head><body>{body}</body></html>"


class EmbeddedStore:
    """The store's two hosts on free ports; start() and stop() inside a running reactor."""

    def __init__(self, www: HostConfig | None = None, shop: HostConfig | None = None) -> None:
        self.server = ThrottlingServer(page=self._render)
        self.www = self.server.add_host(
            www or HostConfig(rate=8.0, burst=8.0, penalty=2.0, extend_on_hit=True, retry_after="seconds"),
            address=WWW,
        )
        self.shop = self.server.add_host(
            shop or HostConfig(rate=8.0, window=1.0, penalty=1.0, ratelimit="ietf"),
            address=SHOP,
        )
        self._retry_not_before: dict[tuple[str, str], float] = {}
        self.early: dict[str, int] = {WWW: 0, SHOP: 0}
        """Retries that arrived before the Retry-After announced for their page."""

    @property
    def start_url(self) -> str:
        return self.www.url("/products?page=1")

    def start(self) -> EmbeddedStore:
        self.server.start()
        return self

    def stop(self):  # type: ignore[no-untyped-def]
        return self.server.stop()

    def _host(self, product: Product) -> Host:
        return self.www if product.host == WWW else self.shop

    def _render(self, host: Host, path: str, status: int) -> str:
        now = self.server.clock()
        if now < self._retry_not_before.get((host.address, path), 0.0):
            self.early[host.address] += 1
        if status != 200:
            announced = max(1, math.ceil(host.penalty_until - now - 1e-9))  # as the Retry-After header says
            self._retry_not_before[(host.address, path)] = now + announced
            return _page("Too Many Requests", f"<h1>{status}</h1><p>Slow down.</p>")
        if path == "/robots.txt":
            return "User-agent: *\nAllow: /\n"
        if path == "/" or path.startswith("/products"):
            return self._listing(path)
        product = _BY_PATH.get(path)
        if product is None or self._host(product) is not host:
            return _page("Not found", "<h1>Not found</h1>")
        return _page(
            product.title,
            '<div class="product_main">'
            f"<h1>{html.escape(product.title)}</h1>"
            f'<p class="price_color">{html.escape(product.price)}</p></div>'
            f'<table class="table table-striped"><tr><th>UPC</th><td>{product.sku}</td></tr></table>',
        )

    def _listing(self, path: str) -> str:
        try:
            number = int(path.partition("page=")[2] or 1)
        except ValueError:
            number = 1
        pages = -(-len(CATALOGUE) // PER_PAGE)
        number = min(max(number, 1), pages)
        items = "".join(
            '<li><article class="product_pod">'
            f'<h3><a href="{self._host(product).url(product.path)}" title="{html.escape(product.title)}">'
            f"{html.escape(product.title)}</a></h3>"
            f'<p class="price_color">{html.escape(product.price)}</p></article></li>'
            for product in CATALOGUE[(number - 1) * PER_PAGE : number * PER_PAGE]
        )
        pager = f'<li class="current">Page {number} of {pages}</li>'
        if number < pages:
            pager += f'<li class="next"><a href="/products?page={number + 1}">next</a></li>'
        return _page(f"Products, page {number}", f'<ol class="row">{items}</ol><ul class="pager">{pager}</ul>')

    def report(self) -> list[str]:
        """One line per host: what the store saw, from its side of the door."""
        return [
            f"Store host {host.address}: {len(self.server.arrivals(host))} requests, "
            f"{len(self.server.arrivals(host, status=429))} answered 429, "
            f"{self.early[host.address]} retries came back before their Retry-After"
            for host in (self.www, self.shop)
        ]
