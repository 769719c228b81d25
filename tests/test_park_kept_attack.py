"""Attacks on the fold kept between claims, its descriptor and the set-aside fallback.

Pure tests on the park file (several handles stand for several processes:
each handle has its own owner and kept fold) and real crawls where the
behaviour is the extension's.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

import pytest
import pytest_twisted

from scrapy_retryafter import parkload
from scrapy_retryafter.parkfile import ParkFile, ParkRecord, read_log
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, crawl


def _record(key: str, url: str, spider: str = "s") -> ParkRecord:
    return ParkRecord(url=url, slot="127.0.0.1", reason="over_cap", attempts=1, not_before=time.time() - 1,
                      request=None, spider=spider, id=key)


def _all(entry):
    return True


def _ids_in(lines) -> list[tuple[str, str]]:
    """(claimed id, the id inside the line claimed under it)."""
    return [(record_id, json.loads(line)["id"]) for _, record_id, line in lines]


# -- the kept fold against rewrites the package never makes -------------------------------------


def test_a_file_truncated_and_regrown_past_the_kept_offset_is_folded_again(tmp_path):
    """Cleared in place (``: > FILE``, same inode) while a crawl keeps its fold, then parked into again
    by another process with lines of the same length: the byte before the kept offset is a newline
    again, so the stale fold was trusted and its records' offsets now hold other records."""
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as first, ParkFile(path) as other:
        first.add_many([_record(f"a{i}", f"http://127.0.0.1/a{i}") for i in range(10)])
        claimed = first.claim(_all, parse=False, limit=2)
        assert claimed.more == 8 and first._kept is not None  # the fold is kept
        os.truncate(path, 0)
        other.add_many([_record(f"b{i}", f"http://127.0.0.1/b{i}") for i in range(11)])  # past the offset
        claimed = first.claim(_all, parse=False, limit=100)
        pairs = _ids_in(claimed.lines)
        assert pairs and all(key == inside for key, inside in pairs), pairs
        assert sorted(key for key, _ in pairs) == sorted(f"b{i}" for i in range(11))


def test_a_same_size_rewrite_then_an_append_at_the_kept_offset_is_folded_again(tmp_path):
    """The file rewritten in place to the same size (another tool opening it with O_TRUNC), then one
    append by another process that starts exactly at the kept offset."""
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as first, ParkFile(path) as other:
        first.add_many([_record(f"a{i}", f"http://127.0.0.1/a{i}") for i in range(6)])
        first.claim(_all, parse=False, limit=1)
        size = path.stat().st_size
        rewritten = b"".join(_record(f"c{i}", f"http://127.0.0.1/c{i}").to_line().encode() + b"\n" for i in range(6))
        claim_line_room = size - len(rewritten)
        assert claim_line_room > 0
        with open(path, "r+b") as out:  # same inode, same size: records c0..c5, then spaces to the old end
            out.write(rewritten + b" " * (claim_line_room - 1) + b"\n")
        assert path.stat().st_size == size
        other.add(_record("d0", "http://127.0.0.1/d0"))
        pairs = _ids_in(first.claim(_all, parse=False, limit=100).lines)
        assert all(key == inside for key, inside in pairs), pairs
        assert sorted(key for key, _ in pairs) == [*(f"c{i}" for i in range(6)), "d0"]


# -- the kept fold against what other processes do ------------------------------------------------


def test_what_other_handles_do_between_two_claims_reaches_the_kept_fold(tmp_path):
    """A removal of a record folded in an earlier claim, a record appended, claimed by another and
    released, a claim line from a foreign host, and a compaction by another to the same size."""
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as first, ParkFile(path) as other:
        first.add_many([_record(f"a{i}", f"http://127.0.0.1/a{i}") for i in range(8)])
        assert first.claim(_all, parse=False, limit=1).more == 7
        other.done(["a1"])  # folded in the first claim, removed since
        other.add(_record("n0", "http://127.0.0.1/n0"))
        taken = other.claim(lambda entry: entry.url.endswith("n0"), parse=False)
        assert [key for _, key, _ in taken.lines] == ["n0"]
        other.release(["n0"])
        foreign = {"claim": ["a2"], "by": {"host": "elsewhere", "boot": "b", "ns": "n", "pid": 1, "start": 1,
                                           "nonce": "x"}, "at": round(time.time(), 3)}
        with open(path, "ab") as out:
            out.write(json.dumps(foreign, separators=(",", ":")).encode() + b"\n")
        kept_identity = first._kept.identity
        pairs = _ids_in(first.claim(_all, parse=False, limit=2).lines)
        assert first._kept is not None and first._kept.identity == kept_identity  # read on, not again
        assert [key for key, _ in pairs] == ["a3", "a4"]
        other.compact()  # another file at the name now; its inode cannot be the kept one's
        pairs = _ids_in(first.claim(_all, parse=False, limit=100).lines)
        assert sorted(key for key, _ in pairs) == ["a5", "a6", "a7", "n0"]
        assert all(key == inside for key, inside in pairs)


