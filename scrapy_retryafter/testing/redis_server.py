"""A real redis-server on a free loopback port, for the tests and bench/fleet.py.

kill() and start() again on the same port play an outage; with AOF on, the
data outlives it.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["RedisServer", "free_port"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """One redis-server process; kill() and start() again on the same port to play an outage."""

    def __init__(self, workdir: Path, appendonly: bool = False, password: str | None = None) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.appendonly = appendonly
        self.password = password
        """requirepass: clients must authenticate (the secret-masking tests)."""
        self.socket = Path(tempfile.mkdtemp(prefix="redis-")) / "sock"
        """A short path: a unix socket's may not pass 107 bytes (the test's own directory may)."""
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
                "--unixsocket", str(self.socket), "--unixsocketperm", "700",
                *(["--requirepass", self.password] if self.password else []),
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
            client = redis.Redis(port=self.port, password=self.password, socket_timeout=0.2, socket_connect_timeout=0.2)
            return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self) -> Any:
        import redis

        return redis.Redis(port=self.port, password=self.password, decode_responses=True)
