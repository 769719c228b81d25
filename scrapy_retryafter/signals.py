"""Signals sent by scrapy-retryafter, connected like Scrapy's own.

    crawler.signals.connect(handler, signal=scrapy_retryafter.signals.circuit_opened)

circuit_opened(slot: str, until: float, held: int): a slot's breaker opened;
    until is a time.monotonic() value, held the requests waiting for the slot.
circuit_closed(slot: str): a probe (or any request) of that slot succeeded.
"""

circuit_opened = object()
circuit_closed = object()