def test_the_kept_descriptor_holds_no_lock_between_claims(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as first:
        first.add_many([_record(f"a{i}", f"http://127.0.0.1/a{i}") for i in range(5)])
        first.claim(_all, parse=False, limit=1)
        assert first._kept is not None
        probe = subprocess.run(
            [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
             "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked')", str(path)],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert probe.stdout.strip() == "locked", probe.stderr
        with open(path, "rb") as mine:
            fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)  # not even against this process
        with open("/proc/locks") as locks:
            inode = str(path.stat().st_ino)
            assert not [line for line in locks if f":{inode} " in line]


# -- a planted FILE.torn ----------------------------------------------------------------------------


def test_a_fifo_planted_at_the_torn_name_sends_set_aside_lines_to_a_file_of_our_own(tmp_path):
    """A FIFO (or socket) nobody reads: open(O_WRONLY | O_NONBLOCK) fails with ENXIO before any check
    could refuse it, and every compaction of a file with a bad line failed with it."""
    path = tmp_path / "parked.jsonl"
    os.mkfifo(tmp_path / "parked.jsonl.torn", 0o600)
    with ParkFile(path) as lot:
        lot.add(_record("a0", "http://127.0.0.1/a0"))
        with open(path, "ab") as out:
            out.write(b"not json\n")
        assert lot.compact() == 1
        ours = [name for name in os.listdir(tmp_path) if name.endswith(".torn") and name != "parked.jsonl.torn"]
        assert len(ours) == 1 and (tmp_path / ours[0]).read_bytes() == b"not json\n"
        assert os.stat(tmp_path / ours[0]).st_mode & 0o777 == 0o600
        assert lot.torn_refused is not None
        assert read_log(path).bad == []


# -- crawls --------------------------------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest_twisted.ensureDeferred
async def test_crawls_in_a_loop_that_leave_records_for_a_next_claim_leak_no_descriptor(server, tmp_path, monkeypatch):
    """Each crawl claims a batch and keeps its fold (more are due); closing must close that descriptor."""
    monkeypatch.setattr(parkload, "CLAIM_RECORDS", 3)
    monkeypatch.setattr(parkload, "REFILL_BELOW", 0)  # never a second batch: the fold stays kept to the end
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    with ParkFile(park_file) as lot:
        lot.add_many([_record(f"r{i}", host.url(f"/{i}"), spider="list") for i in range(30)])
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_HOST_STATE": False}
    await crawl([], settings)  # the first builds what stays (reactor threads, the server's sockets)
    before = _open_fds()
    for _ in range(4):
        await crawl([], settings)
    assert _open_fds() <= before
    assert len(server.arrivals(host, status=200)) == 15


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


@pytest_twisted.ensureDeferred
async def test_a_full_disk_is_told_once_when_the_compaction_after_a_set_aside_fails_too(server, small_disk, monkeypatch, caplog):
    """The loader compacts after lines are set aside (found by a claim, or refused when rebuilt):
    on a full disk that compaction fails as the flush's does, and must be told as once per run."""
    from scrapy_retryafter import parking
    from scrapy_retryafter.parkrecord import iso

    monkeypatch.setattr(parking, "_FLUSH_INTERVAL", 0.2)
    monkeypatch.setattr(parking, "_COMPACT_AFTER", 1)
    free = server.add_host(HostConfig())
    server.start()
    park_file = small_disk / "parked.jsonl"
    urls = [free.url(f"/{i}") for i in range(6)]
    with ParkFile(park_file) as lot:
        lot.add_many([ParkRecord(url=url, slot="127.0.0.1", reason="over_cap", detail="x" * 600, attempts=1,
                                 not_before=time.time() - 1, request=None) for url in urls])
    bad = {"id": "data", "spider": "list", "url": "data:text/plain,x", "slot": "127.0.0.1", "reason": "over_cap",
           "detail": "", "attempts": 1, "not_before": iso(time.time() - 1), "request": None}
    with open(park_file, "a") as out:
        out.write(json.dumps(bad) + "\n")
    room = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(b"x" * (room.f_bavail * room.f_frsize))
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                "RETRY_AFTER_HOST_STATE": False, "DOWNLOAD_DELAY": 0.2}
    crawler = await crawl([], settings)
    assert sorted(url for url, _ in crawler.spider.seen) == sorted(urls)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "the disk is full" in errors[0], errors


def test_a_kept_fold_holds_one_copy_of_each_spider_slot_and_reason(tmp_path):
    """Held between claims for the whole crawl: 100,000 records held 300,000 copies of a few names
    (56 MB for a 42 MB file, 43 MB with them shared)."""
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add_many([_record(f"a{i}", f"http://127.0.0.1/a{i}") for i in range(20)])
        lot.claim(_all, parse=False, limit=1)
        entries = list(lot._kept.fold.records.values())
        assert len({id(entry.slot) for entry in entries}) == 1
        assert len({id(entry.reason) for entry in entries}) == 1
        assert len({id(entry.spider) for entry in entries}) == 1


