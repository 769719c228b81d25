"""Root over a project of another uid (a container's bind mount): that uid is trusted, nothing else is.

Real directories chowned to another uid; needs root (skipped otherwise).
"""

from __future__ import annotations

import os
import time

import pytest
import pytest_twisted

from scrapy_retryafter.parkfile import ParkFile, ParkFileError, ParkRecord, read_log
from scrapy_retryafter.parking import project_owner
from scrapy_retryafter.testing.server import HostConfig
from tests.test_park_processes import _check_logs, make_project, start_crawl, wait_all

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")

THEM = 54321


def _record(url: str) -> ParkRecord:
    return ParkRecord(url=url, slot="127.0.0.1", reason="over_cap", attempts=1, not_before=time.time(), request=None)


def _chown_tree(root, uid: int) -> None:
    for folder, _dirs, files in os.walk(root):
        os.chown(folder, uid, uid)
        for name in files:
            os.chown(os.path.join(folder, name), uid, uid)


def test_the_project_owner_s_directory_parks_claims_and_compacts_apart_when_trusted(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, THEM, THEM)
    path = theirs / "parked.jsonl"
    with ParkFile(path) as refused, pytest.raises(ParkFileError, match=r"belongs to another user \(uid 54321\)"):
        refused.add(_record("http://127.0.0.1/a"))
    with ParkFile(path, trusted_uid=THEM) as lot:
        lot.check()
        lot.add_many([_record("http://127.0.0.1/a"), _record("http://127.0.0.1/b")])
        claimed = lot.claim(lambda entry: True, limit=1)
        assert len(claimed.records) == 1 and claimed.more == 1
        lot.done([claimed.records[0].id])
        assert lot.compact_apart() == 1  # the child trusts the same uid (it was refused without it)
    assert [entry.url for entry in read_log(path, THEM).records.values()] == ["http://127.0.0.1/b"]
    # A file the project's owner left there is theirs to have written: accepted too.
    os.chown(path, THEM, THEM)
    with ParkFile(path, trusted_uid=THEM) as lot:
        assert len(lot.claim(lambda entry: True).records) == 1


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_trusted_uid_s_directory_writable_by_others_is_still_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, THEM, THEM + 1)
    os.chmod(shared, mode)
    with ParkFile(shared / "parked.jsonl", trusted_uid=THEM) as lot:
        with pytest.raises(ParkFileError, match="writable by"):
            lot.add(_record("http://127.0.0.1/a"))
    # ... and a symlink from a trusted directory into it.
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, THEM, THEM)
    (theirs / "data").symlink_to(shared)
    with ParkFile(theirs / "data" / "parked.jsonl", trusted_uid=THEM) as lot:
        with pytest.raises(ParkFileError, match="where .* leads"):
            lot.check()


def test_a_uid_is_trusted_only_when_root_and_only_the_project_root_s(tmp_path, monkeypatch):
    project = make_project(tmp_path / "project")
    _chown_tree(project, THEM)
    monkeypatch.chdir(project / "parkproj")  # found upwards, as Scrapy finds it
    assert project_owner(project / ".scrapy" / "x.jsonl", False) == THEM
    os.chown(project / "scrapy.cfg", THEM + 7, THEM + 7)  # a scrapy.cfg someone else put there
    assert project_owner(project / ".scrapy" / "x.jsonl", False) is None
    os.chown(project / "scrapy.cfg", THEM, THEM)
    monkeypatch.chdir(tmp_path)  # not in a project: the park file set under one
    assert project_owner(project / "parks" / "x.jsonl", False) is None
    assert project_owner(project / "parks" / "x.jsonl", True) == THEM
    (tmp_path / "elsewhere").mkdir()
    os.symlink(project / "scrapy.cfg", tmp_path / "elsewhere" / "scrapy.cfg")
    assert project_owner(tmp_path / "elsewhere" / "x.jsonl", True) is None  # a symlinked scrapy.cfg
    monkeypatch.setattr(os, "geteuid", lambda: THEM + 9)
    assert project_owner(project / "parks" / "x.jsonl", True) is None  # not root: only ourselves


@pytest_twisted.ensureDeferred
async def test_root_crawling_a_project_owned_by_another_uid_parks_and_the_next_run_loads(server, tmp_path):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.0, retry_after="4"))
    server.start()
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    project = make_project(home / "project")
    _chown_tree(home, THEM)
    park_file = project / ".scrapy" / "retry_after" / "pages.parked.jsonl"
    urls = [capped.url(f"/p/{n}") for n in range(3)]
    first = start_crawl(project, tmp_path / "first.log", urls, RETRY_AFTER_MAX_DELAY=1)
    assert await wait_all([first], 60) == [0]
    _check_logs([tmp_path / "first.log"])
    assert sorted(entry.url for entry in read_log(park_file, THEM).records.values()) == sorted(urls)
    assert os.stat(park_file).st_uid == 0 and os.stat(park_file.parent).st_mode & 0o777 == 0o700

    capped.config.reject_first = 0
    second = start_crawl(project, tmp_path / "second.log", [], RETRY_AFTER_MAX_DELAY=30)
    assert await wait_all([second], 60) == [0]
    assert _check_logs([tmp_path / "second.log"]).count("PAGE 200") == 3
    assert not park_file.exists() or read_log(park_file, THEM).records == {}
