"""``scrapy parked SPIDER``: registered through Scrapy's entry point, run as a user runs it.

Each test runs the real ``scrapy`` command line in a subprocess, inside a
throwaway Scrapy project. The package is not installed in the test venv, so
the entry point setup.cfg declares is written into a ``.dist-info`` on the
subprocess's path: what Scrapy loads is exactly what the wheel registers.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scrapy_retryafter.parkfile import ParkFile, ParkRecord

ROOT = Path(__file__).resolve().parents[1]


def declared_commands() -> str:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config["options.entry_points"]["scrapy.commands"].strip()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    dist = tmp_path / "site" / "scrapy_retryafter-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: scrapy-retryafter\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(f"[scrapy.commands]\n{declared_commands()}\n")
    root = tmp_path / "proj"
    (root / "proj" / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = proj.settings\n")
    (root / "proj" / "__init__.py").write_text("")
    (root / "proj" / "settings.py").write_text('SPIDER_MODULES = ["proj.spiders"]\n')
    (root / "proj" / "spiders" / "__init__.py").write_text(textwrap.dedent("""
        import scrapy

        class Plain(scrapy.Spider):
            name = "plain"

        class Custom(scrapy.Spider):
            name = "custom"
            custom_settings = {"RETRY_AFTER_PARK_FILE": "custom-lot.jsonl"}
    """))
    return root


def scrapy(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(project.parent / "site"), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", "scrapy", *args], cwd=project, env=env,
        check=False, capture_output=True, text=True, timeout=60,
    )


def park(path: Path, *slots: str, spider: str = "plain") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with ParkFile(path) as lot:
        for slot in slots:
            lot.add(ParkRecord(url=f"http://{slot}/x", slot=slot, reason="over_cap", attempts=1,
                               not_before=time.time() + 60, request=None, spider=spider))


def test_scrapy_lists_the_command(project: Path) -> None:
    result = scrapy(project)
    assert result.returncode == 0, result.stderr
    assert "parked" in result.stdout
    assert "Requests parked by scrapy-retryafter" in result.stdout


def test_default_park_file_in_the_projects_data_dir(project: Path) -> None:
    park(project / ".scrapy" / "retry_after" / "plain.parked.jsonl", "a.example", "a.example", "b.example")
    result = scrapy(project, "parked", "plain")
    assert result.returncode == 0, result.stderr
    assert "3 parked request(s) in" in result.stdout
    assert "plain.parked.jsonl" in result.stdout
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[2:]}
    assert rows == {"a.example": "2", "b.example": "1"}


def test_spider_custom_settings_and_jobdir_pick_the_file(project: Path) -> None:
    park(project / "custom-lot.jsonl", "c.example", spider="custom")
    park(project / "job" / "retry_after.parked.jsonl", "j.example", "j.example")
    custom = scrapy(project, "parked", "custom")
    assert custom.returncode == 0, custom.stderr
    assert "1 parked request(s) in custom-lot.jsonl" in custom.stdout
    jobdir = scrapy(project, "parked", "plain", "-s", "JOBDIR=job")
    assert jobdir.returncode == 0, jobdir.stderr
    assert "2 parked request(s) in job/retry_after.parked.jsonl" in jobdir.stdout


def test_clear_removes_every_record_and_the_file(project: Path) -> None:
    path = project / ".scrapy" / "retry_after" / "plain.parked.jsonl"
    park(path, "a.example")
    result = scrapy(project, "parked", "plain", "--clear")
    assert result.returncode == 0, result.stderr
    assert "cleared 1 parked request(s)" in result.stdout
    assert not path.exists()
    assert "error: no park file at" in scrapy(project, "parked", "plain").stderr


def test_unknown_spider_and_missing_file_exit_1_with_one_line(project: Path) -> None:
    unknown = scrapy(project, "parked", "nope")
    assert unknown.returncode == 1
    assert unknown.stdout.strip() == "error: no spider named 'nope' in this project (see: scrapy list)"
    missing = scrapy(project, "parked", "plain")
    assert missing.returncode == 1
    assert "error: no park file at" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_the_command_module_imports_nothing_of_the_package() -> None:
    """Scrapy imports it on every ``scrapy`` call: nothing there may fail."""
    code = (
        "import sys; import scrapy_retryafter.commands; "
        "print(sorted(m for m in sys.modules if m.startswith('scrapy_retryafter')))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['scrapy_retryafter', 'scrapy_retryafter.commands']"


def test_a_park_file_spiders_share_is_listed_and_cleared_per_spider(project: Path) -> None:
    # With RETRY_AFTER_PARK_FILE in the project's settings every spider parks into one file;
    # `scrapy parked plain --clear` removed the other spider's requests too, and listed them as plain's.
    settings = project / "proj" / "settings.py"
    settings.write_text(settings.read_text() + 'RETRY_AFTER_PARK_FILE = "shared.jsonl"\n')
    park(project / "shared.jsonl", "a.example", "a.example")
    park(project / "shared.jsonl", "c.example", spider="custom-other")
    listed = scrapy(project, "parked", "plain")
    assert listed.returncode == 0, listed.stderr
    assert "2 parked request(s) in shared.jsonl" in listed.stdout and "c.example" not in listed.stdout
    cleared = scrapy(project, "parked", "plain", "--clear")
    assert cleared.returncode == 0, cleared.stderr
    assert "cleared 2 parked request(s)" in cleared.stdout
    with ParkFile(project / "shared.jsonl") as lot:
        assert [entry.url for entry in lot.read().records.values()] == ["http://c.example/x"]