BATCHES = '''
import scrapy_retryafter.parkload as parkload

parkload.CLAIM_RECORDS = 5
parkload.REFILL_BELOW = 2
'''


@pytest_twisted.ensureDeferred
async def test_a_process_killed_holding_claims_gives_them_to_one_that_keeps_its_fold(server, tmp_path):
    """Real processes: one claims a batch and hangs on it; another claims batches of the rest on a
    fold it keeps; the first is SIGKILLed: the second's next claims, read on from its kept fold, take
    the dead one's records, and every URL is answered 200 once after the kill."""
    import signal
    import textwrap
    from collections import Counter

    from .test_park_processes import _check_logs, make_project, pause, start_crawl, wait_all

    slow = server.add_host(HostConfig(latency=120.0))
    fast = server.add_host(HostConfig(latency=0.3))
    server.start()
    project = make_project(tmp_path / "project")
    with open(project / "parkproj" / "settings.py", "a") as settings:
        settings.write(textwrap.dedent(BATCHES))
    park_file = project / ".scrapy" / "retry_after" / "pages.parked.jsonl"
    held = [slow.url(f"/held/{n}") for n in range(5)]
    rest = [fast.url(f"/rest/{n}") for n in range(30)]
    with ParkFile(park_file) as lot:
        lot.add_many([ParkRecord(url=url, slot=url.split("/")[2], reason="over_cap", attempts=1,
                                 not_before=time.time(), request=None, spider="pages") for url in held + rest])
    holder = start_crawl(project, tmp_path / "holder.log", [], CONCURRENT_REQUESTS_PER_DOMAIN=8)
    deadline = time.monotonic() + 40
    while len(server.arrivals(slow)) < 5:
        assert holder.poll() is None and time.monotonic() < deadline, (tmp_path / "holder.log").read_text()
        await pause(0.1)
    keeper = start_crawl(project, tmp_path / "keeper.log", [])
    while len(server.arrivals(fast, status=200)) < 6:  # past its first batch: its fold is kept
        assert keeper.poll() is None and time.monotonic() < deadline + 40, (tmp_path / "keeper.log").read_text()
        await pause(0.1)
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    killed_at = time.monotonic()
    slow.config.latency = 0.0
    assert await wait_all([keeper], 60) == [0]
    text = _check_logs([tmp_path / "keeper.log"])
    after = Counter(slow.url(a.path) for a in server.arrivals(slow, status=200) if a.t > killed_at)
    assert sorted(after) == sorted(held) and set(after.values()) == {1}, text[-3000:]
    fetched = Counter(fast.url(a.path) for a in server.arrivals(fast, status=200))
    assert sorted(fetched) == sorted(rest) and set(fetched.values()) == {1}
    assert text.count("PAGE 200") == 35
    assert not park_file.exists() or read_log(park_file).records == {}


def test_a_refused_torn_name_on_a_full_disk_leaves_no_empty_file_of_our_own_per_try(small_disk):
    """Each compaction (each in a child of its own) that finds a bad line while FILE.torn is
    refused makes a private FILE.XXXXXXXX.torn; on a full disk the write fails and the empty file
    stayed, one more at every try."""
    path = small_disk / "parked.jsonl"
    os.symlink("/nonexistent", small_disk / "parked.jsonl.torn")
    with ParkFile(path) as lot:
        lot.add(_record("a0", "http://127.0.0.1/a0"))
    with open(path, "ab") as out:
        out.write(b"not json\n")
    room = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(b"x" * (room.f_bavail * room.f_frsize))
    for _ in range(3):
        with ParkFile(path) as lot, pytest.raises(OSError) as failed:
            lot.compact_apart()
        assert failed.value.errno == 28  # ENOSPC: the file stays as it is
    assert sorted(os.listdir(small_disk)) == ["filler", "parked.jsonl", "parked.jsonl.torn"]
    assert read_log(path).bad[0].line == b"not json\n"


def test_a_file_cleared_in_place_is_folded_again_when_most_stale_records_are_another_spiders(tmp_path):
    """Another spider's stale records are never read again by their offsets; the one left for this
    spider's next claim is, and its CRC tells the file was cleared and parked into again."""
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as first, ParkFile(path) as other:
        first.add_many([_record(f"a{i}", f"http://127.0.0.1/a{i}", spider="t") for i in range(10)])
        first.add(_record("x0", "http://127.0.0.1/x0", spider="s"))
        first.add(_record("x1", "http://127.0.0.1/x1", spider="s"))
        ours = lambda entry: entry.spider == "s"  # noqa: E731
        assert first.claim(ours, parse=False, limit=1).more == 1 and first._kept is not None
        os.truncate(path, 0)
        other.add_many([_record(f"b{i}", f"http://127.0.0.1/b{i}", spider="s") for i in range(13)])
        pairs = _ids_in(first.claim(ours, parse=False, limit=100).lines)
        assert all(key == inside for key, inside in pairs), pairs
        assert sorted(key for key, _ in pairs) == sorted(f"b{i}" for i in range(13))
