"""The example project: the store spider scrapes every product of the throttling store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from scrapy.crawler import CrawlerRunner

from scrapy_retryafter.testing.server import HostConfig

from .conftest import BASE_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "example_project"
sys.path.insert(0, str(PROJECT))

from shop import check  # noqa: E402
from shop.spiders.store import StoreSpider  # noqa: E402
from shop.store import CATALOGUE, SHOP, WWW, EmbeddedStore  # noqa: E402


def test_scrapy_crawl_store_scrapes_every_product_and_obeys_every_throttle(tmp_path):
    """The README's main job, as a user runs it (minus the install)."""
    feed = tmp_path / "products.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        # Its own park file: another test run may crawl the project at the same time.
        [sys.executable, "-m", "scrapy", "crawl", "store", "-O", str(feed),
         "-s", f"RETRY_AFTER_PARK_FILE={tmp_path / 'parked.jsonl'}"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=240,
    )
    log = run.stderr
    assert run.returncode == 0, log[-3000:]
    assert "] ERROR: " not in log and "Traceback" not in log, log[-3000:]
    assert f"Scraped {len(CATALOGUE)} of {len(CATALOGUE)} products, 0 missing (finished)" in log, log[-3000:]
    for host in (WWW, SHOP):
        assert re.search(rf"Store host {re.escape(host)}: \d+ requests, \d+ answered 429, 0 retries came back", log)
    summary = log[log.index("Rate-limited slots, this run:"):].splitlines()
    rows = {line.split()[0]: line.split() for line in summary[2:4]}
    assert set(rows) == {WWW, SHOP}
    answered_429 = int(re.search(rf"Store host {re.escape(WWW)}: \d+ requests, (\d+) answered 429", log)[1])
    assert answered_429 > 0, "the store never throttled: the example shows nothing"
    assert rows[WWW][2] == f"429x{answered_429}"
    assert "Held back 127.0.0.2: " in log  # the live view, every 5 s in this spider
    checked = subprocess.run(
        [sys.executable, "-m", "shop.check", str(feed)], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout
    assert f"{len(CATALOGUE)} / {len(CATALOGUE)} products scraped correctly" in checked.stdout


@pytest_twisted.ensureDeferred
async def test_start_url_crawls_another_store_with_the_same_settings(tmp_path):
    # A faster store, started by the test: the spider only gets its URL, as with a real site.
    store = EmbeddedStore(
        www=HostConfig(rate=30.0, burst=5.0, penalty=1.0, extend_on_hit=True),
        shop=HostConfig(rate=30.0, window=1.0, penalty=1.0, ratelimit="ietf"),
    ).start()
    try:
        runner = CrawlerRunner({**BASE_SETTINGS, "ROBOTSTXT_OBEY": True, "RETRY_AFTER_PARK_FILE": str(tmp_path / "parked.jsonl")})
        crawler = runner.create_crawler(StoreSpider)
        await crawler.crawl(start_url=store.start_url)
    finally:
        await store.stop()
    assert crawler.spider.scraped == {product.sku for product in CATALOGUE}
    assert store.early == {WWW: 0, SHOP: 0}
    throttles = len(store.server.arrivals(status=429))
    assert crawler.stats.get_value("retry_after/throttled", 0) == throttles
    assert crawler.stats.get_value("item_scraped_count") == len(CATALOGUE)


def write_feed(path: Path, products) -> Path:
    path.write_text("".join(json.dumps({"sku": p.sku, "title": p.title, "price": p.price}) + "\n" for p in products))
    return path


@pytest.mark.parametrize(
    ("products", "problems"),
    [
        (CATALOGUE, []),
        (CATALOGUE[1:], [f"{CATALOGUE[0].sku} missing"]),
        (CATALOGUE + CATALOGUE[:3], []),  # a duplicate is not a problem
    ],
)
def test_check_finds_missing_products(tmp_path, products, problems):
    assert check.check(write_feed(tmp_path / "feed.jsonl", products)) == problems


def test_check_finds_a_wrong_price_and_exits_1(tmp_path, capsys):
    feed = write_feed(tmp_path / "feed.jsonl", CATALOGUE)
    lines = feed.read_text().splitlines()
    first = json.loads(lines[0]) | {"price": "£0.00"}
    feed.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert check.main([str(feed)]) == 1
    out = capsys.readouterr().out
    assert f"{CATALOGUE[0].sku} scraped as" in out
    assert f"{len(CATALOGUE) - 1} / {len(CATALOGUE)} products scraped correctly" in out
    assert check.main([str(tmp_path / "absent.jsonl")]) == 1
