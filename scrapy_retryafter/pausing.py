"""The Scrapy side of host pauses (hostpause.py): report failures and answers, log and count once.

Both middlewares use it: RetryMiddleware for gateway failures, timeouts and
resets (RETRY_AFTER_ALL_RETRIES), RetryAfterMiddleware for blind 503s once
the retry budget is spent. Refused connections in a row cool the slot by the
host-down rule (failures.host_down_wait) as well. The state is the board's, so each middleware may
keep its own instance.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from .eventlog import printable
from .failures import NOT_BEFORE, host_down_wait, sent_at
from .hostpause import FAILURES, OWN_PRIORITY, PROBED_OUT, PauseEvent, left_at, own_priority, probe_priority
from .retry_reporting import add_seconds

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from .extension import RetryAfterExtension
    from .policy import SlotPolicy

__all__ = ["Pausing", "failed_before", "rank_for_probe"]

logger = logging.getLogger(__name__)


def rank_for_probe(request: Request, retry: Request, paused: bool, spent: bool) -> None:
    """Count ``request``'s failure on ``retry``; while its host is paused, raise ``retry`` to probe
    priority (hostpause.probe_priority), else give it back its own priority."""
    meta = retry.meta
    failures = _count(meta.get(FAILURES)) + 1
    meta[FAILURES] = failures
    own = own_priority(request.meta.get(OWN_PRIORITY), request.priority)
    own += retry.priority - request.priority  # RETRY_PRIORITY_ADJUST, when this retry applied it
    if spent:
        meta[PROBED_OUT] = True
    if paused:
        retry.priority = probe_priority(own, failures, spent)
        meta[OWN_PRIORITY] = [own, retry.priority]
    else:
        meta.pop(OWN_PRIORITY, None)
        retry.priority = own


def failed_before(meta: dict[str, object]) -> bool:
    """The request was retried already (a gateway failure, a throttle): its failure is a repeat."""
    return any(_count(meta.get(key)) > 0 for key in (FAILURES, "retry_times", "retry_after_throttles"))


def _count(value: object, default: int = 0, signed: bool = False) -> int:
    """A whole number from meta a spider may have set to anything."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**31 or (value < 0 and not signed):
        return default
    return value


