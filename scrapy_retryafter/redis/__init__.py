"""The fleet's parts, in Redis: the shared board, the frontier queue, the dupefilter, the link.

Nothing here is imported unless a crawl names a Redis (RETRY_AFTER_REDIS_URL,
or scrapy-redis's settings): the local crawl never needs the redis package.
Inside this subpackage ``import redis`` is always the redis-py client
(absolute imports); the package's own modules are imported relatively.
"""
