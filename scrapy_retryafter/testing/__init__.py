"""Testing aids: a throttling HTTP server on loopback, a Redis launcher, a fleet runner.

Shipped in the wheel so that a project's own tests (and this package's tests,
example and benchmarks) can crawl a real rate limiter on 127.0.0.x without a
network. Not part of the crawling API: nothing here is loaded by the add-on,
and it may change between 0.x releases without notice. See "Testing aids" in
the manual.
"""
