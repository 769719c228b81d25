"""A loopback HTTP server that limits by what real servers limit by, for scope tests.

The plain throttling server (`server.py`) limits a whole host. Real servers
limit per API key, per endpoint, per client address; they answer a 200
CAPTCHA page instead of a 429; their robots.txt asks a Crawl-delay. Each
host here has any of:

- ``limit``: a token bucket for the host's requests that no ``paths`` rule takes;
- ``paths``: a bucket per path prefix (``/search`` at 1 r/s beside the rest at 20 r/s);
- ``key_header`` + ``key_limit``: a bucket per value of a header (an API key),
  ``key_limits`` for a key with its own;
- ``client_limit``: a bucket per client address (so per proxy exit), ``client_limits`` likewise;
- ``captcha``: a 200 CAPTCHA page to every request until a wait has passed;
- ``robots_txt``: served at /robots.txt, never limited.

A request must find a token in every bucket that applies to it; a refusal
names the buckets that refused (``Arrival.limited_by``). Every arrival is
logged with its time, client address and outcome.

`LoopbackProxy` is a small forward HTTP proxy on a 127.0.0.x address that
connects out from that same address, so a server limiting per client address
sees each proxy as its own client. It forwards only to 127.0.0.0/8.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import urlsplit

from twisted.internet import defer
from twisted.web import http, resource, server
from twisted.web.proxy import ProxyClientFactory

from .server import Arrival

__all__ = [
    "CAPTCHA_PAGE",
    "Captcha",
    "Limit",
    "LoopbackProxy",
    "ScopedArrival",
    "ScopedHost",
    "ScopedHostConfig",
    "ScopedServer",
]

CAPTCHA_PAGE = (
    "<html><head><title>Please solve this CAPTCHA</title></head>"
    '<body><form id="captcha" action="/verify"><img src="/captcha.png"><input name="answer"></form></body></html>'
)
_MAX_BUCKETS = 10_000
"""Per-key and per-client buckets kept per host; past it the oldest goes (a test server, still bounded)."""


@dataclass
class Limit:
    rate: float
    """Requests per second the bucket refills."""
    burst: float = 1.0
    penalty: float = 0.0
    """> 0: after a refusal the bucket refuses everything this long (announced);
    0: a refusal announces the time until the next token."""
    status: int = 429


@dataclass
class Captcha:
    after: int = 0
    """Requests served normally before the CAPTCHA starts."""
    wait: float = 2.0
    """Seconds from the first CAPTCHA page until pages are real again."""
    extend_on_hit: bool = False
    """A request during the wait restarts it."""
    retry_after: bool = False
    """Announce the time left in Retry-After (a 200 with Retry-After)."""
    status: int = 200


@dataclass
class ScopedHostConfig:
    limit: Limit | None = None
    paths: dict[str, Limit] = field(default_factory=dict)
    """Path prefix -> its own bucket; the longest matching prefix wins. ``/search`` takes
    ``/search``, ``/search?q=1`` and ``/search/x``, not ``/searchable``."""
    key_header: str | None = None
    key_limit: Limit | None = None
    key_limits: dict[str, Limit] = field(default_factory=dict)
    """A header value -> its own limit instead of ``key_limit`` (a key on a smaller plan)."""
    client_limit: Limit | None = None
    client_limits: dict[str, Limit] = field(default_factory=dict)
    """A client address -> its own limit instead of ``client_limit``."""
    captcha: Captcha | None = None
    robots_txt: str | None = None
    latency: float = 0.0


@dataclass
class ScopedArrival(Arrival):
    client: str = ""
    """The client's address: a proxy's, when the request came through one."""
    limited_by: tuple[str, ...] = ()
    """The buckets that refused: "host", "path:/search", "key", "client"."""
    captcha: bool = False


class _Bucket:
    def __init__(self, limit: Limit, now: float) -> None:
        self.limit = limit
        self.tokens = limit.burst
        self.refilled = now
        self.penalty_until = 0.0

    def wait(self, now: float) -> float:
        """Seconds until this bucket admits a request; 0 when it does now."""
        self.tokens = min(self.limit.burst, self.tokens + (now - self.refilled) * self.limit.rate)
        self.refilled = now
        if now < self.penalty_until:
            return self.penalty_until - now
        return 0.0 if self.tokens >= 1.0 - 1e-9 else (1.0 - self.tokens) / self.limit.rate

    def refuse(self, now: float, wait: float) -> float:
        if now < self.penalty_until:
            return self.penalty_until - now
        if self.limit.penalty > 0:
            self.penalty_until = now + self.limit.penalty
            return self.limit.penalty
        return wait


class ScopedHost:
    def __init__(self, server: ScopedServer, address: str, config: ScopedHostConfig) -> None:
        self.server = server
        self.address = address
        self.config = config
        self.port: int | None = None
        now = server.clock()
        self._host = _Bucket(config.limit, now) if config.limit else None
        self._paths = {
            prefix: _Bucket(limit, now) for prefix, limit in sorted(config.paths.items(), key=lambda i: -len(i[0]))
        }
        self._keys: dict[str, _Bucket] = {}
        self._clients: dict[str, _Bucket] = {}
        self.seen = 0
        self.captcha_until: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + path

    def _path_bucket(self, path: str) -> tuple[str, _Bucket] | None:
        path = urlsplit(path).path or "/"
        for prefix, bucket in self._paths.items():
            if path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
                return f"path:{prefix}", bucket
        return None

    @staticmethod
    def _bucket(buckets: dict[str, _Bucket], name: str, limit: Limit, now: float) -> _Bucket:
        bucket = buckets.get(name)
        if bucket is None:
            if len(buckets) >= _MAX_BUCKETS:
                del buckets[next(iter(buckets))]
            bucket = buckets[name] = _Bucket(limit, now)
        return bucket

    def admit(self, now: float, path: str, headers: dict[str, str], client: str) -> tuple[int, float | None, tuple[str, ...], bool]:
        """(status, seconds to announce or None, buckets that refused, CAPTCHA page)."""
        config = self.config
        self.seen += 1
        captcha = config.captcha
        if captcha is not None and self.seen > captcha.after:
            if self.captcha_until is None:
                self.captcha_until = now + captcha.wait
            if now < self.captcha_until:
                if captcha.extend_on_hit:
                    self.captcha_until = now + captcha.wait
                return captcha.status, (self.captcha_until - now) if captcha.retry_after else None, (), True
        applying: list[tuple[str, _Bucket]] = []
        by_path = self._path_bucket(path)
        if by_path is not None:
            applying.append(by_path)
        elif self._host is not None:
            applying.append(("host", self._host))
        if config.key_header and (config.key_limit or config.key_limits):
            key = headers.get(config.key_header.lower(), "")
            limit = config.key_limits.get(key, config.key_limit)
            if limit is not None:
                applying.append(("key", self._bucket(self._keys, key, limit, now)))
        limit = config.client_limits.get(client, config.client_limit)
        if limit is not None:
            applying.append(("client", self._bucket(self._clients, client, limit, now)))
        waits = [(name, bucket, bucket.wait(now)) for name, bucket in applying]
        refused = [(name, bucket, wait) for name, bucket, wait in waits if wait > 0]
        if refused:
            announced = max(bucket.refuse(now, wait) for _, bucket, wait in refused)
            return refused[0][1].limit.status, announced, tuple(name for name, _, _ in refused), False
        for _, bucket in applying:
            bucket.tokens -= 1.0
        return 200, None, (), False


class _Resource(resource.Resource):
    isLeaf = True

    def __init__(self, host: ScopedHost) -> None:
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
        client = request.getClientAddress().host
        method = request.method.decode()
        wall = time.time()
        request.setHeader(b"Date", formatdate(math.floor(wall), usegmt=True).encode())
        if path == "/robots.txt" and host.config.robots_txt is not None:
            srv.log.append(ScopedArrival(now, host.address, method, path, 200, headers, client=client))
            request.setHeader(b"Content-Type", b"text/plain")
            return host.config.robots_txt.encode()
        status, wait, limited_by, captcha = host.admit(now, path, headers, client)
        retry_after = None if wait is None else str(max(1, math.ceil(wait - 1e-9)))
        srv.log.append(
            ScopedArrival(now, host.address, method, path, status, headers, retry_after=retry_after,
                          client=client, limited_by=limited_by, captcha=captcha)
        )
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        if retry_after is not None:
            request.setHeader(b"Retry-After", retry_after.encode())
        if captcha:
            body = CAPTCHA_PAGE
        elif status == 200:
            body = f"<html><body><h1>{host.address}{path}</h1></body></html>"
        else:
            body = f"<html><body>{status}</body></html>"
        data = body.encode()
        if host.config.latency <= 0:
            return data

        def finish() -> None:
            if not request.finished and not getattr(request, "_disconnected", False):
                request.write(data)
                request.finish()

        from twisted.internet import reactor as _reactor

        reactor: Any = _reactor

        reactor.callLater(host.config.latency, finish)
        return server.NOT_DONE_YET


class ScopedServer:
    """Hosts on 127.0.0.x, started and stopped together; ``log`` holds every arrival."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.hosts: list[ScopedHost] = []
        self.log: list[ScopedArrival] = []
        self._ports: list[Any] = []

    def add_host(self, config: ScopedHostConfig | None = None, address: str | None = None) -> ScopedHost:
        address = address or f"127.0.0.{len(self.hosts) + 2}"
        _loopback(address)
        host = ScopedHost(self, address, config or ScopedHostConfig())
        self.hosts.append(host)
        return host

    def start(self) -> ScopedServer:
        from twisted.internet import reactor as _reactor

        reactor: Any = _reactor

        for host in self.hosts:
            if host.port is None:
                site = server.Site(_Resource(host))
                site.noisy = False
                port = reactor.listenTCP(0, site, interface=host.address)
                host.port = port.getHost().port
                self._ports.append(port)
        return self

    def stop(self) -> defer.Deferred[Any]:
        ports, self._ports = self._ports, []
        return defer.gatherResults([defer.maybeDeferred(port.stopListening) for port in ports])

    def arrivals(
        self,
        host: ScopedHost | None = None,
        *,
        status: int | None = None,
        path: str | None = None,
        client: str | None = None,
        header: tuple[str, str] | None = None,
    ) -> list[ScopedArrival]:
        """Arrivals filtered by host, status, path prefix, client address and a header's value."""
        return [
            a
            for a in self.log
            if (host is None or a.host == host.address)
            and (status is None or a.status == status)
            and (path is None or a.path.startswith(path))
            and (client is None or a.client == client)
            and (header is None or a.headers.get(header[0].lower()) == header[1])
        ]


