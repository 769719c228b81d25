"""What the park file trusts: claims it cannot judge (another host) and the directories on its way."""

from __future__ import annotations

import json
import os
import time

import pytest

from scrapy_retryafter import parklock, parkowner
from scrapy_retryafter.__main__ import main
from scrapy_retryafter.parkfile import Owner, ParkFile, ParkFileError, ParkRecord

LEASE = parkowner.CLAIM_LEASE


def _record(url: str) -> ParkRecord:
    return ParkRecord(url=url, slot="127.0.0.1", reason="over_cap", attempts=1, not_before=time.time(), request=None)


def _take_all(entry):
    return True


def _forge(path, ids, owner: Owner, **extra) -> None:
    with open(path, "a") as out:
        out.write(json.dumps({"claim": ids, "by": owner.to_raw(), **extra}) + "\n")


def _elsewhere() -> Owner:
    host, boot, ns, pid, start = parkowner.this_process()
    return Owner("another-host.example", "other-boot", ns, 4242, 17, "forged")


@pytest.mark.parametrize(
    ("extra", "held"),
    [
        ({}, False),  # no time: a line of the old format, or forged; held forever before
        ({"at": 1.0}, False),  # 1970: long past its lease
        ("lease-1", False),
        ("now", True),  # a fresh claim from another machine is kept for its lease
        ("future", False),  # dated ahead of the clock: not trusted
    ],
)
def test_a_claim_from_another_host_holds_only_for_its_lease(tmp_path, extra, held):
    path = tmp_path / "parked.jsonl"
    now = time.time()
    when = {"lease-1": now - LEASE - 1, "now": now, "future": now + 3600}
    if isinstance(extra, str):
        extra = {"at": when[extra]}
    with ParkFile(path) as lot:
        record = _record("http://127.0.0.1/a")
        lot.add(record)
        _forge(path, [record.id], _elsewhere(), **extra)
        got = [r.id for r in lot.claim(_take_all).records]
        assert got == ([] if held else [record.id])


def test_a_foreign_claim_in_another_pid_namespace_is_leased_too(tmp_path):
    host, boot, ns, pid, start = parkowner.this_process()
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        old, fresh = _record("http://127.0.0.1/old"), _record("http://127.0.0.1/fresh")
        lot.add_many([old, fresh])
        _forge(path, [old.id], Owner(host, boot, "pid:[1]", 1, 1, "n"), at=time.time() - LEASE - 60)
        _forge(path, [fresh.id], Owner(host, boot, "pid:[1]", 1, 1, "n"), at=time.time())
        assert [r.id for r in lot.claim(_take_all).records] == [old.id]


