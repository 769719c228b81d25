"""The probe rank (pausing.rank_for_probe, parkrebuild.serialize): a request's own priority survives a pause."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.utils.request import request_from_dict

from scrapy_retryafter.hostpause import PROBE_PRIORITY
from scrapy_retryafter.parkrebuild import serialize
from scrapy_retryafter.parkrecord import decode_value
from scrapy_retryafter.pausing import failed_before, rank_for_probe

ADJUST = -1  # RETRY_PRIORITY_ADJUST's default


def failed(request: Request, paused: bool, spent: bool = False) -> Request:
    """The retry RetryMiddleware makes of ``request`` (get_retry_request copies meta, adjusts priority)."""
    retry = request.replace(priority=request.priority + ADJUST)
    retry.meta.update(request.meta)
    rank_for_probe(request, retry, paused, spent)
    return retry


def parked_priority(request: Request) -> int:
    return request_from_dict(decode_value(serialize(request, None))).priority


def test_a_child_request_given_its_parents_meta_keeps_its_own_priority_when_parked():
    """A spider that passes response.meta on (meta=response.meta, a common pattern) to a
    child with a priority of its own: the child is parked with the parent's priority."""
    parent = failed(Request("http://h/p", priority=0), paused=True)  # retried while the host was paused
    child = Request("http://h/child", priority=100, meta=dict(parent.meta))
    assert parked_priority(child) == 100


def test_a_child_request_given_its_parents_meta_keeps_its_own_priority_when_retried():
    parent = failed(Request("http://h/p", priority=0), paused=True)
    child = Request("http://h/child", priority=100, meta=dict(parent.meta))
    assert failed(child, paused=False).priority == 100 + ADJUST
    assert failed(child, paused=True).priority >= 100 + ADJUST + PROBE_PRIORITY


@pytest.mark.parametrize("own", [2**31 + 5, 2**40, -(2**40), 10**15])
def test_a_priority_past_2_31_comes_back_after_the_pause_and_in_the_park_file(own):
    """Scrapy priorities are any int (a spider ranking by a millisecond timestamp passes 2**31)."""
    retry = failed(failed(Request("http://h/p", priority=own), paused=True), paused=True)
    assert parked_priority(retry) == own + 2 * ADJUST
    assert failed(retry, paused=False).priority == own + 3 * ADJUST


@pytest.mark.parametrize("value", ["3", 2**64, -5, True, 3.0, None, [1]])
def test_hostile_failure_counts_neither_raise_nor_count(value):
    request = Request("http://h/p", meta={"retry_after_failures": value})
    assert failed_before(request.meta) is False
    retry = failed(request, paused=True)
    assert retry.meta["retry_after_failures"] == 1
    assert retry.priority == ADJUST + PROBE_PRIORITY


@pytest.mark.parametrize("value", ["x", 2**64, True, 3.5, None])
def test_a_hostile_own_priority_in_meta_is_not_taken_for_the_requests_priority(value):
    request = Request("http://h/p", priority=7, meta={"retry_after_priority": value})
    assert failed(request, paused=False).priority == 7 + ADJUST
    assert parked_priority(request) == 7


@pytest.mark.parametrize("value", [-(2**31), 2**31, 12345])
def test_a_spider_set_own_priority_does_not_replace_the_requests_priority(value):
    """A value a spider put in meta (or copied from another request) is not this request's rank."""
    request = Request("http://h/p", priority=7, meta={"retry_after_priority": value})
    assert failed(request, paused=False).priority == 7 + ADJUST
    assert parked_priority(request) == 7