def _loopback(address: str) -> None:
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"{address} is not a loopback address (127.0.0.0/8): tests stay on this machine")


class _ForwardRequest(http.Request):
    """One proxied request: absolute-form target, forwarded from the proxy's own address."""

    def process(self) -> None:
        proxy: LoopbackProxy = self.channel.factory.proxy
        try:
            target = urlsplit(self.uri.decode("ascii"))
            host, port = target.hostname or "", target.port or 80
            allowed = target.scheme == "http" and ipaddress.ip_address(host).is_loopback
        except (UnicodeDecodeError, ValueError):
            allowed = False
        if not allowed:
            self.setResponseCode(403)
            self.write(b"this proxy forwards plain http to 127.0.0.0/8 only")
            self.finish()
            return
        proxy.forwarded.append((proxy.clock(), self.uri.decode("ascii")))
        rest = (target.path or "/") + (f"?{target.query}" if target.query else "")
        headers = {
            key.lower(): values[0]
            for key, values in self.requestHeaders.getAllRawHeaders()
            if key.lower() not in (b"proxy-authorization", b"proxy-connection")
        }
        headers[b"host"] = target.netloc.encode("ascii")
        assert self.content is not None
        self.content.seek(0, 0)
        factory = ProxyClientFactory(self.method, rest.encode("ascii"), self.clientproto, headers, self.content.read(), self)
        from twisted.internet import reactor as _reactor

        reactor: Any = _reactor

        reactor.connectTCP(host, port, factory, bindAddress=(proxy.address, 0))