class Pausing:
    def __init__(self, crawler: Crawler, extension: RetryAfterExtension, rng: random.Random) -> None:
        self.crawler = crawler
        self.extension = extension
        self.board = extension.board
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.rng = rng

    def failed(self, request: Request, slot: str, policy: SlotPolicy, kind: str) -> PauseEvent:
        """A request of ``slot`` failed as ``kind``: count it toward a pause, or move the paused slot's next probe."""
        now = self.board.clock()
        event = self.board.pauses.failed(
            slot, kind, now, self._left(request, now), policy.host_down_threshold, policy.backoff, self.rng,
            repeat=failed_before(request.meta),
        )
        self._carry_out(slot, kind, event, f"{policy.host_down_threshold} {kind} failures in a row")
        self._cap(slot, policy)
        return event

    def outage_failure(
        self, request: Request, slot: str, policy: SlotPolicy, kind: str | None, exhausted: bool
    ) -> tuple[float | None, bool]:
        """A gateway failure, timeout or reset (``kind``; None: another failure): (seconds to the host's next probe when the request is
        held for its paused host and spends no retry, else None; whether it was a probe that failed
        on its last attempt). Such a probe is held once too while the host stays paused (the outage may
        be the host's); failing so again, its URL is taken for broken and it is given up as stock does."""
        if kind is None:
            return None, False
        pause = self.board.pauses.pause_of(slot)
        probing = pause is not None and pause.probe_out > 0.0  # a request left as the pause's probe
        event = self.failed(request, slot, policy, kind)
        spent_probe = probing and exhausted and not (event.free or event.started) and slot in self.board.pauses
        spent_probe = spent_probe and not request.meta.get(PROBED_OUT)  # held once only
        if event.free or spent_probe:
            return self.board.pauses.remaining(slot, self.board.clock()), spent_probe
        return None, False

    def paused_failure(self, request: Request, slot: str, policy: SlotPolicy, kind: str, exhausted: bool) -> tuple[bool, bool]:
        """A blind failure while ``slot`` is paused: (free: sent before the pause, the host's failure, or a
        probe on its last throttle held once while the host stays paused; spent: that probe)."""
        pause = self.board.pauses.pause_of(slot)
        probing = pause is not None and pause.probe_out > 0.0  # a request left as the pause's probe
        free = self.pause(request, slot, policy, kind, "").free
        spent = not free and probing and exhausted and not request.meta.get(PROBED_OUT) and slot in self.board.pauses
        return free or spent, spent

    def queue_retry(self, request: Request, retry: Request, slot: str, now: float, wait: float, spent_probe: bool) -> None:
        """The retry of a gateway failure, timeout or reset: while its host is paused the probe interval
        spaces it (a backoff of its own would keep the most failed request from being the next probe)."""
        paused = slot in self.board.pauses
        retry.meta[NOT_BEFORE] = now if paused else now + wait
        rank_for_probe(request, retry, paused, spent_probe)

    def _left(self, request: Request, now: float) -> float:
        # RetryAfterMiddleware stamps what leaves a held slot; without it, only the answer's latency tells.
        return left_at(request.meta, now) if self.extension.throttles_installed else sent_at(request.meta, now)

    def pause(self, request: Request, slot: str, policy: SlotPolicy, kind: str, why: str) -> PauseEvent:
        """Pause ``slot`` at once (the retry budget is spent), or move its next probe if paused."""
        board = self.board
        pause = board.pauses.pause_of(slot)
        if pause is not None:
            now = board.clock()
            event = board.pauses.failed(
                slot, kind, now, self._left(request, now), policy.host_down_threshold, policy.backoff, self.rng,
                repeat=failed_before(request.meta),
            )
        else:
            event = PauseEvent(True, False, board.pauses.pause(slot, kind, board.clock(), policy.backoff, self.rng))
        self._carry_out(slot, kind, event, why)
        self._cap(slot, policy)
        return event

    def _cap(self, slot: str, policy: SlotPolicy) -> None:
        """A pause longer than the slot's max_delay is a refusal: the held requests are parked
        (reason host_down) and the crawl can finish, instead of wearing them down one probe at a time."""
        pause = self.board.pauses.pause_of(slot)
        if pause is None or self.board.refused(slot):
            return
        lasted = self.board.clock() - pause.since
        if lasted > policy.max_delay:
            self.stats.inc_value("retry_after/host_down_refused")
            self.extension.refusals.refuse(slot, policy.max_delay, "host_down")

    def _carry_out(self, slot: str, kind: str, event: PauseEvent, why: str) -> None:
        if event.wait:
            # The cooldown keeps the slot on the board (the queue asks only slots it holds)
            # and sends back what waits in the downloader slot.
            self.board.cool(slot, event.wait, 0.0)
            self.extension.send_back(slot)
            # A queue that asked while the probe was out holds the slot until the probe's timeout.
            self.extension.sooner(slot)
        if not event.started:
            return
        self.stats.inc_value("retry_after/host_paused")
        logger.warning(
            "Host %(slot)s looks down (%(why)s): pausing it, one probe per interval, the first in %(wait).2fs; "
            "requests held meanwhile spend none of their retries",
            {"slot": printable(slot), "why": why, "wait": event.wait},
            extra={"spider": self.crawler.spider},
        )

    def answered(self, slot: str) -> None:
        """``slot`` answered with something other than an outage failure: its pause, if any, ends."""
        if not self.board.pauses:
            return
        lasted = self.board.pauses.answered(slot, self.board.clock())
        if lasted is None:
            return
        self.stats.inc_value("retry_after/host_resumed")
        self.extension.sooner(slot)
        logger.info(
            "Host %(slot)s answers again after a %(lasted).2fs pause: its held requests go out",
            {"slot": printable(slot), "lasted": lasted},
            extra={"spider": self.crawler.spider},
        )

    def connection_failed(self, request: Request, exception: Exception) -> None:
        """A burst of refused connections pauses the slot: a dead host is a fact about the host."""
        slot = self.extension.slot_of(request)
        policy = self.extension.config.policy_for(slot)
        count = self.board.connection_failed(slot)
        wait = host_down_wait(count, policy.host_down_threshold, policy.backoff, self.rng)
        if wait is None:
            return
        added = self.board.cool(slot, wait, policy.wake_jitter)
        if not added:
            return
        self.stats.inc_value("retry_after/host_down")
        add_seconds(self.stats, "retry_after/cooldown_seconds", added)
        self.extension.send_back(slot)
        logger.warning(
            "Host %(slot)s looks down: %(count)d connection failures in a row (last %(error)s), "
            "pausing the slot %(wait).2fs",
            {"slot": printable(slot), "count": count, "error": type(exception).__name__, "wait": self.board.remaining(slot)},
            extra={"spider": self.crawler.spider},
        )