def test_compaction_keeps_a_leased_claim_with_its_time_and_drops_an_expired_one(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        kept, expired = _record("http://127.0.0.1/kept"), _record("http://127.0.0.1/expired")
        lot.add_many([kept, expired])
        at = round(time.time(), 3)
        _forge(path, [kept.id], _elsewhere(), at=at)
        _forge(path, [expired.id], _elsewhere(), at=at - LEASE - 5)
        assert lot.compact() == 2
        claims = [json.loads(line) for line in path.read_text().splitlines() if '"claim"' in line]
        assert claims == [{"claim": [kept.id], "by": _elsewhere().to_raw(), "at": at}]
        assert [r.id for r in lot.claim(_take_all).records] == [expired.id]


def test_our_own_claims_carry_their_time(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add(_record("http://127.0.0.1/a"))
        before = time.time()
        lot.claim(_take_all)
        line = json.loads(path.read_text().splitlines()[-1])
        assert before - 1 <= line["at"] <= time.time() + 1


@pytest.mark.parametrize("at", ['"yesterday"', "-5", "true", "1e300", "NaN", "[1]", "null"])
def test_a_claim_line_with_a_hostile_time_is_set_aside_and_frees_nothing_it_should_not(tmp_path, at):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        record = _record("http://127.0.0.1/a")
        lot.add(record)
        with open(path, "a") as out:
            out.write(f'{{"claim":["{record.id}"],"by":{json.dumps(_elsewhere().to_raw())},"at":{at}}}\n')
        claimed = lot.claim(_take_all)
        assert [r.id for r in claimed.records] == [record.id]
        assert [bad.why for bad in claimed.bad] == ["claim line has a malformed time"]


@pytest.mark.parametrize(
    "line",
    [
        '{"claim":["x"],"by":{},"at":1,"extra":2}',
        '{"done":["x"],"at":1}',
        '{"release":["x"],"by":{},"at":1}',
        '{"claim":["x"],"done":["x"]}',
    ],
)
def test_a_change_line_with_keys_it_may_not_have_is_set_aside(tmp_path, line):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add(_record("http://127.0.0.1/a"))
        with open(path, "a") as out:
            out.write(line + "\n")
        assert [bad.why for bad in lot.claim(_take_all).bad] == ["not a park-file line"]


def test_the_command_counts_only_claims_that_hold(tmp_path, capsys):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        records = [_record(f"http://127.0.0.1/{i}") for i in range(2)]
        lot.add_many(records)
        _forge(path, [records[0].id], _elsewhere(), at=time.time())
        _forge(path, [records[1].id], _elsewhere())
    assert main(["parked", str(path)]) == 0
    assert "2 parked request(s) in" in capsys.readouterr().out.replace(str(path), "")
    assert main(["parked", str(path)]) == 0
    assert ", 1 claimed by a running crawl" in capsys.readouterr().out


# -- the directories on the way ----------------------------------------------------------


def _refused(path, match):
    with ParkFile(path) as lot:
        with pytest.raises(ParkFileError, match=match):
            lot.check()
        with pytest.raises(ParkFileError, match=match):
            lot.add(_record("http://127.0.0.1/a"))


def test_a_world_writable_directory_without_the_sticky_bit_is_refused_by_name(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    _refused(shared / "parked.jsonl", f"its directory {shared} is unsafe: it is writable by every user "
                                      r"\(mode 0777\) and has no sticky bit")
    _refused(shared / "sub" / "deeper" / "parked.jsonl", f"{shared} is unsafe")
    assert os.listdir(shared) == []  # nothing created under it


def test_a_sticky_world_writable_directory_like_tmp_is_accepted(tmp_path):
    shared = tmp_path / "sticky"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with ParkFile(shared / "parked.jsonl") as lot:
        lot.check()
        lot.add(_record("http://127.0.0.1/a"))
        assert len(lot.read().records) == 1


def test_a_directory_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 54321, 54321)
    _refused(theirs / "parked.jsonl", r"belongs to another user \(uid 54321\)")
    # Root over a project of another uid (a container with a bind mount) is told what to do.
    _refused(theirs / "parked.jsonl", r"runs as root and trusts only the owner of its project directory.*run it as uid 54321, e\.g\. docker run --user 54321")


def test_a_group_writable_directory_is_refused_unless_the_group_is_ours_alone(tmp_path):
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o775)
    if os.geteuid() == 0:
        os.chown(group, 0, 54321)
        _refused(group / "parked.jsonl", "writable by group 54321")
        os.chown(group, 0, os.getegid())
    with ParkFile(group / "parked.jsonl") as lot:
        if parklock._private_group(os.getegid()):  # umask 002 systems: the user's own group
            lot.check()
        else:
            with pytest.raises(ParkFileError, match="writable by group"):
                lot.check()


def test_a_symlinked_project_directory_is_followed_when_both_ends_are_safe(tmp_path):
    real = tmp_path / "real-project"
    real.mkdir()
    (tmp_path / "project").symlink_to(real)
    path = tmp_path / "project" / ".scrapy" / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.check()
        lot.add(_record("http://127.0.0.1/a"))
    assert (real / ".scrapy" / "parked.jsonl").exists()


def test_a_symlink_into_a_shared_directory_is_refused_naming_where_it_leads(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "planted").mkdir()
    (tmp_path / ".scrapy").symlink_to(shared / "planted")
    _refused(tmp_path / ".scrapy" / "parked.jsonl", f"{shared} \\(where {tmp_path / '.scrapy'} leads\\)")
    assert os.listdir(shared / "planted") == []


def test_a_symlink_in_a_directory_others_can_write_is_refused_even_to_a_safe_target(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    safe = tmp_path / "safe"
    safe.mkdir()
    (shared / "link").symlink_to(safe)
    os.chmod(shared, 0o777)  # anyone could point the link elsewhere at any time
    _refused(shared / "link" / "parked.jsonl", f"its directory {shared} is unsafe")
    assert os.listdir(safe) == []


def test_a_directory_made_unsafe_after_a_handle_checked_it_is_refused(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    os.chmod(second, 0o777)
    (tmp_path / "current").symlink_to(first)
    path = tmp_path / "current" / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add(_record("http://127.0.0.1/a"))
        (tmp_path / "current").unlink()
        (tmp_path / "current").symlink_to(second)  # swapped to an unsafe directory
        with pytest.raises(ParkFileError, match="unsafe"):
            lot.add(_record("http://127.0.0.1/b"))
    assert os.listdir(second) == []


def test_directories_parking_creates_are_private_whatever_the_umask(tmp_path):
    # Path.mkdir(parents=True) gave the missing parents 0777 & ~umask: under umask 0 (some
    # containers and services) the first park made .scrapy world-writable, then refused it.
    path = tmp_path / "project" / ".scrapy" / "retry_after" / "spider.parked.jsonl"
    previous = os.umask(0)
    try:
        with ParkFile(path) as lot:
            lot.add(_record("http://127.0.0.1/a"))
            lot.add(_record("http://127.0.0.1/b"))
            assert len(lot.read().records) == 2
    finally:
        os.umask(previous)
    for directory in (path.parent, path.parent.parent, path.parent.parent.parent):
        assert os.stat(directory).st_mode & 0o077 == 0, directory


def test_a_claim_naming_a_pid_no_system_has_frees_its_record_where_there_is_no_proc(tmp_path, monkeypatch):
    # Without /proc (macOS, BSD) the owner is judged by os.kill(pid, 0), which raised
    # OverflowError for a pid past a C int: the claim, and every load of the file, crashed.
    monkeypatch.setattr(parkowner, "_start_time", lambda pid: None)
    host, boot, ns, pid, start = parkowner.this_process()
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        record = _record("http://127.0.0.1/a")
        lot.add(record)
        _forge(path, [record.id], Owner(host, boot, ns, 2**62, 1, "n"), at=time.time())
        claimed = lot.claim(_take_all)
        assert [r.id for r in claimed.records] == [record.id]
        assert [bad.why for bad in claimed.bad] == ["claim owner has a malformed pid or start time"]


def test_a_park_file_name_too_long_for_its_temporary_file_is_refused_at_check(tmp_path):
    # A 248-byte name parked, but every compaction failed with ENAMETOOLONG on its
    # .NAME.XXXXXXXX.tmp file: handled records were never removed, nor the file.
    fits = tmp_path / ("a" * 241)
    with ParkFile(fits) as lot:
        lot.check()
        record = _record("http://127.0.0.1/a")
        lot.add(record)
        lot.done([record.id])
        assert lot.compact() == 0 and not fits.exists()
    with ParkFile(tmp_path / ("a" * 242)) as lot, pytest.raises(ParkFileError, match="would not fit a file name"):
        lot.check()
