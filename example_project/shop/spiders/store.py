"""The store spider: every product of a paginated catalogue, however hard the store pushes back.

    scrapy crawl store -O products.jsonl                      # the embedded store on loopback
    scrapy crawl store -a start_url=https://books.toscrape.com/ -O books.jsonl

Without ``start_url`` it starts the embedded throttling store (shop/store.py)
and crawls it completely. Everything scrapy-retryafter needs is in
custom_settings, so this file can be copied into another project as it is.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import scrapy
from scrapy.utils.defer import maybe_deferred_to_future

from shop.store import CATALOGUE, SHOP, WWW, EmbeddedStore

logger = logging.getLogger(__name__)


class StoreSpider(scrapy.Spider):
    name = "store"

    custom_settings = {
        # One line installs the middleware, the extension, the queue and the live view.
        "ADDONS": {"scrapy_retryafter.Addon": 500},
        "CONCURRENT_REQUESTS": 16,
        # Scrapy's own per-host knob: a tight concurrency for each store host.
        "DOWNLOAD_SLOTS": {WWW: {"concurrency": 4}, SHOP: {"concurrency": 2}},
        # Per-slot policy: the listing host is worth more patience.
        "RETRY_AFTER_SLOTS": {WWW: {"max_retries": 8}},
        "RETRY_AFTER_LOGSTATS_INTERVAL": 5.0,
    }

    def __init__(
        self,
        start_url: str | None = None,
        product_css: str = "article.product_pod h3 a::attr(href)",
        next_css: str = "li.next a::attr(href)",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.start_url = start_url
        self.product_css = product_css
        self.next_css = next_css
        self.store: EmbeddedStore | None = None
        self.scraped: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> StoreSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        if spider.start_url is None and not crawler.settings.get("RETRY_AFTER_PARK_FILE"):
            # The embedded store gets new ports every run: a request parked for it would point nowhere next time.
            spider.park_dir = tempfile.TemporaryDirectory(prefix="shop-parked-")
            crawler.settings.set("RETRY_AFTER_PARK_FILE", str(Path(spider.park_dir.name, "store.parked.jsonl")), "spider")
        return spider

    async def start(self):  # type: ignore[no-untyped-def]
        url = self.start_url
        if url is None:
            self.store = EmbeddedStore().start()
            url = self.store.start_url
            logger.info("Embedded store on %s and %s: %d products", self.store.www.base_url,
                        self.store.shop.base_url, len(CATALOGUE))
        yield scrapy.Request(url, callback=self.parse)

    def parse(self, response: scrapy.http.Response) -> Any:
        for href in response.css(self.next_css).getall():
            # The listing first: it finds the products on every host early.
            yield response.follow(href, callback=self.parse, priority=1)
        for href in response.css(self.product_css).getall():
            yield response.follow(href, callback=self.parse_product)

    def parse_product(self, response: scrapy.http.Response) -> Any:
        sku = response.xpath('//th[text()="UPC"]/following-sibling::td[1]/text()').get() or response.url
        self.scraped.add(sku)
        yield {
            "sku": sku,
            "title": (response.css(".product_main h1::text").get() or response.css("h1::text").get() or "").strip(),
            "price": (response.css(".product_main .price_color::text").get() or "").strip(),
            "url": response.url,
        }

    async def closed(self, reason: str) -> None:
        if self.store is None:
            logger.info("Scraped %d products (%s)", len(self.scraped), reason)
            return
        missing = len(CATALOGUE) - len(self.scraped & {product.sku for product in CATALOGUE})
        for line in self.store.report():
            logger.info(line)
        log = logger.info if not missing else logger.error
        log("Scraped %d of %d products, %d missing (%s)", len(CATALOGUE) - missing, len(CATALOGUE), missing, reason)
        await maybe_deferred_to_future(self.store.stop())
