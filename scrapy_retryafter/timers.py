"""Timers that work whether Scrapy runs on a Twisted reactor or on asyncio alone.

Scrapy 2.14 added helpers that pick the running event loop; Scrapy 2.13 only
has the reactor. Importing the reactor where none runs would install one that
never fires, so everything time-based here goes through these three calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:  # Scrapy >= 2.14
    from scrapy.utils.asyncio import call_later as _call_later
    from scrapy.utils.asyncio import create_looping_call as _looping_call
except ImportError:  # pragma: no cover - Scrapy 2.13
    _call_later = None  # type: ignore[assignment]  # mypy checks against 2.19, where the import succeeds
    _looping_call = None  # type: ignore[assignment]  # the same: 2.13 lacks it

__all__ = ["call_from_thread", "call_later", "looping_call", "sleep"]


def call_later(delay: float, func: Callable[[], object]) -> Any:
    """Call ``func`` in ``delay`` seconds; the result has ``cancel()``."""
    if _call_later is not None:
        return _call_later(delay, func)
    from twisted.internet import reactor

    return reactor.callLater(delay, func)


def looping_call(func: Callable[[], object]) -> Any:
    """A looping call with ``start(interval, now=False)``, ``stop()`` and ``running``."""
    if _looping_call is not None:
        return _looping_call(func)
    from twisted.internet import task

    return task.LoopingCall(func)


def call_from_thread() -> Callable[[Callable[[], object]], Any] | None:
    """What another thread calls to run a function on the running crawl's loop.

    Call it from the loop's own thread (a signal handler, say); None when no
    loop runs there.
    """
    import sys

    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is not None and getattr(reactor, "running", False):
        return reactor.callFromThread
    import asyncio

    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        return None


async def sleep(seconds: float) -> None:
    try:
        from scrapy.utils.asyncio import is_asyncio_available
    except ImportError:  # pragma: no cover - Scrapy 2.13
        is_asyncio_available = None  # type: ignore[assignment]  # Scrapy 2.13 has no such helper
    if is_asyncio_available is not None and is_asyncio_available():
        import asyncio

        await asyncio.sleep(seconds)
        return
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet import reactor, task

    await maybe_deferred_to_future(task.deferLater(reactor, seconds, lambda: None))
