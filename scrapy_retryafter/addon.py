"""One line in ADDONS installs the middleware, the extension and the queue.

Where a project's own settings stand in the way, the add-on keeps the
project's choice and says in one line what that costs, instead of letting
the crawl fail later with an obscure error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetryMiddleware
from scrapy.pqueues import DownloaderAwarePriorityQueue, ScrapyPriorityQueue
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object

from .banflag import BanSpiderMiddleware
from .extension import RetryAfterExtension
from .logstats import RetryAfterLogStats
from .middleware import RetryAfterMiddleware
from .pqueue import CooldownAwarePriorityQueue
from .redis.queue import CooldownAwareRedisQueue
from .retry import RetryMiddleware
from .scrapy_compat import scheduler_state_file
from .settings import load_config
from .slotfloors import SlotFloors

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["Addon"]

logger = logging.getLogger(__name__)

_QUEUE = "scrapy_retryafter.CooldownAwarePriorityQueue"
_REDIS_QUEUE = "scrapy_retryafter.redis.queue.CooldownAwareRedisQueue"
_REDIS_DUPEFILTER = "scrapy_redis.dupefilter.RFPDupeFilter"
_TOLERANT_DUPEFILTER = "scrapy_retryafter.redis.dupefilter.OutageTolerantDupeFilter"
_STOCK_RETRY = "scrapy.downloadermiddlewares.retry.RetryMiddleware"


class Addon:
    def update_settings(self, settings: BaseSettings) -> None:
        settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", RetryAfterMiddleware, 560)
        settings.setdefault_in_component_priority_dict("EXTENSIONS", RetryAfterExtension, 500)
        settings.setdefault_in_component_priority_dict("EXTENSIONS", RetryAfterLogStats, 501)
        settings.setdefault_in_component_priority_dict("EXTENSIONS", SlotFloors, 502)
        settings.setdefault_in_component_priority_dict("SPIDER_MIDDLEWARES", BanSpiderMiddleware, 560)
        self._replace_retry_middleware(settings)
        # Every retry is then made with backoff, idempotency and the deadline (RETRY_AFTER_ALL_RETRIES).
        settings.setdefault("RETRY_AFTER_ALL_RETRIES", True, "addon")
        if not self._scrapy_redis_scheduler(settings):
            self._install_queue(settings)
        self._keep_throttles_out_of_cache(settings)

    @staticmethod
    def _replace_retry_middleware(settings: BaseSettings) -> None:
        for name in ("DOWNLOADER_MIDDLEWARES", "DOWNLOADER_MIDDLEWARES_BASE"):
            for key, priority in settings.getdict(name).items():
                if _loads(key) is ScrapyRetryMiddleware:
                    if priority is None:
                        return  # the project turned retries off
                    # Keyed by the path the _BASE uses: Scrapy 2.13 would keep the _BASE's entry
                    # beside a class key, and 2.19 warns when both are there.
                    middlewares = settings.getdict("DOWNLOADER_MIDDLEWARES")
                    for stock in [k for k in middlewares if _loads(k) is ScrapyRetryMiddleware]:
                        del middlewares[stock]
                    middlewares[_STOCK_RETRY] = None
                    settings.set("DOWNLOADER_MIDDLEWARES", middlewares, settings.getpriority("DOWNLOADER_MIDDLEWARES") or 0)
                    settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", RetryMiddleware, priority)
                    return

    @staticmethod
    def _scrapy_redis_scheduler(settings: BaseSettings) -> bool:
        """scrapy-redis's scheduler never builds SCHEDULER_PRIORITY_QUEUE: its SCHEDULER_QUEUE_CLASS gets ours."""
        scheduler = settings.get("SCHEDULER")
        name = scheduler if isinstance(scheduler, str) else getattr(scheduler, "__module__", "")
        if not name.startswith("scrapy_redis."):
            return False
        Addon._tolerate_redis_outages_in_dupefilter(settings)
        current = settings.get("SCHEDULER_QUEUE_CLASS")
        current_cls = _loads(current)
        if current is None or (isinstance(current_cls, type) and issubclass(current_cls, CooldownAwareRedisQueue)):
            priority = max(settings.getpriority("SCHEDULER_QUEUE_CLASS") or 0, SETTINGS_PRIORITIES["addon"])
            settings.set("SCHEDULER_QUEUE_CLASS", _REDIS_QUEUE, priority)
            return True
        board = "a shared Redis board" if load_config(settings).redis is not None else "a per-process board"
        logger.warning(
            "scrapy-retryafter: SCHEDULER_QUEUE_CLASS=%s is kept, so a cooling slot's requests leave the "
            "shared frontier and wait in each process's downloader; cooldowns, pacing and the breaker still "
            "apply through %s. Set it to %s to hold them in Redis",
            current, board, _REDIS_QUEUE,
        )
        return True

    @staticmethod
    def _tolerate_redis_outages_in_dupefilter(settings: BaseSettings) -> None:
        """scrapy-redis's own dupefilter (exactly it, not a project's subclass) gets ours."""
        current = settings.get("DUPEFILTER_CLASS")
        loaded = _loads(current)
        # Without scrapy-redis importable both load as None: a project's class must not match then.
        if current != _REDIS_DUPEFILTER and (loaded is None or loaded is not _loads(_REDIS_DUPEFILTER)):
            return
        priority = max(settings.getpriority("DUPEFILTER_CLASS") or 0, SETTINGS_PRIORITIES["addon"])
        settings.set("DUPEFILTER_CLASS", _TOLERANT_DUPEFILTER, priority)

    @staticmethod
    def _install_queue(settings: BaseSettings) -> None:
        current = settings.get("SCHEDULER_PRIORITY_QUEUE")
        current_cls = _loads(current)
        user_set = (settings.getpriority("SCHEDULER_PRIORITY_QUEUE") or 0) > SETTINGS_PRIORITIES["default"]
        if isinstance(current_cls, type) and issubclass(current_cls, CooldownAwarePriorityQueue):
            return
        if user_set and current_cls not in (DownloaderAwarePriorityQueue, ScrapyPriorityQueue):
            logger.warning(
                "scrapy-retryafter: SCHEDULER_PRIORITY_QUEUE=%s is kept, so cooling slots wait in the "
                "downloader and can slow other hosts; set it to %s to hold them in the scheduler",
                current, _QUEUE,
            )
            return
        if settings.getint("CONCURRENT_REQUESTS_PER_IP"):
            logger.warning(
                "scrapy-retryafter: CONCURRENT_REQUESTS_PER_IP is set, which %s (a "
                "DownloaderAwarePriorityQueue) does not support; cooling slots wait in the downloader instead",
                _QUEUE,
            )
            return
        jobdir = settings.get("JOBDIR")
        if jobdir and _jobdir_made_by_other_queue(Path(jobdir)):
            logger.warning(
                "scrapy-retryafter: JOBDIR %s was made with another SCHEDULER_PRIORITY_QUEUE (%s), "
                "which is kept so the job resumes; cooling slots wait in the downloader. Start a new "
                "JOBDIR to hold them in the scheduler",
                jobdir, current,
            )
            return
        priority = max(settings.getpriority("SCHEDULER_PRIORITY_QUEUE") or 0, SETTINGS_PRIORITIES["addon"])
        settings.set("SCHEDULER_PRIORITY_QUEUE", _QUEUE, priority)

    @staticmethod
    def _keep_throttles_out_of_cache(settings: BaseSettings) -> None:
        codes = load_config(settings).all_codes
        ignored = [int(code) for code in settings.getlist("HTTPCACHE_IGNORE_HTTP_CODES")]
        missing = sorted(codes - set(ignored))
        if missing:
            priority = max(settings.getpriority("HTTPCACHE_IGNORE_HTTP_CODES") or 0, SETTINGS_PRIORITIES["addon"])
            settings.set("HTTPCACHE_IGNORE_HTTP_CODES", ignored + missing, priority)


def _loads(path_or_cls: Any) -> Any:
    try:
        return load_object(path_or_cls) if isinstance(path_or_cls, str) else path_or_cls
    except (ImportError, ValueError, NameError, AttributeError):
        return None


def _jobdir_made_by_other_queue(jobdir: Path) -> bool:
    state = scheduler_state_file(jobdir)
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(data) and not isinstance(data, dict)
