"""Rewrites a copied test file so that it uses the package's classes where it imported Scrapy's.

An import ``from scrapy.pqueues import DownloaderAwarePriorityQueue`` stays and
gets a line after it rebinding the name to the package's class, so decorators,
module-level tables and function bodies all see the package's class. Dotted
paths in strings (settings values) are replaced the same way.

Then the HARNESS patches of compat/differences.py for the suite are applied.

Usage: python substitute.py TABLE SUITE FILE...   (TABLE: scrapy or scrapy-redis;
SUITE: the Scrapy version, or scrapy-redis)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _addon_paths() -> tuple[str, str]:
    """The Redis queue and dupefilter the add-on installs, wherever the package keeps them."""
    import scrapy_retryafter

    addon = sys.modules[scrapy_retryafter.Addon.__module__]
    return addon._REDIS_QUEUE, addon._TOLERANT_DUPEFILTER


def _split(path: str) -> tuple[str, str]:
    module, _, name = path.rpartition(".")
    return module, name


def tables(table: str) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str]]]:
    """(module, name imported from it, replacement module, replacement name), and dotted paths in strings."""
    if table == "scrapy":
        return [
            ("scrapy.downloadermiddlewares.retry", "RetryMiddleware", "scrapy_retryafter", "RetryMiddleware"),
            ("scrapy.pqueues", "DownloaderAwarePriorityQueue", "scrapy_retryafter", "CooldownAwarePriorityQueue"),
        ], [
            ("scrapy.pqueues.DownloaderAwarePriorityQueue", "scrapy_retryafter.CooldownAwarePriorityQueue"),
            ("scrapy.downloadermiddlewares.retry.RetryMiddleware", "scrapy_retryafter.RetryMiddleware"),
        ]
    queue, dupefilter = _addon_paths()
    return [
        ("scrapy_redis.queue", "PriorityQueue", *_split(queue)),
        ("scrapy_redis.dupefilter", "RFPDupeFilter", *_split(dupefilter)),
    ], [
        ("scrapy_redis.queue.PriorityQueue", queue),
        ("scrapy_redis.dupefilter.RFPDupeFilter", dupefilter),
    ]


def rewrite(source: str, table: str) -> tuple[str, list[str]]:
    names, paths = tables(table)
    lines = source.splitlines(keepends=True)
    inserts: list[tuple[int, str]] = []
    done: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        for module, name, new_module, new_name in names:
            if node.module != module:
                continue
            for alias in node.names:
                if alias.name == name:
                    bound = alias.asname or name
                    indent = " " * node.col_offset
                    inserts.append((node.end_lineno or node.lineno,
                                    f"{indent}from {new_module} import {new_name} as {bound}  # compat substitution\n"))
                    done.append(f"{module}.{name} -> {new_module}.{new_name}")
    for line_no, text in sorted(inserts, reverse=True):
        lines.insert(line_no, text)
    result = "".join(lines)
    for old, new in paths:
        quoted = [f'"{old}"', f"'{old}'"]
        if any(q in result for q in quoted):
            done.append(f"'{old}' -> '{new}'")
            for q in quoted:
                result = result.replace(q, q[0] + new + q[0])
    return result, done


def patch(suite: str) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from differences import HARNESS

    status = 0
    for change in HARNESS:
        if suite not in change.suites or not change.file:
            continue
        path = Path(change.file)
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if change.old not in text:
            print(f"  harness change no longer applies, {change.file}: {change.what}")
            status = 1
            continue
        path.write_text(text.replace(change.old, change.new, 1), encoding="utf-8")
        print(f"  harness change in {change.file}: {change.what}")
    return status


def main(argv: list[str]) -> int:
    table, suite, files = argv[0], argv[1], argv[2:]
    for name in files:
        path = Path(name)
        if not path.exists():
            continue
        new, done = rewrite(path.read_text(encoding="utf-8"), table)
        if done:
            path.write_text(new, encoding="utf-8")
            for item in done:
                print(f"  substituted in {name}: {item}")
    return patch(suite)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
