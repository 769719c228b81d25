"""Puts the add-on into Scrapy's default settings, in every process of a compatibility venv.

A .pth line imports this module at interpreter start; it only registers an
import hook, which sets ADDONS when scrapy.settings.default_settings is first
executed. Doing it there, not in a pytest plugin, also covers the scripts
Scrapy's tests start in subprocesses (CrawlerProcess, scrapy crawl).
Active only while SCRAPY_RETRYAFTER_COMPAT_ADDON is set. With
SCRAPY_RETRYAFTER_COMPAT_NO_PARKING also set, RETRY_AFTER_PARKING defaults to
False (a harness change, listed in differences.py, for as long as a park
file's lock outlives the crawler that took it).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

TARGET = "scrapy.settings.default_settings"
ADDON = "scrapy_retryafter.Addon"
ADDON_PRIORITY = 500


class _DefaultAddonFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            module.ADDONS = {**getattr(module, "ADDONS", {}), ADDON: ADDON_PRIORITY}
            if os.environ.get("SCRAPY_RETRYAFTER_COMPAT_NO_PARKING"):
                module.RETRY_AFTER_PARKING = False

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if os.environ.get("SCRAPY_RETRYAFTER_COMPAT_ADDON") and not any(
        isinstance(finder, _DefaultAddonFinder) for finder in sys.meta_path
    ):
        sys.meta_path.insert(0, _DefaultAddonFinder())


install()
