"""The shared frontier's Redis connection within one crawl, and what to do while it is lost.

scrapy-redis calls its queue and dupefilter on the crawl's own thread, so a
call to a dead Redis must fail fast and not be made again on every request:
the link gives them a client with no retries inside a call and a socket
timeout of RETRY_AFTER_REDIS_TIMEOUT, and one Outage (backoff between
attempts) for both. While Redis is unreachable each of them keeps locally
what it could not write (requests to push, fingerprints to add); the first
call that gets through writes those first, in order, then its own.
"""

from __future__ import annotations

import logging
import random
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from .outage import Outage

__all__ = ["FrontierLink", "FrontierUnreachable", "fast_failing"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_links: weakref.WeakKeyDictionary[Any, FrontierLink] = weakref.WeakKeyDictionary()


class FrontierUnreachable(Exception):
    """Redis did not answer, or is not tried again yet: keep the work locally."""


def fast_failing(server: Any, timeout: float) -> Any:
    """A client on ``server``'s Redis that tries once per call and waits at most ``timeout``.

    scrapy-redis's own client waits 30 s per attempt and retries inside the
    call, freezing the crawl meanwhile. A pool we cannot copy (Sentinel,
    Cluster) is used as it is.
    """
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:  # pragma: no cover - scrapy-redis needs redis
        return server
    pool = getattr(server, "connection_pool", None)
    if type(pool) is not redis.ConnectionPool:
        return server
    kwargs = {
        **pool.connection_kwargs,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_timeout": False,
    }
    return type(server)(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def _describe(server: Any) -> str:
    kwargs = getattr(getattr(server, "connection_pool", None), "connection_kwargs", {})
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis

    # BusyLoadingError (a restarted Redis reading its AOF) is a ConnectionError.
    return (redis.ConnectionError, redis.TimeoutError)


class FrontierLink:
    """One per crawl, shared by CooldownAwareRedisQueue and OutageTolerantDupeFilter."""

    def __init__(self, server: Any, timeout: float, stats: Any = None, spider: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = fast_failing(server, timeout)
        self.url = _describe(server)
        self.stats = stats
        self.spider = spider
        self.outage = Outage(clock, random)
        self.flushers: list[Callable[[], tuple[int, int]]] = []
        """Write what was kept locally; each returns (requests, fingerprints) written."""
        self._errors = _redis_errors()

    @classmethod
    def of(cls, crawler: Any, server: Any) -> FrontierLink:
        """The crawl's link, made on ``server`` by whichever of queue and dupefilter asks first."""
        link = _links.get(crawler)
        if link is None:
            from ..extension import RetryAfterExtension

            extension = RetryAfterExtension.of(crawler)
            redis = extension.config.redis
            timeout = redis.timeout if redis is not None else 0.5
            link = _links[crawler] = cls(server, timeout, crawler.stats, crawler.spider, extension.clock)
        return link

    def call(self, operation: Callable[[], T], force: bool = False) -> T:
        """``operation()`` on Redis, after writing what was kept during an outage.

        Raises FrontierUnreachable when Redis fails, or while lost and its next
        attempt is not due (unless ``force``).
        """
        outage = self.outage
        if not force and not outage.may_try():
            raise FrontierUnreachable
        written = [0, 0]
        try:
            if outage.lost:
                for flush in self.flushers:
                    requests, fingerprints = flush()
                    written[0] += requests
                    written[1] += fingerprints
            result = operation()
        except self._errors as error:
            if outage.failed():
                self.count("retry_after/redis/frontier_lost")
                logger.warning(
                    "Redis frontier at %(url)s unreachable (%(error)s): requests scheduled meanwhile wait in "
                    "this process and are pushed when it is back; reconnecting with backoff",
                    {"url": self.url, "error": error},
                    extra={"spider": self.spider},
                )
            raise FrontierUnreachable from error
        seconds = outage.succeeded()
        if seconds is not None:
            self.count("retry_after/redis/frontier_reconnected")
            logger.info(
                "Redis frontier at %(url)s is back after %(seconds).1fs: pushed %(requests)d request(s) and "
                "%(fingerprints)d fingerprint(s) this process kept meanwhile",
                {"url": self.url, "seconds": seconds, "requests": written[0], "fingerprints": written[1]},
                extra={"spider": self.spider},
            )
        return result

    def count(self, key: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(key, count)
