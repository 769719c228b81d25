"""The settings guard: each mistake a user makes, and the line they see for it.

Mistakes that only show in a running crawl (a misspelt name, a slot key that
never matches) are checked with real crawls against the throttling server;
the caplog records are the lines Scrapy's log prints.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.settings import KNOWN_SETTINGS, RetryAfterSettingError, load_config
from scrapy_retryafter.settingsguard import unknown_settings, unused_slot_keys
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl

ROOT = Path(__file__).resolve().parents[1]


def guard_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "scrapy_retryafter.settings"]


@pytest_twisted.ensureDeferred
async def test_misspelt_setting_names_get_one_warning_each_naming_the_closest(server, caplog):
    host = server.add_host(HostConfig())
    server.start()
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter"):
        await crawl([Request(host.url("/a")), Request(host.url("/b"))],
                    {**ADDON, "RETRY_AFTER_MAX_RETRY": 8, "RETRY_AFTER_CAP": 60})
    assert guard_lines(caplog) == [
        "Unknown setting RETRY_AFTER_CAP is ignored; did you mean RETRY_AFTER_MAX_DELAY?",
        "Unknown setting RETRY_AFTER_MAX_RETRY is ignored; did you mean RETRY_AFTER_MAX_RETRIES?",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "scrapy_retryafter.settings")


@pytest_twisted.ensureDeferred
async def test_slot_key_no_request_used_gets_one_warning_at_close(server, caplog):
    host = server.add_host(HostConfig())
    server.start()
    slots = {f"http://{host.address}": {"max_retries": 8}, host.address: {"max_retries": 2}}
    with caplog.at_level(logging.WARNING, logger="scrapy_retryafter"):
        await crawl([Request(host.url(f"/{i}")) for i in range(3)], {**ADDON, "RETRY_AFTER_SLOTS": slots})
    assert guard_lines(caplog) == [
        (f"RETRY_AFTER_SLOTS['http://{host.address}'] matched no request's download slot, so its settings "
         f"never applied; a slot is named by its host alone: '{host.address}'")
    ]


def test_a_misspelt_slot_key_is_pointed_at_the_slot_that_was_used():
    config = load_config({"RETRY_AFTER_SLOTS": {"shop.exmaple.com": {}, "unused.org": {}}})
    assert unused_slot_keys(config, ["shop.example.com"]) == [
        ("RETRY_AFTER_SLOTS['shop.exmaple.com'] matched no request's download slot, so its settings never "
         "applied; did you mean 'shop.example.com'?"),
        ("RETRY_AFTER_SLOTS['unused.org'] matched no request's download slot, so its settings never applied; "
         "a slot is named by the request's host, or by its download_slot meta"),
    ]
    assert unused_slot_keys(config, ["shop.exmaple.com", "unused.org"]) == []


@pytest.mark.parametrize("raw", [{"GET": True}, "abc", ["GET", "FETCH"], "GET /x", [1], 5])
def test_server_error_methods_rejects_what_is_not_a_list_of_methods(raw):
    with pytest.raises(RetryAfterSettingError) as error:
        load_config({"RETRY_AFTER_SERVER_ERROR_METHODS": raw})
    assert str(error.value) == (
        "RETRY_AFTER_SERVER_ERROR_METHODS must be a list of HTTP methods ('CONNECT', 'DELETE', 'GET', 'HEAD', "
        f"'OPTIONS', 'PATCH', 'POST', 'PUT', 'TRACE'), e.g. ['GET', 'HEAD']; got {raw!r}"
    )


@pytest.mark.parametrize("name", sorted(KNOWN_SETTINGS - {"RETRY_AFTER_SLOTS"}))
def test_every_setting_refuses_a_value_of_the_wrong_type_naming_itself(name):
    settings = {"RETRY_AFTER_REDIS_URL": "redis://127.0.0.1:1/0", name: {"not": "this"}}
    with pytest.raises(RetryAfterSettingError, match=rf"^{name} must be "):
        load_config(settings)


def test_http_codes_as_a_dict_is_refused():
    with pytest.raises(RetryAfterSettingError, match=r"^RETRY_AFTER_HTTP_CODES must be a non-empty list"):
        load_config({"RETRY_AFTER_HTTP_CODES": {429: "yes"}})


@pytest.mark.parametrize("value", [["GET"], "get, head", [], ("PUT", "DELETE")])
def test_server_error_methods_still_takes_lists_and_strings(value):
    load_config({"RETRY_AFTER_SERVER_ERROR_METHODS": value})


def test_every_setting_name_the_package_mentions_is_known():
    """A setting read anywhere in the package but missing from KNOWN_SETTINGS would be warned about as unknown.

    A branch that adds a setting must add it to settings.py's tables; this
    names the ones it forgot.
    """
    mentioned: dict[str, set[str]] = {}
    for path in sorted((ROOT / "scrapy_retryafter").rglob("*.py")):
        for name in re.findall(r"\bRETRY_AFTER_[A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")):
            mentioned.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    unknown = {name: sorted(paths) for name, paths in mentioned.items() if name not in KNOWN_SETTINGS}
    assert unknown == {}, f"named in the package but not in settings.KNOWN_SETTINGS: {unknown}"
    assert unknown_settings(sorted(KNOWN_SETTINGS)) == []


def test_a_bad_value_is_one_line_before_scrapys_own_traceback(tmp_path):
    """``scrapy crawl`` with a bad value: our line comes first, then Scrapy's traceback, exit 1.

    The traceback ("Task exception was never retrieved" on Scrapy 2.19's
    asyncio crawler process) is printed by Scrapy itself; the manual says so.
    """
    project = tmp_path / "proj"
    (project / "proj" / "spiders").mkdir(parents=True)
    (project / "scrapy.cfg").write_text("[settings]\ndefault = proj.settings\n")
    (project / "proj" / "__init__.py").write_text("")
    (project / "proj" / "settings.py").write_text(textwrap.dedent("""
        SPIDER_MODULES = ["proj.spiders"]
        ADDONS = {"scrapy_retryafter.Addon": 500}
        TELNETCONSOLE_ENABLED = False
    """))
    (project / "proj" / "spiders" / "__init__.py").write_text(
        "import scrapy\n\nclass One(scrapy.Spider):\n    name = 'one'\n    start_urls = ['http://127.0.0.1:9/']\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "one", "-s", "RETRY_AFTER_PAD=0.5"],
        cwd=project, env=env, check=False, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR: " in line or line.startswith("Traceback")]
    assert errors[0].endswith(
        "[scrapy_retryafter.settings] ERROR: RETRY_AFTER_PAD must be a number >= 1.0 "
        "(the server's wait is never shortened); got '0.5'"
    ), result.stderr


@pytest.mark.parametrize(
    "given, message",
    [
        ({"RETRY_AFTER_ROBOTSTXT_OBEY": "maybe"}, r"^RETRY_AFTER_ROBOTSTXT_OBEY must be True or False"),
        ({"RETRY_AFTER_ROBOTSTXT_MAX_DELAY": 0}, r"^RETRY_AFTER_ROBOTSTXT_MAX_DELAY must be a number of seconds > 0"),
        ({"RETRY_AFTER_SLOTS": {"a.example": {"ignore_robots_txt": "yes"}}}, r"\['ignore_robots_txt'\] must be True or False"),
    ],
)
def test_bad_crawl_delay_settings_fail_at_start_naming_the_setting(given, message):
    with pytest.raises(RetryAfterSettingError, match=message):
        load_config(given)


def test_a_slot_may_ignore_its_robots_txt_crawl_delay():
    config = load_config({"RETRY_AFTER_SLOTS": {"a.example": {"ignore_robots_txt": True, "pad": 1.5}}})
    assert config.policy_for("a.example").pad == 1.5
