"""Park records: the line format of the park file, every field bounded on the way in.

A record is one JSON line: id, url, slot, reason, not_before and the plain
``request`` dict. Everything read back is hostile until checked here; no
Scrapy here (the Scrapy side turns requests into that dict and back).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

_MAX_NOT_BEFORE = 253402300799.0  # 9999-12-31T23:59:59Z
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
_METHOD = re.compile(r"[A-Z][A-Z0-9_-]{0,31}\Z")
_LIMITS = {"slot": 1024, "reason": 64, "detail": 65536, "spider": 1024, "url": 65536}


def iso(when: float) -> str:
    return datetime.fromtimestamp(when, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    """Seconds since the epoch; ValueError for anything outside 1970..9999 or not ISO 8601."""
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError("not_before is not an ISO 8601 time")
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    when = moment.timestamp()
    if not 0.0 <= when <= _MAX_NOT_BEFORE:
        raise ValueError(f"not_before {text!r} is outside 1970..9999")
    return when


def encode_value(value: Any) -> Any:
    """A JSON-safe copy: bytes as base64, dicts with non-string keys as pairs.

    Raises TypeError for anything JSON cannot hold, so the caller can fall
    back to a URL-only record instead of writing a lossy one.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [encode_value(item) for item in value]
    if isinstance(value, Mapping):
        if all(isinstance(key, str) and not key.startswith("$") for key in value):
            return {key: encode_value(item) for key, item in value.items()}
        return {"$pairs": [[encode_value(key), encode_value(item)] for key, item in value.items()]}
    raise TypeError(f"{type(value).__name__} cannot be written to the park file")


def decode_value(value: Any) -> Any:
    """The inverse of encode_value; ValueError for a malformed encoding."""
    try:
        if isinstance(value, list):
            return [decode_value(item) for item in value]
        if isinstance(value, dict):
            if set(value) == {"$b64"}:
                return base64.b64decode(value["$b64"], validate=True)
            if set(value) == {"$pairs"}:
                return {_hashable(decode_value(key)): decode_value(item) for key, item in value["$pairs"]}
            return {key: decode_value(item) for key, item in value.items()}
        return value
    except (TypeError, binascii.Error, RecursionError) as error:
        raise ValueError(f"malformed encoded value ({type(error).__name__})") from None


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _bounded_str(raw: dict[str, Any], key: str, default: str = "") -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string")
    if len(value) > _LIMITS[key]:
        raise ValueError(f"{key} is longer than {_LIMITS[key]} characters")
    return value


def _check_url(url: Any, where: str) -> None:
    if not isinstance(url, str) or len(url) > _LIMITS["url"]:
        raise ValueError(f"{where} is not a URL string")
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise ValueError(f"{where} has scheme {scheme[:16]!r}: only http and https are loaded")


def _check_request(request: dict[str, Any], url: str) -> None:
    """What Scrapy's request_from_dict would act on before any check of ours: bounded here."""
    _check_url(request.get("url"), "request.url")
    cls = request.get("_class")
    if cls is not None and (not isinstance(cls, str) or len(cls) > 256 or not _DOTTED.match(cls)):
        raise ValueError("request._class is not a dotted class name")
    for key in ("callback", "errback"):
        name = request.get(key)
        if name is not None and (not isinstance(name, str) or len(name) > 128 or not _NAME.match(name)
                                 or name.startswith("__")):
            raise ValueError(f"request.{key} is not a method name")
    method = request.get("method", "GET")
    if not isinstance(method, str) or not _METHOD.match(method):
        raise ValueError("request.method is not an HTTP method")
    priority = request.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**63:
        raise ValueError("request.priority is not a bounded integer")
    encoding = request.get("encoding", "utf-8")
    if not isinstance(encoding, str) or len(encoding) > 64:
        raise ValueError("request.encoding is not a codec name")
    for key in ("meta", "cb_kwargs"):
        if request.get(key) is not None and not isinstance(request[key], dict):
            raise ValueError(f"request.{key} is not a mapping")


@dataclass
class ParkRecord:
    url: str
    slot: str
    reason: str
    """A short kind (``over_cap``, ``retries_exhausted``, ``budget_spent``, ``held_at_close``)."""
    attempts: int
    not_before: float
    """Wall-clock seconds (UTC epoch); written as ISO 8601."""
    request: dict[str, Any] | None
    """Scrapy's Request.to_dict(), JSON-encoded; None for a URL-only record."""
    spider: str = ""
    detail: str = ""
    """The give-up line's reason, for people."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def to_line(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "spider": self.spider,
                "url": self.url,
                "slot": self.slot,
                "reason": self.reason,
                "detail": self.detail,
                "attempts": self.attempts,
                "not_before": iso(self.not_before),
                "request": self.request,
            },
            separators=(",", ":"),
            ensure_ascii=True,
        ) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ParkRecord:
        return cls.from_raw(json.loads(line), line)

    @classmethod
    def from_raw(cls, raw: Any, line: str = "") -> ParkRecord:
        """A record from its parsed line; ValueError naming the first malformed field."""
        if not isinstance(raw, dict) or "url" not in raw:
            raise ValueError("not a park record")
        url = raw["url"]
        _check_url(url, "url")
        record_id = raw.get("id")
        if record_id is None:
            # A hand-written record: an id that every reader derives alike.
            record_id = "h" + hashlib.sha256(line.encode("utf-8", "replace")).hexdigest()[:40]
        if not isinstance(record_id, str) or not _ID.match(record_id):
            raise ValueError("id is not 1-64 letters, digits, '-' or '_'")
        attempts = raw.get("attempts", 0)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 0 <= attempts <= 10**6:
            raise ValueError("attempts is not an integer in 0..1000000")
        request = raw.get("request")
        if request is not None:
            if not isinstance(request, dict):
                raise ValueError("request is not a mapping")
            _check_request(request, url)
        return cls(
            url=url,
            slot=_bounded_str(raw, "slot"),
            reason=_bounded_str(raw, "reason"),
            detail=_bounded_str(raw, "detail"),
            attempts=attempts,
            not_before=parse_iso(raw.get("not_before")),  # type: ignore[arg-type]
            request=request,
            spider=_bounded_str(raw, "spider"),
            id=record_id,
        )

