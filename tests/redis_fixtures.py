"""A real redis-server on a free loopback port, started by the tests themselves.

CI installs redis-server and the redis package; there (CI=true) a missing
one fails the tests instead of skipping them, so a green CI always means the
fleet was tested.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from scrapy_retryafter.testing.redis_server import RedisServer, free_port

__all__ = ["RedisServer", "free_port", "own_redis", "prefix", "redis_server", "require_redis"]


def require_redis() -> None:
    missing = []
    if shutil.which("redis-server") is None:
        missing.append("redis-server (apt-get install redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        missing.append("the redis package (pip install -e '.[test,redis]')")
    if missing:
        message = "Redis tests need " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    require_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture
def own_redis(tmp_path: Path):
    """A redis-server of the test's own, which it may kill and restart."""
    require_redis()
    server = RedisServer(tmp_path, appendonly=True).start()
    yield server
    server.kill()


@pytest.fixture
def prefix() -> str:
    """Keys of one test only, so tests sharing the session's server do not meet."""
    return f"test-{uuid.uuid4().hex[:8]}"
