"""A real redis-server on a free loopback port, started by the tests themselves.

CI installs redis-server and the redis package; there (CI=true) a missing
one fails the tests instead of skipping them, so a green CI always means the
fleet was tested.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest


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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """One redis-server process; kill() and start() again on the same port to play an outage."""

    def __init__(self, workdir: Path, appendonly: bool = False) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always",
                "--dir", str(self.workdir), "--daemonize", "no", "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.ping():
                return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.2, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis(port=self.port, decode_responses=True)


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
