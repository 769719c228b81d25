"""The compatibility suite's expectations, in one place.

INTENDED: Scrapy's or scrapy-redis's tests that fail with the package, each
because of a documented behaviour difference of the package (README section
named in ``why``). check.py fails the run when one of them passes (take it
off) or when a test not listed here fails.

INCOMPATIBLE: tests that fail because of a real incompatibility the package
is to fix, each with its cause. They fail the run like an unlisted failure
(unless COMPAT_ALLOW_KNOWN is set, for a merge ahead of the fix); one that
passes must come off the list.

HARNESS: what the compatibility harness changes beyond installing the add-on
in Scrapy's default settings and substituting the package's classes
(compat/substitute.py lists those), each with why. Entries with ``old`` and
``new`` are applied to the copied test file and fail loudly when ``old`` is
no longer in it.
"""

from __future__ import annotations

from dataclasses import dataclass

S213 = "2.13.0"
S219 = "2.19.0"
SCRAPY = (S213, S219)
REDIS = ("scrapy-redis",)


@dataclass(frozen=True)
class Difference:
    suites: tuple[str, ...]
    test: str
    why: str


@dataclass(frozen=True)
class HarnessChange:
    suites: tuple[str, ...]
    what: str
    why: str
    file: str = ""
    old: str = ""
    new: str = ""


_OWNS_503 = (
    "503 is a throttle code (RETRY_AFTER_HTTP_CODES): RetryAfterMiddleware retries it with backoff up to "
    "RETRY_AFTER_MAX_RETRIES (4) and logs 'Throttled ...' per attempt and 'Gave up ...' at the end, "
    "not stock's 'Retrying ...' (README: Bounded, Logs)"
)
_RETRY_LINE = (
    "with RETRY_AFTER_ALL_RETRIES (on with the add-on) each retry also logs one INFO line 'Retrying <request> on "
    "<slot> after <failure>, attempt n of m, waiting ...' beside get_retry_request's DEBUG 'Retrying' line, so the "
    "test's count of 'Retrying' is 4 for 2 retries, and its give-up line reads 'Gave up <request> on <slot> after "
    "n attempt(s)', not stock's 'Gave up retrying' (README: one INFO line per retry)"
)

_RETRY_MW_503 = (
    "the package's RetryMiddleware leaves the throttle codes (429, 503) to RetryAfterMiddleware, which retries them "
    "with cooldowns and logs its own give-up line; used alone it does not retry them and says so in one WARNING "
    "at start (README: what the add-on replaces). The test expects RetryMiddleware to retry 503 itself"
)
_ENGINE_BUILT_BY_HAND = (
    "the add-on's SCHEDULER_PRIORITY_QUEUE is a DownloaderAwarePriorityQueue, which (like Scrapy's own) needs "
    "crawler.engine when the scheduler opens; the test builds an ExecutionEngine by hand without setting "
    "crawler.engine, which a crawl always sets (README: settings the add-on sets)"
)
_RETRY_MW = "tests/test_downloadermiddleware_retry.py::"

INTENDED: list[Difference] = [
    Difference(SCRAPY, _RETRY_MW + "TestRetry::test_503", _RETRY_MW_503),
    Difference(SCRAPY, _RETRY_MW + "TestRetry::test_priority_adjust", _RETRY_MW_503),
    Difference((S219,), _RETRY_MW + "TestRetry::test_dont_retry", _RETRY_MW_503),
    Difference((S219,), _RETRY_MW + "TestRetry::test_give_up_log_level_setting", _RETRY_MW_503),
    Difference((S219,), _RETRY_MW + "TestRetry::test_give_up_log_level_meta", _RETRY_MW_503),
    Difference((S213,), "tests/test_crawl.py::TestCrawl::test_crawl_multiple", _OWNS_503),
    Difference((S219,), "tests/test_crawler_runners.py::test_crawl_multiple", _OWNS_503),
    Difference((S213,), "tests/test_engine.py::TestEngine::test_start_already_running_exception", _ENGINE_BUILT_BY_HAND),
    Difference(SCRAPY, "tests/test_crawl.py::TestCrawl::test_retry_503", _OWNS_503),
    Difference(SCRAPY, "tests/test_crawl.py::TestCrawl::test_retry_conn_failed", _RETRY_LINE),
    Difference(SCRAPY, "tests/test_crawl.py::TestCrawl::test_retry_dns_error", _RETRY_LINE),
    Difference(SCRAPY, "tests/test_crawl.py::TestCrawl::test_retry_conn_lost", _RETRY_LINE),
    Difference(SCRAPY, "tests/test_crawl.py::TestCrawl::test_retry_conn_aborted", _RETRY_LINE),
]

