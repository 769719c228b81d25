"""pytest plugin for the compatibility runs (loaded with ``-p pytest_compat``).

It refuses to run unless the add-on really is in Scrapy's default settings
(default_addon.py did its job), removes the park files a test left in the
run's .scrapy/retry_after/ (a harness change listed in differences.py), and
writes each test's outcome to the JSON file named by COMPAT_RESULTS for check.py.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_outcomes: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("SCRAPY_RETRYAFTER_COMPAT_ADDON"):
        return
    from scrapy import Spider
    from scrapy.addons import AddonManager
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings

    from scrapy_retryafter import CooldownAwarePriorityQueue, RetryAfterMiddleware

    addons = Settings().getdict("ADDONS")
    if "scrapy_retryafter.Addon" not in addons:
        raise pytest.UsageError(f"the add-on is not in Scrapy's default settings (ADDONS={addons!r})")
    # What a crawler's settings become once its add-ons ran: the package's middleware and queue.
    settings = Settings()
    AddonManager(Crawler(Spider, Settings())).load_settings(settings)
    middlewares = settings.getdict("DOWNLOADER_MIDDLEWARES")
    queue = settings.get("SCHEDULER_PRIORITY_QUEUE")
    if RetryAfterMiddleware not in middlewares or queue != f"scrapy_retryafter.{CooldownAwarePriorityQueue.__name__}":
        raise pytest.UsageError(f"the add-on did not install itself: {middlewares!r}, {queue!r}")


@pytest.fixture(autouse=True)
def _no_park_file_outlives_its_test() -> Iterator[None]:
    # Scrapy's tests reuse spider names: a request one test parked would be fetched by the next.
    yield
    shutil.rmtree(Path(".scrapy", "retry_after"), ignore_errors=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    previous = _outcomes.get(report.nodeid)
    if report.failed:
        outcome = "failed"
    elif report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        if report.when != "call" and previous is not None:
            return
    elif report.when == "call":
        outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"
    else:
        return
    if previous != "failed":
        _outcomes[report.nodeid] = outcome


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _outcomes[report.nodeid or "<collection>"] = "failed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("COMPAT_RESULTS")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(_outcomes, out, indent=0, sort_keys=True)
