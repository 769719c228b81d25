"""No password of the Redis URL or REDIS_PARAMS in any log line or error message, in every form."""

from __future__ import annotations

import logging
import time

import pytest
from scrapy.utils.test import get_crawler

from scrapy_retryafter.extension import RetryAfterExtension
from scrapy_retryafter.redis.board import RedisBoard, RedisBoardUnavailable
from scrapy_retryafter.redisconfig import RedisConfig
from scrapy_retryafter.settings import RetryAfterSettingError, load_config

from .redis_fixtures import RedisServer, free_port, require_redis

SECRET = "s3cr3t-Pa55"


def forms(server: RedisServer) -> dict[str, tuple[str, dict]]:
    port = server.port
    return {
        "userinfo without a user": (f"redis://:{SECRET}@127.0.0.1:{port}/0", {}),
        "userinfo with a user": (f"redis://default:{SECRET}@127.0.0.1:{port}/0", {}),
        "query": (f"redis://127.0.0.1:{port}/0?password={SECRET}", {}),
        "unix socket query": (f"unix://{server.socket}?db=0&password={SECRET}", {}),
        "REDIS_PARAMS": (f"redis://127.0.0.1:{port}/0", {"password": SECRET}),
    }


FORMS = ["userinfo without a user", "userinfo with a user", "query", "unix socket query", "REDIS_PARAMS"]


@pytest.fixture
def locked_redis(tmp_path):
    require_redis()
    server = RedisServer(tmp_path, password=SECRET).start()
    yield server
    server.kill()


@pytest.mark.parametrize("form", FORMS)
def test_no_password_in_the_start_line_the_lost_and_back_warnings(locked_redis, caplog, form):
    url, params = forms(locked_redis)[form]
    caplog.set_level(logging.INFO)
    crawler = get_crawler(settings_dict={
        "RETRY_AFTER_REDIS_URL": url, "REDIS_PARAMS": params, "RETRY_AFTER_REDIS_PREFIX": f"secret-{time.time_ns()}",
        "RETRY_AFTER_PARKING": False,  # nothing to park, and no park file in the checkout
    })
    crawler.engine = None  # no crawl: nothing in a downloader to send back on a cooldown heard of
    extension = RetryAfterExtension.from_crawler(crawler)
    board = extension.board
    assert isinstance(board, RedisBoard)
    try:
        assert board.sync(), "the password form must work, or the test proves nothing"
        locked_redis.kill()
        board.cool("shop.example", 30.0)
        assert not board.sync()
        locked_redis.start()
        deadline = time.monotonic() + 10
        while board.lost and time.monotonic() < deadline:
            board.tick()
            time.sleep(0.05)
        assert not board.lost
    finally:
        board.stop()
    messages = [record.getMessage() for record in caplog.records]
    assert any("Sharing cooldowns through the Redis board" in line for line in messages)
    assert any("unreachable" in line for line in messages) and any("is back" in line for line in messages)
    assert not [line for line in messages if SECRET in line]


@pytest.mark.parametrize("form", FORMS)
def test_no_password_in_the_unreachable_error(tmp_path, form):
    require_redis()
    dead = RedisServer(tmp_path)  # never started: nothing listens on its port or socket
    url, params = forms(dead)[form]
    with pytest.raises(RedisBoardUnavailable) as error:
        RedisBoard(RedisConfig(url=url, params=params)).connect()
    assert "unreachable" in str(error.value)
    assert SECRET not in str(error.value) and SECRET not in repr(error.value)
    assert error.value.__cause__ is None or SECRET not in str(error.value.__cause__)


def test_a_wrong_password_is_reported_without_it(locked_redis):
    url = f"redis://:wrong-{SECRET}@127.0.0.1:{locked_redis.port}/0"
    with pytest.raises(RedisBoardUnavailable) as error:
        RedisBoard(RedisConfig(url=url, params={})).connect()
    assert SECRET not in str(error.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@h:1/0", "redis://***@h:1/0"),
        (f"redis://user:{SECRET}@h:1/0", "redis://user:***@h:1/0"),
        (f"redis://{SECRET}@h:1/0", "redis://***@h:1/0"),
        (f"rediss://h:1/0?password={SECRET}&db=2", "rediss://h:1/0?password=***&db=2"),
        (f"unix:///run/redis.sock?db=1&password={SECRET}", "unix:///run/redis.sock?db=1&password=***"),
        (f"redis://u:{SECRET.replace('-', '%2D')}@h/0", "redis://u:***@h/0"),
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_the_url_shown_has_no_password(url, shown):
    config = RedisConfig(url=url, params={})
    assert config.safe_url == shown
    assert SECRET not in repr(config)


def test_a_password_in_an_error_text_is_masked_in_every_spelling():
    config = RedisConfig(url=f"redis://u:{SECRET.replace('-', '%2D')}@h/0?token=tok-{SECRET}",
                         params={"password": "params-pass"})
    text = f"failed with {SECRET}, tok-{SECRET}, params-pass and {SECRET.replace('-', '%2D')}"
    scrubbed = config.scrub(text)
    assert SECRET not in scrubbed and "params-pass" not in scrubbed and "%2D" not in scrubbed


def test_a_bad_url_setting_is_reported_without_its_password():
    with pytest.raises(RetryAfterSettingError) as error:
        load_config({"RETRY_AFTER_REDIS_URL": f"http://:{SECRET}@127.0.0.1:{free_port()}/0"})
    assert "RETRY_AFTER_REDIS_URL" in str(error.value) and SECRET not in str(error.value)
    with pytest.raises(RetryAfterSettingError) as error:
        load_config({"RETRY_AFTER_REDIS_URL": "redis://h/0", "REDIS_PARAMS": f"password={SECRET}"})
    assert "REDIS_PARAMS" in str(error.value) and SECRET not in str(error.value)
