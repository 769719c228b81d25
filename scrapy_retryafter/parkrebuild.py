"""Requests to park records and back, on the Scrapy side: every field of a record is hostile.

``_class`` must name a ``scrapy.Request`` subclass of a module already
imported (nothing is imported for a record), callbacks must be the spider's
own methods, and only http and https requests come back.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from scrapy import Request
from scrapy.utils.request import request_from_dict

from .failures import NOT_BEFORE, PREVIOUS_WAIT, STARTED
from .hostpause import FAILURES, OWN_PRIORITY, PROBED_OUT, own_priority
from .parkrecord import ParkRecord, decode_value, encode_value

__all__ = ["PARKED", "PARK_ID", "escape", "rebuild", "serialize"]

PARK_ID = "retry_after_park_id"
"""Meta key of a request loaded from the park file: the record it came from."""
PARKED = "_retry_after_parked"
TRANSIENT_META = (
    # Attempts, waits and the deadline's start belong to this run: the next one starts afresh.
    "retry_after_throttles", "retry_times", "download_latency", PARKED, STARTED, NOT_BEFORE, PREVIOUS_WAIT,
    FAILURES, OWN_PRIORITY, PROBED_OUT,
)


def escape(text: str, limit: int = 200) -> str:
    return text[:limit].encode("unicode_escape").decode("ascii")


def serialize(request: Request, spider: Any) -> dict[str, Any]:
    """The plain dict a record holds; TypeError or ValueError when the request cannot be one."""
    raw = request.to_dict(spider=spider)
    raw["priority"] = own_priority(raw["meta"].get(OWN_PRIORITY), request.priority)  # a probe rank is this run's
    raw["meta"] = {key: value for key, value in raw["meta"].items() if key not in TRANSIENT_META}
    encoded: dict[str, Any] = encode_value(raw)
    return encoded


def rebuild(record: ParkRecord, spider: Any) -> Request:
    """The record's request; ValueError when anything in it is refused."""
    if record.request is None:
        request = Request(record.url, dont_filter=True)
    else:
        raw = record.request
        cls = raw.get("_class")
        if cls is not None:
            _request_class(cls)  # before request_from_dict imports anything
        for key in ("callback", "errback"):
            if raw.get(key) is not None:
                _spider_method(spider, raw[key], key)
        try:
            raw = decode_value(raw)
            for key in ("meta", "cb_kwargs"):
                if isinstance(raw.get(key), dict) and not all(isinstance(k, str) for k in raw[key]):
                    raise TypeError(f"{key} has a key that is not a string")
            if isinstance(raw.get("meta"), dict):
                raw["meta"] = {k: v for k, v in raw["meta"].items() if k not in TRANSIENT_META and k != PARK_ID}
            request = request_from_dict(raw, spider=spider)
            # Seen once already (and remembered by a resumed JOBDIR's dupefilter).
            request = request.replace(dont_filter=True)
        except Exception as error:  # noqa: BLE001 - a hostile record must not stop the crawl
            raise ValueError(f"the request cannot be rebuilt ({type(error).__name__}: {error})") from None
        if request.url.split(":", 1)[0].lower() not in ("http", "https"):
            raise ValueError("the rebuilt request is not http or https")
    request.meta[PARK_ID] = record.id
    return request


def _request_class(path: str) -> type[Request]:
    """A Request subclass named by a record, found among the modules already imported, never imported."""
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name)
    cls = getattr(module, name, None) if module is not None else None
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        why = "a module this crawl has not imported" if module is None else "no scrapy.Request subclass"
        raise ValueError(f"_class {path!r} names {why}; refused")
    return cls


def _spider_method(spider: Any, name: str, key: str) -> None:
    """A callback must be a method the spider's own classes define (or Spider.parse).

    Scrapy's Spider methods (``_set_crawler``, ``start``, ``close`` ...) are
    no callbacks: a record naming one would call it with a response.
    """
    from scrapy import Spider

    owner = next((cls for cls in type(spider).__mro__ if name in vars(cls)), None)
    method = vars(owner).get(name) if owner is not None else None
    if not inspect.isfunction(method) or (owner in (Spider, object) and name != "parse"):
        raise ValueError(f"{key} {name!r} is not a method of the spider; refused")
