"""``python -m scrapy_retryafter parked FILE [--clear]``: what a park file holds.

Everything printed from the file is escaped: a slot or reason may hold
terminal escape sequences written by whoever could write the file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .eventlog import printable
from .parkfile import ParkFile, _of_spider, iso, read_log, summarize


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_retryafter")
    commands = parser.add_subparsers(dest="command", required=True)
    parked = commands.add_parser("parked", help="requests parked for a later run, per slot")
    parked.add_argument("file", help="the park file (RETRY_AFTER_PARK_FILE)")
    parked.add_argument("--clear", action="store_true", help="remove every parked request (and the file)")
    parked.add_argument("--spider", help="only this spider's requests (a file spiders share)")
    args = parser.parse_args(argv)
    path = Path(args.file)
    shown = printable(str(path), 1000)

    if args.clear:
        handle = ParkFile(path)
        try:
            handle.check()
            cleared = handle.clear(args.spider)
        except OSError as error:
            print(f"error: {printable(str(error), 1000)}", file=sys.stderr)
            return 1
        finally:
            handle.close()
        print(f"cleared {cleared} parked request(s) from {shown}")
        return 0

    try:
        if not path.exists() and not path.is_symlink():
            print(f"error: no park file at {shown}", file=sys.stderr)
            return 1
        fold = read_log(path)
    except OSError as error:
        print(f"error: {printable(str(error), 1000)}", file=sys.stderr)
        return 1
    ours = [key for key, entry in fold.records.items() if _of_spider(entry, args.spider)]
    rows = list(summarize(fold.records[key] for key in ours))
    free = len(set(fold.free()).intersection(ours))
    print(f"{len(ours)} parked request(s) in {shown}, {len(ours) - free} claimed by a running crawl")
    if rows:
        cells = [(printable(slot, 100), count, iso(earliest),
                  ", ".join(f"{printable(reason, 64)} {n}" for reason, n in sorted(reasons.items())))
                 for slot, count, reasons, earliest in rows]
        width = max(len("slot"), *(len(slot) for slot, *_ in cells))
        print(f"{'slot':<{width}}  {'count':>5}  {'earliest not_before':<24}  reasons")
        for slot, count, earliest, why in cells:
            print(f"{slot:<{width}}  {count:>5}  {earliest:<24}  {why}")
    if fold.bad:
        print(f"{len(fold.bad)} line(s) a run sets aside in {printable(path.name, 200)}.torn (torn or malformed):")
        for bad in fold.bad[:20]:
            print(f"  {printable(bad.why, 200)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
