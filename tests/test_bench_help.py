"""Every bench script that takes arguments prints its help and exits at once.

``--help`` used to be read inside a Deferred after the reactor had started, so
argparse's exit was swallowed and the reactor ran on forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WITH_ARGUMENTS = sorted(
    path.stem for path in (ROOT / "bench").glob("*.py") if "argparse" in path.read_text(encoding="utf-8")
)


def test_the_list_is_not_empty() -> None:
    assert {"compare", "retry_gaps", "retry_isolation"} <= set(WITH_ARGUMENTS)


@pytest.mark.parametrize("module", WITH_ARGUMENTS)
def test_help_exits_fast(module: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--help"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