# Fixed, no longer listed: the engine-less slot key, the spider argument on 2.13, the crawler-less Redis queue
# (tests/test_retry_modes.py::test_our_retry_middleware_works_on_a_crawler_that_is_not_crawling,
# tests/test_redis_queue.py::test_a_queue_built_from_a_bare_spider_is_a_plain_priority_queue).

# Fixed, no longer listed: parking's spider_closed coroutine dropped by a synchronous send
# (tests/test_spider_crawl.py::TestCrawlSpider::test_closed_signal_call), and the extra spider_idle
# rounds while an absent park file was "read" (tests/test_engine.py::TestSpiderIdle::test_dont_close_spider);
# both in tests/test_scrapy_signal_contracts.py.
INCOMPATIBLE: list[Difference] = []

HARNESS: list[HarnessChange] = [
    HarnessChange(
        SCRAPY + REDIS,
        "only with SCRAPY_RETRYAFTER_COMPAT_NO_PARKING=1 (off by default): RETRY_AFTER_PARKING defaults to False",
        "a debugging switch: the runs counted are with parking on (the park file no longer locks, so later "
        "crawlers of one pytest process run as the first)",
    ),
    HarnessChange(
        SCRAPY + REDIS,
        "park files left in the run's .scrapy/retry_after/ are removed after each test (pytest_compat.py)",
        "parking carries a given-up request to the next run of the same spider name (README: Parking), and "
        "Scrapy's tests reuse spider names ('simple', 'follow') across tests: test_retry_503 parks a 'simple' "
        "request that a later test's crawl would fetch from a mock server that is gone",
    ),
    HarnessChange(
        SCRAPY + REDIS,
        "the release's own scrapy/ (and docs/) directory is removed from the unpacked sdist",
        "the installed release is the one under test; the test files are the sdist's",
    ),
    HarnessChange(
        (S213,),
        "pytest-twisted is not installed",
        "Scrapy 2.13's conftest.py defines --reactor itself; its tox.ini does not install pytest-twisted",
    ),
    HarnessChange(
        SCRAPY + REDIS,
        "PYTHONPATH has the copied sdist's root",
        "the scripts Scrapy's tests run in subprocesses (tests/CrawlerProcess/*.py ...) import tests.*; pytest puts "
        "the root on sys.path only in its own process",
    ),
    HarnessChange(
        REDIS,
        "pytest<8 (scrapy-redis's requirements-tests.txt pins pytest<7)",
        "scrapy-redis 0.9.1's tests use nose-style setup() methods, which pytest 8 no longer calls",
    ),
    HarnessChange(
        REDIS,
        "REDIS_HOST/REDIS_PORT point at a redis-server the script starts on 127.0.0.1",
        "scrapy-redis's tests read them from the environment (default localhost:6379)",
    ),
    HarnessChange(
        (S219,),
        "tests/utils/downloader.py's MockSlot gets a concurrency field (a large number)",
        "a real downloader Slot has concurrency; the package's queue skips full slots, so it reads it. The value "
        "is large so that no mock slot is ever full, as the mock means",
        file="tests/utils/downloader.py",
        old="class MockSlot(NamedTuple):\n    active: list[Any]\n",
        new="class MockSlot(NamedTuple):\n    active: list[Any]\n    concurrency: int = 2**31  # compat harness\n",
    ),
    HarnessChange(
        (S213,),
        "tests/test_scheduler.py's MockSlot gets a concurrency field (a large number)",
        "as for 2.19's MockSlot",
        file="tests/test_scheduler.py",
        old="class MockSlot(NamedTuple):\n    active: list[Any]\n",
        new="class MockSlot(NamedTuple):\n    active: list[Any]\n    concurrency: int = 2**31  # compat harness\n",
    ),
]
