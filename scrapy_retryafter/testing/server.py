"""A throttling HTTP server on loopback, for tests, the example and benchmarks.

Each host listens on its own 127.0.0.x address (Scrapy keys download slots by
host name, so distinct addresses are distinct slots) on a free port. A host
limits with a token bucket, rejects with 429 or 503, announces Retry-After
in any form (seconds, HTTP-date, absent, garbage, or a literal) and can
punish hits inside a penalty the way real limiters do. It can also fail the
first attempts of each URL in the ways Scrapy retries: a reset connection, no
answer at all (a timeout), or any status such as 502, 500 or 404. Every arrival is
logged with its time, so tests assert on what the server saw.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Protocol, cast

from twisted.internet import defer
from twisted.web import resource, server


class _Reactor(Protocol):
    """What the server uses of the reactor (its zope interfaces do not type-check without a plugin)."""

    def callLater(self, delay: float, callable: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any: ...

    def run(self) -> None: ...


def _reactor() -> _Reactor:
    """The installed reactor, typed: imported at first use so that importing this module installs none."""
    from twisted.internet import reactor

    return cast("_Reactor", reactor)

__all__ = ["Arrival", "HostConfig", "ThrottlingServer", "Host"]


@dataclass
class HostConfig:
    """How one host limits. The defaults serve everything at once."""

    rate: float | None = None
    """Requests per second the token bucket refills; None means no limit."""
    burst: float = 1.0
    status: int = 429
    retry_after: str = "seconds"
    """"seconds", "date", "absent", "garbage", or any other text sent as is."""
    penalty: float = 1.0
    """Seconds the host refuses everything after a rejection (announced in
    Retry-After); 0 rejects only while the bucket is empty."""
    extend_on_hit: bool = False
    """A request inside the penalty restarts it (the reference's ladder)."""
    reject_first: int = 0
    """The first N requests are rejected whatever the bucket says."""
    latency: float = 0.0
    clock_skew: float = 0.0
    """Seconds added to the server's own Date (and HTTP-date Retry-After)."""
    outage: tuple[float, float] | None = None
    """(start, end) seconds after the server started: answer `status` without
    Retry-After to everything in between."""
    windows: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) seconds after the host's first request: throttle everything in
    between, announcing the time left in Retry-After (from the first request, not
    the server's start, so a crawl slow to start on a busy machine meets them too)."""
    gzip: bool = False
    """Send bodies gzip-encoded (Scrapy's HttpCompressionMiddleware then replaces the response)."""
    window: float | None = None
    """Limit with fixed windows of this many seconds (quota rate x window)
    instead of a token bucket."""
    fail_first: int = 0
    """The first N attempts of each path fail as `failure` says (before any limiting)."""
    failure: str = "502"
    """"reset" (abort the connection), "timeout" (never answer), or a status code."""
    keep_alive: bool = True
    """False answers with Connection: close, so every attempt opens a new
    connection (Twisted's pool silently repeats a GET once when a reused
    connection fails, which would hide an attempt from the crawler)."""
    ratelimit: str | None = None
    """Announce the limit on every response: "ietf" (RateLimit and
    RateLimit-Policy), "draft" (RateLimit-Limit/-Remaining/-Reset), "x"
    (X-RateLimit-* with a delta reset) or "x-epoch" (with an epoch reset)."""


@dataclass
class Arrival:
    t: float
    host: str
    method: str
    path: str
    status: int
    """0 when no status was sent (see `failure`)."""
    headers: dict[str, str] = field(default_factory=dict)
    failure: str | None = None
    """"reset" or "timeout" when the attempt was failed without an answer."""
    retry_after: str | None = None
    """The Retry-After the server answered with."""


class Host:
    """One limited host; its state changes only inside the reactor thread."""

    def __init__(self, server: ThrottlingServer, address: str, config: HostConfig) -> None:
        self.server = server
        self.address = address
        self.config = config
        self.port: int | None = None
        self.tokens = config.burst
        self.refilled = server.clock()
        self.penalty_until = 0.0
        self.seen = 0
        self.first_seen: float | None = None
        self.window_start = self.refilled
        self.window_used = 0
        self.attempts: dict[str, int] = {}
        self.refusing = False

    def failure_for(self, path: str) -> str | None:
        """How this attempt at ``path`` fails, or None to serve it as usual."""
        count = self.attempts.get(path, 0) + 1
        self.attempts[path] = count
        return self.config.failure if count <= self.config.fail_first else None

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + path

    def set_rate(self, rate: float | None) -> None:
        self._refill(self.server.clock())
        self.config.rate = rate

    def _refill(self, now: float) -> None:
        if self.config.rate is not None:
            self.tokens = min(self.config.burst, self.tokens + (now - self.refilled) * self.config.rate)
        self.refilled = now

    def admit(self, now: float) -> tuple[int, float | None]:
        """(status, seconds to announce in Retry-After or None)."""
        config = self.config
        self.seen += 1
        self._refill(now)
        if config.outage is not None:
            start, end = config.outage
            if start <= now - self.server.started < end:
                return config.status, None
        if self.first_seen is None:
            self.first_seen = now
        for start, end in config.windows:
            if start <= now - self.first_seen < end:
                return config.status, end - (now - self.first_seen)
        if now < self.penalty_until:
            if config.extend_on_hit:
                self.penalty_until = now + config.penalty
            return config.status, self.penalty_until - now
        limited = config.rate is not None and self.tokens < 1.0
        if config.window is not None and config.rate is not None:
            if now - self.window_start >= config.window:
                self.window_start += (now - self.window_start) // config.window * config.window
                self.window_used = 0
            limited = self.window_used >= self.quota
        if self.seen <= config.reject_first or limited:
            if config.penalty > 0:
                self.penalty_until = now + config.penalty
                return config.status, config.penalty
            wait = (1.0 - self.tokens) / config.rate if config.rate else 1.0
            return config.status, wait
        if config.rate is not None:
            self.tokens -= 1.0
            self.window_used += 1
        return 200, None

    @property
    def quota(self) -> int:
        assert self.config.rate is not None
        return max(1, round(self.config.rate * (self.config.window or 1.0)))

    def ratelimit_headers(self, now: float, wall: float) -> dict[str, str]:
        """The limit as announced in the configured dialect."""
        config = self.config
        if config.ratelimit is None or config.rate is None:
            return {}
        window = config.window or 1.0
        if config.window is not None:
            remaining = max(0, self.quota - self.window_used)
            reset = self.window_start + config.window - now
        else:
            remaining = max(0, math.floor(self.tokens))
            reset = (1.0 - self.tokens) / config.rate if self.tokens < 1 else 0.0
        reset = max(reset, self.penalty_until - now, 0.0)
        whole = math.ceil(reset)
        if config.ratelimit == "ietf":
            return {
                "RateLimit-Policy": f'"default";q={self.quota};w={window:g}',
                "RateLimit": f'"default";r={remaining};t={whole}',
            }
        if config.ratelimit == "draft":
            return {"RateLimit-Limit": f"{self.quota}, {self.quota};w={window:g}",
                    "RateLimit-Remaining": str(remaining), "RateLimit-Reset": str(whole)}
        if config.ratelimit == "x":
            return {"X-RateLimit-Limit": str(self.quota), "X-RateLimit-Remaining": str(remaining),
                    "X-RateLimit-Reset-After": f"{reset:.3f}"}
        if config.ratelimit == "x-epoch":
            return {"X-RateLimit-Limit": str(self.quota), "X-RateLimit-Remaining": str(remaining),
                    "X-RateLimit-Reset": str(math.ceil(wall + reset))}
        raise ValueError(f"unknown ratelimit dialect {config.ratelimit!r}")

    def retry_after_header(self, wait: float | None, wall: float) -> str | None:
        mode = self.config.retry_after
        if wait is None or mode == "absent":
            return None
        seconds = max(1, math.ceil(wait - 1e-9))
        if mode == "seconds":
            return str(seconds)
        if mode == "date":
            return formatdate(math.floor(wall) + seconds, usegmt=True)
        if mode == "garbage":
            return "soon, maybe"
        return mode


class _Resource(resource.Resource):
    isLeaf = True

    def __init__(self, host: Host) -> None:
        super().__init__()
        self.host = host

    def render(self, request: Any) -> Any:
        host = self.host
        srv = host.server
        now = srv.clock()
        path = request.uri.decode("latin-1")
        headers = {
            key.decode("latin-1").lower(): values[0].decode("latin-1")
            for key, values in request.requestHeaders.getAllRawHeaders()
        }
        failure = host.failure_for(path)
        if failure in ("reset", "timeout"):
            srv.log.append(Arrival(now, host.address, request.method.decode(), path, 0, headers, failure))
            if failure == "reset":
                request.transport.abortConnection()
            return server.NOT_DONE_YET
        if failure is not None:
            status, wait = int(failure), None
        else:
            status, wait = host.admit(now)
        wall = time.time() + host.config.clock_skew
        value = host.retry_after_header(wait, wall)
        srv.log.append(Arrival(now, host.address, request.method.decode(), path, status, headers, retry_after=value))
        request.setResponseCode(status)
        request.setHeader(b"Date", formatdate(math.floor(wall), usegmt=True).encode())
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        if not host.config.keep_alive:
            request.setHeader(b"Connection", b"close")
        if value is not None:
            request.setHeader(b"Retry-After", value.encode("latin-1"))
        for name, text in host.ratelimit_headers(now, wall).items():
            request.setHeader(name.encode(), text.encode())
        body = srv.page(host, path, status).encode()
        if host.config.gzip:
            import gzip

            body = gzip.compress(body)
            request.setHeader(b"Content-Encoding", b"gzip")
        if host.config.latency <= 0:
            return body

        def finish() -> None:
            if not request.finished and not getattr(request, "_disconnected", False):
                request.write(body)
                request.finish()

        _reactor().callLater(host.config.latency, finish)
        return server.NOT_DONE_YET


def default_page(host: Host, path: str, status: int) -> str:
    if status != 200:
        return f"<html><body>{status}</body></html>"
    return f"<html><body><h1>{host.address}{path}</h1></body></html>"


class ThrottlingServer:
    """Several limited hosts on loopback, started and stopped together."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        page: Callable[[Host, str, int], str] = default_page,
    ) -> None:
        self.clock = clock
        self.page = page
        self.hosts: list[Host] = []
        self.log: list[Arrival] = []
        self.started = clock()
        self._ports: list[Any] = []

    def add_host(self, config: HostConfig | None = None, address: str | None = None) -> Host:
        address = address or f"127.0.0.{len(self.hosts) + 2}"
        host = Host(self, address, config or HostConfig())
        self.hosts.append(host)
        return host

    def add_refusing_host(self, config: HostConfig | None = None, address: str | None = None) -> Host:
        """A host whose port refuses connections until ``open(host)``."""
        import socket

        host = self.add_host(config, address)
        with socket.socket() as probe:
            probe.bind((host.address, 0))
            host.port = probe.getsockname()[1]
        host.refusing = True
        return host

    def open(self, host: Host) -> None:
        """Start listening for a refusing host, on the port it refused on."""
        host.refusing = False
        self._listen(host, host.port or 0)

    def _listen(self, host: Host, port_number: int) -> None:
        site = server.Site(_Resource(host))
        site.noisy = False
        port = _reactor().listenTCP(port_number, site, interface=host.address)
        host.port = port.getHost().port
        self._ports.append(port)

    def start(self) -> ThrottlingServer:
        self.started = self.clock()
        for host in self.hosts:
            if host.port is None:
                self._listen(host, 0)
        return self

    def stop(self) -> defer.Deferred[Any]:
        ports, self._ports = self._ports, []
        return defer.gatherResults([defer.maybeDeferred(port.stopListening) for port in ports])

    def arrivals(self, host: Host | str | None = None, status: int | None = None) -> list[Arrival]:
        address = host.address if isinstance(host, Host) else host
        return [
            arrival
            for arrival in self.log
            if (address is None or arrival.host == address) and (status is None or arrival.status == status)
        ]


def main(argv: list[str] | None = None) -> None:
    """Serve hosts from the command line until stopped (for crawls in another process).

        python -m scrapy_retryafter.testing.server '{"reject_first": 1, "penalty": 2}' ...

    Prints one base URL per host, then one JSON line per arrival (unless the
    first argument is --quiet).
    """
    import json
    import sys

    reactor = _reactor()
    args = sys.argv[1:] if argv is None else argv
    quiet = bool(args) and args[0] == "--quiet"
    args = args[1:] if quiet else args
    srv = ThrottlingServer()
    hosts = [srv.add_host(HostConfig(**json.loads(arg))) for arg in args or ["{}"]]
    srv.start()
    for host in hosts:
        print(host.base_url, flush=True)
    printed = 0

    def flush() -> None:
        if quiet:
            return
        nonlocal printed
        for arrival in srv.log[printed:]:
            print(json.dumps({"t": arrival.t, "host": arrival.host, "path": arrival.path, "status": arrival.status}), flush=True)
        printed = len(srv.log)
        reactor.callLater(0.05, flush)

    flush()
    reactor.run()


if __name__ == "__main__":
    main()
