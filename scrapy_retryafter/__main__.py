"""``python -m scrapy_retryafter parked FILE [--clear]``: what a park file holds."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .parkfile import ParkFile, ParkFileLocked, iso, read_records, summarize


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_retryafter")
    commands = parser.add_subparsers(dest="command", required=True)
    parked = commands.add_parser("parked", help="requests parked for a later run, per slot")
    parked.add_argument("file", help="the park file (RETRY_AFTER_PARK_FILE)")
    parked.add_argument("--clear", action="store_true", help="empty the file (asks for its lock)")
    args = parser.parse_args(argv)

    if args.clear:
        try:
            with ParkFile(args.file) as lot:
                cleared = lot.clear()
        except ParkFileLocked as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"cleared {cleared} parked request(s) from {args.file}")
        return 0

    from pathlib import Path

    path = Path(args.file)
    if not path.exists():
        print(f"error: no park file at {path}", file=sys.stderr)
        return 1
    records, bad = read_records(path)
    rows = list(summarize(records.values()))
    print(f"{len(records)} parked request(s) in {path}")
    if rows:
        width = max(len("slot"), *(len(slot) for slot, *_ in rows))
        print(f"{'slot':<{width}}  {'count':>5}  {'earliest not_before':<24}  reasons")
        for slot, count, reasons, earliest in rows:
            why = ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
            print(f"{slot:<{width}}  {count:>5}  {iso(earliest):<24}  {why}")
    if bad:
        print(f"{len(bad)} unreadable line(s) (a torn write); a run moves them to {path.name}.torn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
