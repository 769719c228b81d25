"""The add-on's wiring, and the one line it says where a project's setting wins."""

from __future__ import annotations

import json
import logging

import pytest
import pytest_twisted
from scrapy.settings import Settings

from scrapy_retryafter import Addon, RetryAfterSettingError

QUEUE = "scrapy_retryafter.CooldownAwarePriorityQueue"


def installed(**project: object) -> Settings:
    settings = Settings()
    settings.setdict(project, priority="project")
    Addon().update_settings(settings)
    return settings


def test_installs_middleware_extension_queue_and_replaces_retry_middleware():
    settings = installed()
    middlewares = settings.getdict("DOWNLOADER_MIDDLEWARES")
    from scrapy.downloadermiddlewares.retry import RetryMiddleware as Stock

    from scrapy_retryafter import RetryAfterExtension, RetryAfterMiddleware, RetryMiddleware

    assert middlewares[RetryAfterMiddleware] == 560
    from scrapy.utils.misc import load_object

    assert [v for k, v in middlewares.items() if load_object(k) is Stock] == [None]
    assert middlewares[RetryMiddleware] == 550
    assert settings.getdict("EXTENSIONS")[RetryAfterExtension] == 500
    assert settings["SCHEDULER_PRIORITY_QUEUE"] == QUEUE
    assert {429, 503} <= {int(c) for c in settings.getlist("HTTPCACHE_IGNORE_HTTP_CODES")}


def test_a_project_priority_for_the_middleware_is_kept():
    settings = installed(DOWNLOADER_MIDDLEWARES={"scrapy_retryafter.RetryAfterMiddleware": 580})
    from scrapy_retryafter import RetryAfterMiddleware

    values = {k: v for k, v in settings.getdict("DOWNLOADER_MIDDLEWARES").items() if k in (RetryAfterMiddleware, "scrapy_retryafter.RetryAfterMiddleware")}
    assert list(values.values()) == [580]


def test_retries_turned_off_by_the_project_stay_off():
    from scrapy.downloadermiddlewares.retry import RetryMiddleware as Stock

    from scrapy_retryafter import RetryMiddleware

    settings = installed(DOWNLOADER_MIDDLEWARES={Stock: None})
    assert RetryMiddleware not in settings.getdict("DOWNLOADER_MIDDLEWARES")


def test_a_project_dapq_setting_is_upgraded_silently(caplog):
    with caplog.at_level(logging.WARNING):
        settings = installed(SCHEDULER_PRIORITY_QUEUE="scrapy.pqueues.DownloaderAwarePriorityQueue")
    assert settings["SCHEDULER_PRIORITY_QUEUE"] == QUEUE
    assert caplog.records == []


@pytest.mark.parametrize(
    "project, says",
    [
        ({"SCHEDULER_PRIORITY_QUEUE": "tests.test_addon.OtherQueue"}, "SCHEDULER_PRIORITY_QUEUE=tests.test_addon.OtherQueue is kept"),
        ({"CONCURRENT_REQUESTS_PER_IP": 2}, "CONCURRENT_REQUESTS_PER_IP is set"),
    ],
)
def test_a_conflicting_project_setting_wins_with_one_line(caplog, project, says):
    with caplog.at_level(logging.WARNING):
        settings = installed(**project)
    assert settings["SCHEDULER_PRIORITY_QUEUE"] != QUEUE
    assert [r.getMessage() for r in caplog.records if says in r.getMessage()]
    assert len(caplog.records) == 1


def test_a_jobdir_made_with_another_queue_is_resumed_with_it(tmp_path, caplog):
    (tmp_path / "requests.queue").mkdir()
    (tmp_path / "requests.queue" / "active.json").write_text(json.dumps([0, -1]))
    with caplog.at_level(logging.WARNING):
        settings = installed(JOBDIR=str(tmp_path))
    assert settings["SCHEDULER_PRIORITY_QUEUE"] != QUEUE
    assert "was made with another SCHEDULER_PRIORITY_QUEUE" in caplog.text


def test_a_jobdir_made_with_dapq_is_resumed_with_the_queue(tmp_path):
    (tmp_path / "requests.queue").mkdir()
    (tmp_path / "requests.queue" / "active.json").write_text(json.dumps({"example.com": [0]}))
    assert installed(JOBDIR=str(tmp_path))["SCHEDULER_PRIORITY_QUEUE"] == QUEUE


def test_invalid_settings_fail_when_the_addon_loads():
    with pytest.raises(RetryAfterSettingError, match="RETRY_AFTER_HTTP_CODES"):
        installed(RETRY_AFTER_HTTP_CODES=[429, 1000])


class OtherQueue:  # only its import path matters here
    pass


@pytest_twisted.ensureDeferred
async def test_one_extension_instance_serves_extensions_middleware_queue_and_live_view(server):
    from scrapy import Request

    from scrapy_retryafter.extension import RetryAfterExtension
    from scrapy_retryafter.logstats import RetryAfterLogStats
    from scrapy_retryafter.middleware import RetryAfterMiddleware

    from .conftest import ADDON, crawl

    host = server.add_host()
    server.start()
    crawler = await crawl([Request(host.url("/"))], ADDON)
    extension = crawler.get_extension(RetryAfterExtension)
    assert extension is RetryAfterExtension.of(crawler)
    assert crawler.get_downloader_middleware(RetryAfterMiddleware).extension is extension
    assert crawler.get_extension(RetryAfterLogStats).extension is extension
    assert len(extension.queues) == 1
