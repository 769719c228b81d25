"""Following requests on the Scrapy side of the park file: drop the parked ones, settle the loaded ones.

A parked request goes back to the engine marked, and ``request_scheduled``
drops it there (so the spider's errback is not called: it is postponed, not
failed). A request loaded from the file is followed until it is handled (a
response came back, or it left the downloader for good); its record is then
done. Per-request signals cost every request of a crawl: they are connected
only once something is parked or loaded.
"""

from __future__ import annotations

import collections
import functools
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import IgnoreRequest

from .parkrebuild import PARK_ID, PARKED
from .timers import call_later

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

__all__ = ["ParkTracker"]


class ParkTracker:
    """Which loaded records are still live, which are done, which were parked again."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.live: collections.Counter[str] = collections.Counter()
        self.reparked: set[str] = set()
        self.done: set[str] = set()
        self._dropping = self._tracking = False

    def drop_parked(self) -> None:
        """From now on, a request marked parked is dropped when the engine schedules it."""
        if not self._dropping:
            self.crawler.signals.connect(self._request_scheduled, signal=signals.request_scheduled)
            self._dropping = True

    def track(self) -> None:
        """Follow the requests loaded from the file until they are handled."""
        if self._tracking:
            return
        self.drop_parked()
        connect = self.crawler.signals.connect
        connect(self._request_gone, signal=signals.request_left_downloader)
        connect(self._request_gone, signal=signals.request_dropped)
        connect(self._response_received, signal=signals.response_received)
        self._tracking = True

    def parked(self, request: Request, record_id: str) -> None:
        if request.meta.get(PARK_ID):
            self.reparked.add(record_id)
            self.live.pop(record_id, None)  # no longer in this run's batch
        request.meta[PARKED] = True

    def rescheduled(self, request: Request) -> None:
        """The request is scheduled again without leaving the crawl (the waiting room's bounce and
        release): its next ``request_scheduled`` counts it, so this schedule is not counted twice."""
        record_id = request.meta.get(PARK_ID)
        if record_id and self._tracking and self.live[record_id] > 0:
            self.live[record_id] -= 1

    def take_done(self) -> set[str]:
        done, self.done = self.done, set()
        return done

    def still_queued(self) -> set[str]:
        """Loaded records whose request is still in the crawl (JOBDIR saves them with the job)."""
        return {key for key, live in self.live.items() if live > 0 and key not in self.reparked}

    def _request_scheduled(self, request: Request, **kwargs: Any) -> None:
        if request.meta.get(PARKED):
            raise IgnoreRequest("parked")
        record_id = request.meta.get(PARK_ID)
        if record_id:
            self.live[record_id] += 1

    def _request_gone(self, request: Request, **kwargs: Any) -> None:
        record_id = request.meta.get(PARK_ID)
        if record_id and not request.meta.get(PARKED):
            self.live[record_id] -= 1
            # A retry of it, if any, is scheduled in the same turn: settle after.
            call_later(0, functools.partial(self._settle, record_id))

    def _response_received(self, request: Request, **kwargs: Any) -> None:
        record_id = request.meta.get(PARK_ID)
        if record_id:
            self.done.add(record_id)

    def _settle(self, record_id: str) -> None:
        if self.live[record_id] <= 0 and record_id not in self.reparked:
            self.done.add(record_id)
            self.live.pop(record_id, None)
