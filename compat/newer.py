"""The package with the newest Scrapy on PyPI, pre-releases included, when it is newer than the newest supported.

Installs that Scrapy and the package (--no-deps, so setup.cfg's cap does
not stand in the way) into a throwaway venv, .venv/compat-newer, and runs
the package's fast tests (no crawls, no Redis) there. It reports; CI does
not fail on it.

Usage: python compat/newer.py NEWEST_SUPPORTED [PYTHON]
COMPAT_NEWER_VERSION=X forces the version (to try the mechanics on a known release).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parent.parent
SLOW = ("test_crawl_", "test_redis_", "test_retry_crawl", "test_example")
TEST_REQUIREMENTS = ["pytest>=8", "pytest-twisted>=1.14", "hypothesis>=6"]


def newest_on_pypi(python: str) -> Version | None:
    out = subprocess.run(
        [python, "-m", "pip", "index", "versions", "scrapy", "--pre"],
        capture_output=True, text=True, timeout=120, check=False,
    ).stdout
    match = re.search(r"Available versions: (.*)", out)
    if not match:
        return None
    versions = []
    for text in match.group(1).split(","):
        try:
            versions.append(Version(text.strip()))
        except InvalidVersion:
            continue
    return max(versions, default=None)


def main(argv: list[str]) -> int:
    supported = Version(argv[0])
    python = argv[1] if len(argv) > 1 else sys.executable
    forced = os.environ.get("COMPAT_NEWER_VERSION")
    newest = Version(forced) if forced else newest_on_pypi(python)
    if newest is None:
        print("== newer Scrapy: could not read Scrapy's versions from the package index")
        return 1
    if newest <= supported and not forced:
        print(f"== newer Scrapy: none on PyPI (newest, pre-releases included: {newest}; supported up to {supported})")
        return 0
    venv = REPO / ".venv" / "compat-newer"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    vpython = str(venv / "bin" / "python")
    pip = [vpython, "-m", "pip", "install", "-q"]
    print(f"== newer Scrapy: installing Scrapy {newest} and the package (--no-deps)")
    steps = [
        pip + [f"scrapy=={newest}", *TEST_REQUIREMENTS],
        pip + ["--no-deps", str(REPO)],
        [vpython, "-m", "pip", "check"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode:
            print(f"== newer Scrapy {newest}: `{' '.join(step[2:])}` failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            return 1
    tests = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if not p.name.startswith(SLOW))
    started = time.monotonic()
    run = subprocess.run(
        [vpython, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )
    tail = run.stdout.strip().splitlines()[-15:]
    print(f"== newer Scrapy {newest}: the package's fast tests ({len(tests)} files, "
          f"{time.monotonic() - started:.0f} s), exit {run.returncode}")
    print("\n".join(tail))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
