"""The park file's worker thread: claims, removals and compaction run there, never on the reactor.

Results come back on the crawl's loop (a Twisted reactor, or asyncio alone).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any

from .parklock import ParkFileError
from .timers import call_from_thread

__all__ = ["ParkWorker"]


class ParkWorker:
    """One thread for one crawl's park file; built on the crawl's loop thread."""

    def __init__(self) -> None:
        self._to_loop: Any = call_from_thread()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="retry_after_park")

    def run(self, work: Callable[..., Any], then: Callable[[Any, BaseException | None], Any],
            *args: Any) -> concurrent.futures.Future[Any]:
        """Run ``work(*args)`` in the worker; ``then(result, error)`` back on the crawl's loop.

        Where no loop can be reached from another thread, both run here and now.
        """
        if self._to_loop is None:
            self._to_loop = call_from_thread()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._to_loop is not None:
            try:
                future = self._pool.submit(work, *args)
            except RuntimeError:  # shut down: the crawl has closed
                future.set_exception(ParkFileError(1, "the park file is closed"))
        else:
            try:
                future.set_result(work(*args))
            except Exception as error:  # noqa: BLE001 - handed to ``then`` as the worker would
                future.set_exception(error)
        to_loop = self._to_loop

        def done(future: concurrent.futures.Future[Any]) -> None:
            failure = future.exception()
            result = None if failure is not None else future.result()
            if to_loop is None:
                then(result, failure)
            else:
                to_loop(functools.partial(then, result, failure))

        future.add_done_callback(done)
        return future

    def submit(self, work: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        return self._pool.submit(work, *args)

    def shutdown(self) -> None:
        """No new work; what was submitted still runs."""
        self._pool.shutdown(wait=False)

    async def wait(self, future: concurrent.futures.Future[Any]) -> Any:
        """Wait for a worker's future on whichever loop runs this coroutine (asyncio, or a plain reactor)."""
        try:
            in_asyncio_task = asyncio.current_task() is not None
        except RuntimeError:
            in_asyncio_task = False
        if not in_asyncio_task:
            from twisted.internet.defer import Deferred

            deferred: Deferred[Any] = Deferred()
            to_loop = self._to_loop

            def back(future: concurrent.futures.Future[Any]) -> None:
                error = future.exception()
                fire = (functools.partial(deferred.errback, error) if error
                        else functools.partial(deferred.callback, future.result()))
                to_loop(fire) if to_loop is not None else fire()

            future.add_done_callback(back)
            return await deferred
        return await asyncio.wrap_future(future)
