"""``scrapy parked SPIDER [--clear]``: what the park file of a project's spider holds.

Scrapy imports this module through the ``scrapy.commands`` entry point on
every ``scrapy`` call, in every project where the package is installed, and
does not guard the import: an exception here would break ``scrapy crawl``
everywhere. So this module imports only ``scrapy.commands`` (already loaded
by then) and loads everything else inside :meth:`ParkedCommand.run`.
"""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

from scrapy.commands import ScrapyCommand


class ParkedCommand(ScrapyCommand):
    """Find the park file the way a crawl of SPIDER would, then list or clear it."""

    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[options] <spider>"

    def short_desc(self) -> str:
        return "Requests parked by scrapy-retryafter for a spider's next run"

    def long_desc(self) -> str:
        return (
            "List, per slot, the requests scrapy-retryafter parked for SPIDER's next run "
            "(count, reasons, earliest not_before), or empty the file with --clear. The file "
            "is found as a crawl finds it: RETRY_AFTER_PARK_FILE (project settings, the "
            "spider's custom_settings, -s), else JOBDIR/retry_after.parked.jsonl, else "
            ".scrapy/retry_after/SPIDER.parked.jsonl."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--clear", action="store_true", help="empty the park file (takes its lock)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        from scrapy.exceptions import UsageError

        if len(args) != 1:
            raise UsageError("name one spider: scrapy parked SPIDER")
        from .__main__ import main
        from .settings import RetryAfterSettingError

        try:
            path = park_file_for(self.settings, args[0])
        except (KeyError, RetryAfterSettingError) as error:
            print(f"error: {error.args[0] if error.args else error}")
            self.exitcode = 1
            return
        self.exitcode = main(["parked", str(path), f"--spider={args[0]}", *(["--clear"] if opts.clear else [])])


def park_file_for(settings: Any, spider_name: str) -> Any:
    """The park file a crawl of ``spider_name`` with ``settings`` would use.

    Raises KeyError for a spider the project does not have: a path made up
    from a mistyped name would report an empty lot that is not the real one.
    """
    from scrapy.utils.misc import load_object

    from .parking import park_file_path
    from .settings import load_config

    loader = load_object(settings["SPIDER_LOADER_CLASS"]).from_settings(settings.frozencopy())
    try:
        spidercls = loader.load(spider_name)
    except KeyError:
        raise KeyError(f"no spider named {spider_name!r} in this project (see: scrapy list)") from None
    settings = settings.copy()
    spidercls.update_settings(settings)
    config = load_config(settings)
    return park_file_path(config.park_file, settings.get("JOBDIR") or None, spider_name)
