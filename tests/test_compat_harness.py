"""The compatibility harness's own logic: the import substitution and the verdict on a run."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

COMPAT = Path(__file__).resolve().parent.parent / "compat"
sys.path.insert(0, str(COMPAT))

import check
import differences
import substitute


def test_an_imported_scrapy_class_is_rebound_after_its_import(tmp_path: Path) -> None:
    source = (
        "from scrapy.pqueues import (\n"
        "    DownloaderAwarePriorityQueue,\n"
        "    ScrapyPriorityQueue,\n"
        ")\n"
        "QUEUES = [DownloaderAwarePriorityQueue]\n"
        "def f():\n"
        "    from scrapy.downloadermiddlewares.retry import RetryMiddleware as M\n"
        "    return M\n"
    )
    new, done = substitute.rewrite(source, "scrapy")
    module = tmp_path / "rewritten.py"
    module.write_text(new, encoding="utf-8")
    namespace = runpy.run_path(str(module))

    from scrapy.pqueues import ScrapyPriorityQueue

    from scrapy_retryafter import CooldownAwarePriorityQueue, RetryMiddleware

    assert namespace["QUEUES"] == [CooldownAwarePriorityQueue]
    assert namespace["ScrapyPriorityQueue"] is ScrapyPriorityQueue
    assert namespace["f"]() is RetryMiddleware
    assert len(done) == 2


def test_dotted_paths_in_strings_are_replaced() -> None:
    source = 'S = {"SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue"}\n'
    new, done = substitute.rewrite(source, "scrapy")
    assert "scrapy_retryafter.CooldownAwarePriorityQueue" in new
    assert "DownloaderAwarePriorityQueue" not in new
    assert done


def test_scrapy_redis_names_follow_the_addon() -> None:
    import scrapy_retryafter

    addon = sys.modules[scrapy_retryafter.Addon.__module__]
    new, _ = substitute.rewrite("from scrapy_redis.queue import FifoQueue, PriorityQueue\n", "scrapy-redis")
    module, name = addon._REDIS_QUEUE.rsplit(".", 1)
    assert f"from {module} import {name} as PriorityQueue" in new


def _verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **runs: dict[str, str]) -> tuple[list[str], list[str]]:
    monkeypatch.setattr(
        check, "INTENDED", [differences.Difference(("9.9",), "tests/test_a.py::test_intended", "why")]
    )
    monkeypatch.setattr(
        check, "INCOMPATIBLE", [differences.Difference(("9.9",), "tests/test_a.py::test_known", "cause")]
    )
    for suffix, outcomes in runs.items():
        name = "compat-9.9.json" if suffix == "main" else f"compat-9.9-{suffix}.json"
        (tmp_path / name).write_text(json.dumps(outcomes), encoding="utf-8")
    return check.check(tmp_path, "9.9")


def test_a_run_matching_the_lists_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPAT_ALLOW_KNOWN", raising=False)
    problems, lines = _verdict(
        tmp_path, monkeypatch,
        main={"tests/test_a.py::test_intended": "failed", "tests/test_a.py::test_ok": "passed",
              "tests/test_a.py::test_known": "failed", "tests/test_a.py::test_flaky": "failed",
              "tests/test_a.py::test_env": "failed"},
        rerun={"tests/test_a.py::test_flaky": "passed", "tests/test_a.py::test_env": "failed"},
        stock={"tests/test_a.py::test_env": "failed"},
    )
    monkeypatch.setenv("COMPAT_ALLOW_KNOWN", "1")
    allowed, _ = check.check(tmp_path, "9.9")
    assert allowed == []
    assert problems == ["9.9: tests/test_a.py::test_known fails: known incompatibility, cause"]
    total = lines[-1].split()
    # passed, FAILED, incompatible, intended, as released, rerun passed, skipped
    assert total[1:] == ["1", "0", "1", "1", "1", "1", "0"]


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ({"tests/test_a.py::test_new": "failed"}, "fails and is not in"),
        ({"tests/test_a.py::test_intended": "passed"}, "but passes: take it off"),
        ({"tests/test_a.py::test_known": "passed"}, "but passes: take it off"),
        ({"tests/test_a.py::test_intended": "failed"}, "test_known is listed but did not run"),
        ({"tests/test_a.py::test_new": "xpassed"}, "fails and is not in"),
    ],
)
def test_a_run_off_the_lists_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcomes: dict[str, str], expected: str
) -> None:
    monkeypatch.setenv("COMPAT_ALLOW_KNOWN", "1")
    problems, _ = _verdict(tmp_path, monkeypatch, main=outcomes)
    assert any(expected in problem for problem in problems), problems


def test_no_results_is_a_problem(tmp_path: Path) -> None:
    problems, _ = check.check(tmp_path, "9.9")
    assert problems and "did not finish" in problems[0]


def test_every_listed_entry_names_a_suite_and_a_test_and_says_why() -> None:
    known_suites = {differences.S213, differences.S219, "scrapy-redis"}
    entries = differences.INTENDED + differences.INCOMPATIBLE
    for entry in entries:
        assert set(entry.suites) <= known_suites and entry.suites
        assert entry.test.startswith("tests/test_") and "::" in entry.test
        assert len(entry.why) > 40
    keys = [(suite, entry.test) for entry in entries for suite in entry.suites]
    assert len(keys) == len(set(keys)), "a test is listed twice"
    for change in differences.HARNESS:
        assert change.why and change.what
        assert bool(change.old) == bool(change.new) == bool(change.file)


def test_only_unlisted_failures_are_run_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _verdict(
        tmp_path, monkeypatch,
        main={"tests/test_a.py::test_intended": "failed", "tests/test_a.py::test_known": "failed",
              "tests/test_a.py::test_ok": "passed", "tests/test_a.py::test_new": "failed",
              "tests/test_a.py::test_flaky": "failed", "tests/test_a.py": "failed"},
    )
    assert check.unexpected(tmp_path, "9.9") == [
        "tests/test_a.py::test_flaky", "tests/test_a.py::test_new"
    ]
    (tmp_path / "compat-9.9-rerun.json").write_text(json.dumps({"tests/test_a.py::test_flaky": "passed"}))
    assert check.unexpected(tmp_path, "9.9") == ["tests/test_a.py::test_new"]
    (tmp_path / "compat-9.9.json").write_text(json.dumps({"tests/test_a.py::test_ok": "passed"}))
    assert check.unexpected(tmp_path, "9.9") == []