class _ProxyChannel(http.HTTPChannel):
    requestFactory = _ForwardRequest


class LoopbackProxy:
    """A forward HTTP proxy on ``address`` (127.0.0.x) that connects out from ``address`` too."""

    def __init__(self, address: str, clock: Callable[[], float] = time.monotonic) -> None:
        _loopback(address)
        self.address = address
        self.clock = clock
        self.port: int | None = None
        self.forwarded: list[tuple[float, str]] = []
        """(time, absolute URL) of every request forwarded."""
        self._listening: Any = None

    @property
    def url(self) -> str:
        """The proxy for ``request.meta["proxy"]``."""
        return f"http://{self.address}:{self.port}"

    def start(self) -> LoopbackProxy:
        from twisted.internet import reactor as _reactor

        reactor: Any = _reactor

        factory = http.HTTPFactory()
        factory.protocol = _ProxyChannel  # type: ignore[assignment]
        factory.proxy = self  # type: ignore[attr-defined]
        factory.noisy = False
        self._listening = reactor.listenTCP(0, factory, interface=self.address)
        self.port = self._listening.getHost().port
        return self

    def stop(self) -> defer.Deferred[Any]:
        listening, self._listening = self._listening, None
        return defer.maybeDeferred(listening.stopListening) if listening is not None else defer.succeed(None)
