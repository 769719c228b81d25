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
from scrapy_retryafter.retry_reporting import SCRAPY_HAS_GIVE_UP_LEVEL


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
    assert record.levelno == logging.WARNING  # parked: not a give-up, whatever RETRY_GIVE_UP_LOG_LEVEL says


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



@pytest.mark.parametrize(
    "setting, meta, expected",
    [
        (None, None, logging.ERROR),
        ("INFO", None, logging.INFO),
        ("INFO", "DEBUG", logging.DEBUG),
        ("DEBUG", "warning", logging.WARNING),
        (None, "not a level", logging.ERROR),
    ],
)
@pytest.mark.parametrize("parking", [None, ParkFileStandIn()], ids=["parking off", "parking on"])
def test_the_give_up_line_has_stock_scrapys_level_and_a_parked_request_stays_a_warning(
    caplog, setting, meta, expected, parking
):
    crawler = get_crawler(Spider, {} if setting is None else {"RETRY_GIVE_UP_LOG_LEVEL": setting})
    request = Request("http://a.test/1", meta={} if meta is None else {"give_up_log_level": meta})
    with caplog.at_level(logging.DEBUG, logger="scrapy_retryafter"):
        give_up(crawler, parking)(request, "a.test", 429, "4 retries exhausted", "retries_exhausted", 5.0)
    [record] = [r for r in caplog.records if r.getMessage().startswith("Gave up")]
    if parking is not None:
        assert record.levelno == logging.WARNING
    else:
        # Scrapy < 2.17 has neither knob: stock logs ERROR.
        assert record.levelno == (expected if SCRAPY_HAS_GIVE_UP_LEVEL else logging.ERROR)
