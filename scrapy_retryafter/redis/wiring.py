"""How the shared Redis board is wired into one crawl: what a fleet event does here.

Another crawler's cooldown, refusal or circuit is counted, logged once and
acted on through the extension (its requests sent back, the engine woken);
losing Redis and getting it back are one WARNING each, with the URL's
password masked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import signals

from ..eventlog import printable
from .board import RedisBoard

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from ..redisconfig import RedisConfig
    from ..settings import Config

__all__ = ["FleetEvents", "FleetHost", "fleet_board"]

logger = logging.getLogger(__name__)

CONTACT_MARK = "_retry_after_contact"
"""Meta key of a request the downloader took while first contact held its slot: the hold's mark."""


class FleetHost(Protocol):
    """What the fleet's events act on: the crawl's extension (extension.py)."""

    crawler: Crawler
    stats: Any

    def wake_at(self, when: float) -> None: ...

    def sooner(self, slot: str) -> None: ...

    def send_back(self, slot: str) -> int: ...

    def nudge_engine(self) -> None: ...

    def refused_elsewhere(self, slot: str) -> None: ...

    def slot_of(self, request: Request) -> str: ...


def fleet_board(extension: FleetHost, config: Config, clock: Any) -> RedisBoard:
    """The Redis board for ``extension``'s crawl, its events wired, connected if Redis answers."""
    assert config.redis is not None
    crawler = extension.crawler
    stats = extension.stats
    board = RedisBoard(
        config.redis, clock=clock, policy=config.policy_for,
        first_contact=crawler.settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
    )
    events = FleetEvents(extension, config.redis)
    board.on_remote_cool = events.remote_cool
    board.on_remote_refusal = events.remote_refusal
    board.on_invalid = lambda count: stats.inc_value("retry_after/redis/invalid", count)
    board.on_remote_circuit = events.remote_circuit
    board.on_lost = events.lost
    board.on_back = events.back
    board.on_wake = extension.wake_at
    board.on_sooner = extension.sooner
    board.on_late_lease = lambda slot: stats.inc_value("retry_after/redis/late_sends_skipped")

    def slot_of(request: Request) -> str:
        slot = request.meta.get("download_slot")  # written by the downloader before either signal
        return slot if slot.__class__ is str else extension.slot_of(request)

    def reached(request: Request, spider: object = None) -> None:
        if not len(board.contact):  # every request passes here: nothing held, nothing to count
            return
        mark = board.reached(slot_of(request))
        if mark is not None:
            request.meta[CONTACT_MARK] = mark

    def left(request: Request, spider: object = None) -> None:
        mark = request.meta.pop(CONTACT_MARK, None)
        if mark.__class__ is float:
            board.left(slot_of(request), mark)

    # Answered or failed: the last request of a first contact to leave opens the host to the fleet.
    crawler.signals.connect(reached, signal=signals.request_reached_downloader, weak=False)
    crawler.signals.connect(left, signal=signals.request_left_downloader, weak=False)
    if board.connect():
        logger.info("Sharing cooldowns through the Redis board at %s (keys %s:*)", config.redis.safe_url, config.redis.prefix)
    return board


class FleetEvents:
    """What another crawler of the fleet, or Redis itself, did: counted, logged, acted on."""

    def __init__(self, extension: FleetHost, redis: RedisConfig) -> None:
        self.extension = extension
        self.crawler = extension.crawler
        self.stats = extension.stats
        self.redis = redis

    def remote_cool(self, slot: str, seconds: float) -> None:
        self.stats.inc_value("retry_after/redis/remote_cooldowns")
        logger.info(
            "Cooling %(slot)s %(wait).2fs: another crawler of the fleet was throttled (Redis board)",
            {"slot": printable(slot), "wait": seconds},
            extra={"spider": self.crawler.spider},
        )
        self.extension.send_back(slot)

    def remote_refusal(self, slot: str, seconds: float) -> None:
        self.stats.inc_value("retry_after/redis/remote_over_cap")
        logger.warning(
            "Refusing %(slot)s for %(wait).0fs: another crawler of the fleet cools it longer than "
            "RETRY_AFTER_MAX_DELAY here (Redis board); its requests are given up as over the cap",
            {"slot": printable(slot), "wait": seconds},
            extra={"spider": self.crawler.spider},
        )
        self.extension.refused_elsewhere(slot)

    def remote_circuit(self, slot: str, opened: bool) -> None:
        self.stats.inc_value(f"retry_after/redis/remote_circuit_{'opened' if opened else 'closed'}")
        logger.info(
            "Circuit %(what)s for %(slot)s by another crawler of the fleet (Redis board)",
            {"what": "opened" if opened else "closed", "slot": printable(slot)},
            extra={"spider": self.crawler.spider},
        )
        if not opened:
            self.extension.nudge_engine()

    def lost(self, error: BaseException) -> None:
        self.stats.inc_value("retry_after/redis/lost")
        logger.warning(
            "Redis board at %(url)s unreachable (%(error)s): this crawler goes on with its own "
            "cooldowns and reconnects with backoff",
            {"url": self.redis.safe_url, "error": self.redis.scrub(str(error))},
            extra={"spider": self.crawler.spider},
        )

    def back(self, republished: int) -> None:
        self.stats.inc_value("retry_after/redis/reconnected")
        logger.warning(
            "Redis board at %(url)s is back: re-published %(count)d local cooldown(s) and circuit(s)",
            {"url": self.redis.safe_url, "count": republished},
            extra={"spider": self.crawler.spider},
        )
