"""Names for throttle scopes: file-name safe, bounded, and never a secret in clear.

A scope key names a JOBDIR directory, a Redis key and a park record's field,
so it must be a safe file name of bounded length. A key that is already a
plain name (a host name) stays itself, so a crawl with the default
configuration keys everything by its slot as before. Anything else keeps a
readable start and ends in a hash of the whole, so two values that read the
same stay apart and a header value (an API key) never appears.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MAX_KEY_LENGTH", "MAX_SCOPES", "MAX_VALUE_CHARS", "combination_key", "digest", "kind_key", "plain_key", "proxy_part", "registrable_domain"]

MAX_KEY_LENGTH = 120
"""Longest scope key; a longer one keeps a readable start and ends in a hash."""
_MAX_COMBINATION_LENGTH = 200
"""A queue partition's name (one directory under JOBDIR); below the 255 bytes file systems allow."""
_HASH_CHARS = 12
MAX_SCOPES = 8
"""Most scopes one request may belong to (a user callable returning 10,000 ids is a bug)."""
MAX_VALUE_CHARS = 8192
"""Header and meta values are hashed from at most this many characters."""

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@~=-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_BODY = re.compile(r"[A-Za-z0-9._@~-]+")
_UNSAFE_BODY = re.compile(r"[^A-Za-z0-9._@~-]+")


def digest(*parts: str) -> str:
    data = "\0".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(b"retry-after-scope\0" + data).hexdigest()[:_HASH_CHARS]


def plain_key(text: str, limit: int = MAX_KEY_LENGTH) -> str:
    """``text`` itself when it is a safe file name within ``limit`` (so a key
    stays itself), else a safe readable start plus ``~`` and a hash of the whole."""
    if len(text) <= limit and _PLAIN.fullmatch(text) and text not in (".", ".."):
        return text
    readable = _UNSAFE.sub("_", text).strip("._-")[: limit - _HASH_CHARS - 1] or "x"
    return f"{readable}~{digest(text)}"


def kind_key(kind: str, readable: str, identity: str | None = None) -> str:
    """``kind=readable``, hashed as a whole when it is not plain or too long.

    ``identity`` (the exact thing keyed) is hashed in whenever it differs from
    the readable text, so two values that read the same stay apart.
    """
    body = _UNSAFE_BODY.sub("_", readable)
    text = f"{kind}={body}"
    exact = identity is None or identity == readable
    if exact and body == readable and len(text) <= MAX_KEY_LENGTH and _BODY.fullmatch(body):
        return text
    room = MAX_KEY_LENGTH - len(kind) - 1 - _HASH_CHARS - 1
    return f"{kind}={body[:room]}~{digest(kind, readable if identity is None else identity)}"


def combination_key(keys: Sequence[str]) -> str:
    """One name for a set of scope keys: the scheduler queue's partition (a JOBDIR directory).

    The keys are sorted so one combination has one name whatever the order.
    """
    ordered = sorted(set(keys))
    if len(ordered) == 1:
        return ordered[0]
    joined = "+".join(ordered)
    if len(joined) <= _MAX_COMBINATION_LENGTH:
        return joined
    return f"{joined[: _MAX_COMBINATION_LENGTH - _HASH_CHARS - 1]}~{digest(joined)}"


def proxy_part(proxy: Any) -> str:
    """``host_port`` of the proxy (plus a hash of its user name, which picks the
    exit on session-rotating proxies), ``direct`` without one. Never the password."""
    if not isinstance(proxy, str) or not proxy.strip():
        return "direct"
    text = proxy.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        host = (parts.hostname or "").lower()
        port = parts.port
        user = parts.username
    except ValueError:
        return "proxy~" + digest("proxy", text.rpartition("@")[2])
    if not host:
        return "proxy~" + digest("proxy", text.rpartition("@")[2])
    part = f"{host}_{port}" if port else host
    if user:
        part += "~u" + digest("proxy-user", user)[:8]
    return part


_extract: Callable[[str], Any] | None = None


def _extractor() -> Callable[[str], Any]:
    """tldextract with its bundled suffix list only: no download, no cache written."""
    global _extract
    if _extract is None:
        import tldextract

        _extract = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=())
    return _extract


@lru_cache(maxsize=4096)
def registrable_domain(host: str) -> str:
    """``shop.example.co.uk`` -> ``example.co.uk``; an IP address or a bare name stays itself."""
    host = host.strip().lower().rstrip(".")
    if not host:
        return ""
    result = _extractor()(host)
    if result.domain and result.suffix:
        return f"{result.domain}.{result.suffix}"
    return host
