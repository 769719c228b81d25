"""holding.py: the one give-up path, and what happens when the park file cannot take a request."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.test import get_crawler

from scrapy_retryafter.holding import GiveUp


class ParkFileStandIn:
    """Records what would be parked; ``broken`` raises the OSError a full or read-only disk would."""

    def __init__(self, broken: bool = False) -> None:
        self.path = Path("/var/lib/crawl/retry_after.parked.jsonl")
        self.broken = broken
        self.parked: list[tuple[str, str, str, int, float]] = []

    def park(self, request: Request, slot: str, reason: str, detail: str, attempts: int, wait: float) -> Request:
        if self.broken:
            raise OSError(28, "No space left on device")
        self.parked.append((slot, reason, detail, attempts, wait))
        return request


@pytest.fixture
def crawler() -> Any:
    return get_crawler(Spider)


def give_up(crawler: Any, parking: Any) -> GiveUp:
    return GiveUp(crawler, parking)


def test_a_request_given_up_is_parked_with_why_and_when(crawler, caplog):
    parking = ParkFileStandIn()
    request = Request("http://a.test/1", meta={"retry_after_throttles": 2})
    with caplog.at_level(logging.WARNING):
        parked = give_up(crawler, parking)(request, "a.test", 429, "4 retries exhausted", "retries_exhausted", 5.0)
    assert parked is request
    assert parking.parked == [("a.test", "retries_exhausted", "4 retries exhausted", 3, 5.0)]
    assert crawler.stats.get_value("retry_after/gave_up") == 1
    [record] = caplog.records
    assert "after 3 throttle(s) (last 429): 4 retries exhausted; parked until" in record.getMessage()


@pytest.mark.parametrize(
    "outcome, park, fate",
    [("not_repeatable", True, "not parked: repeating it could apply it twice"), ("deadline", False, "")],
)
def test_what_repeating_could_apply_twice_or_whose_failure_is_the_answer_reaches_the_spider(crawler, caplog, outcome, park, fate):
    parking = ParkFileStandIn()
    with caplog.at_level(logging.WARNING):
        parked = give_up(crawler, parking)(
            Request("http://a.test/1", method="POST"), "a.test", 503, "why", outcome, 1.0, attempts=3, park=park
        )
    assert parked is None and not parking.parked
    assert caplog.records[0].getMessage().endswith(f"after 3 attempt(s) (last 503): why{'; ' + fate if fate else ''}")


def test_a_park_file_that_cannot_take_the_request_passes_it_on_with_one_error_naming_the_file(crawler, caplog):
    parking = ParkFileStandIn(broken=True)
    with caplog.at_level(logging.WARNING):
        parked = give_up(crawler, parking)(Request("http://a.test/1"), "a.test", 429, "over the cap", "over_cap", 900.0)
    assert parked is None  # the caller hands the response or the failure to the spider
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1 and len(caplog.records) == 1
    message = errors[0].getMessage()
    assert str(parking.path) in message and "No space left on device" in message and "over the cap" in message
    assert crawler.stats.get_value("retry_after/park_failed") == 1


def test_a_request_held_at_close_is_parked_or_else_failed(crawler):
    request = Request("http://a.test/1")
    parking = ParkFileStandIn()
    assert give_up(crawler, parking).at_close(request, "a.test", "the crawl closed", 1, 2.0) is request
    assert parking.parked == [("a.test", "held_at_close", "the crawl closed", 1, 2.0)]
    with pytest.raises(IgnoreRequest, match="the crawl closed"):
        give_up(crawler, ParkFileStandIn(broken=True)).at_close(request, "a.test", "the crawl closed", 1, 2.0)
    with pytest.raises(IgnoreRequest):
        give_up(crawler, None).at_close(request, "a.test", "the crawl closed", 1, 2.0)

