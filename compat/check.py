"""Compares the compatibility runs' outcomes with compat/differences.py.

Usage: python compat/check.py RESULTS_DIR SUITE...   (SUITE: a Scrapy version or scrapy-redis)
       python compat/check.py --unexpected RESULTS_DIR SUITE   (the unlisted failures' ids, one a line)

Reads RESULTS_DIR/compat-SUITE.json (written by pytest_compat.py), then
compat-SUITE-rerun.json (unlisted failures run once more with the package:
one that passes then is load-sensitive, counted "passed on rerun") and
compat-SUITE-stock.json (still failing ones run as released, without the
package: a test failing there too fails as released, not by the package's doing).
Prints pass / fail / intended / skipped counts per suite and test file, then
every problem: an unlisted failure, a listed test that passes (take it off
the list), a listed test that did not run. Exit status 1 on any problem.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from differences import INCOMPATIBLE, INTENDED, Difference

FAILED = {"failed", "xpassed"}


def listed_for(suite: str, entries: list[Difference] | None = None) -> dict[str, Difference]:
    return {d.test: d for d in (INTENDED if entries is None else entries) if suite in d.suites}


def group_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def check(results: Path, suite: str) -> tuple[list[str], list[str]]:
    path = results / f"compat-{suite}.json"
    if not path.exists():
        return [f"{suite}: no results ({path} missing: the suite did not finish)"], []
    outcomes: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    rerun = _load(results / f"compat-{suite}-rerun.json")
    stock = _load(results / f"compat-{suite}-stock.json")
    listed = listed_for(suite)
    known = listed_for(suite, INCOMPATIBLE)
    allow_known = bool(os.environ.get("COMPAT_ALLOW_KNOWN"))
    counts: dict[str, Counter[str]] = {}
    problems: list[str] = []
    for nodeid, outcome in sorted(outcomes.items()):
        column = "passed"
        if outcome in FAILED and nodeid not in listed and nodeid in rerun and rerun[nodeid] not in FAILED:
            column = "rerun passed"
        elif outcome in FAILED:
            if nodeid in listed:
                column = "intended"
            elif nodeid in known:
                column = "incompatible"
                if not allow_known:
                    problems.append(f"{suite}: {nodeid} fails: known incompatibility, {known[nodeid].why}")
            elif stock.get(nodeid) in FAILED:
                column = "as released"
            else:
                column = "FAILED"
                problems.append(f"{suite}: {nodeid} fails and is not in compat/differences.py")
        elif outcome in ("skipped", "xfailed"):  # xfailed: marked as failing in the release itself
            column = "skipped"
        elif nodeid in listed or nodeid in known:
            column = "passed"
            problems.append(f"{suite}: {nodeid} is listed in compat/differences.py but passes: take it off the list")
        counts.setdefault(group_of(nodeid), Counter())[column] += 1
    for nodeid in sorted((set(listed) | set(known)) - set(outcomes)):
        problems.append(f"{suite}: {nodeid} is listed but did not run")
    columns = ["passed", "FAILED", "incompatible", "intended", "as released", "rerun passed", "skipped"]
    lines = [f"-- {suite}", f"{'group':32}" + "".join(f"{c:>13}" for c in columns)]
    total: Counter[str] = Counter()
    for group, counter in sorted(counts.items()):
        total.update(counter)
        lines.append(f"{group:32}" + "".join(f"{counter[c]:>13}" for c in columns))
    lines.append(f"{'total':32}" + "".join(f"{total[c]:>13}" for c in columns))
    if stock and suite == "scrapy-redis":
        released = Counter("failed" if o in FAILED else o for o in stock.values())
        lines.append(f"as released, without the package: {dict(sorted(released.items()))}")
    return problems, lines


def _load(path: Path) -> dict[str, str]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def unexpected(results: Path, suite: str) -> list[str]:
    outcomes = _load(results / f"compat-{suite}.json")
    rerun = _load(results / f"compat-{suite}-rerun.json")
    listed = {**listed_for(suite), **listed_for(suite, INCOMPATIBLE)}
    return [
        nodeid for nodeid, outcome in sorted(outcomes.items())
        if outcome in FAILED and nodeid not in listed and rerun.get(nodeid, outcome) in FAILED
        and "::" in nodeid
    ]


def main(argv: list[str]) -> int:
    if argv[0] == "--unexpected":
        for nodeid in unexpected(Path(argv[1]), argv[2]):
            print(nodeid)
        return 0
    results, suites = Path(argv[0]), argv[1:]
    problems: list[str] = []
    for suite in suites:
        found, lines = check(results, suite)
        print("\n".join(lines))
        problems += found
    for problem in problems:
        print("PROBLEM:", problem)
    print(f"== compatibility: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
