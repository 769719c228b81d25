"""Exit 1 unless a feed holds every product of the embedded store, as the store shows it.

    python -m shop.check products.jsonl

`scrapy crawl` exits 0 whatever it scraped; this is the part of the example
that says "every product, with the right title and price", for people and CI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shop.store import CATALOGUE


def check(feed: Path) -> list[str]:
    """The problems found in ``feed``; empty when every product is there and right."""
    items = {}
    for line in feed.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            items[item.get("sku")] = item
    problems = []
    for product in CATALOGUE:
        item = items.get(product.sku)
        if item is None:
            problems.append(f"{product.sku} missing")
        elif (item.get("title"), item.get("price")) != (product.title, product.price):
            problems.append(f"{product.sku} scraped as {item.get('title')!r} {item.get('price')!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m shop.check FEED.jsonl", file=sys.stderr)
        return 2
    feed = Path(args[0])
    if not feed.exists():
        print(f"{feed}: no such feed (run `scrapy crawl store -O {feed}` first)", file=sys.stderr)
        return 1
    problems = check(feed)
    for problem in problems[:20]:
        print(problem)
    print(f"{len(CATALOGUE) - len(problems)} / {len(CATALOGUE)} products scraped correctly")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
