"""The park file on its own: round trips, privacy, claims, durability, hostile files, the command."""

from __future__ import annotations

import collections
import errno
import json
import os
import stat
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_retryafter import parkcompact, parkfile, parkfold, parklock, parkowner
from scrapy_retryafter.__main__ import main
from scrapy_retryafter.parkfile import (
    Fold,
    Owner,
    ParkFile,
    ParkFileError,
    ParkRecord,
    decode_value,
    encode_value,
    iso,
    parse_iso,
    read_log,
)

_json_leaf = st.none() | st.booleans() | st.integers() | st.text() | st.binary() | st.floats(allow_nan=False)
_values = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text() | st.binary(), inner, max_size=4),
    max_leaves=20,
)


@given(_values)
def test_encode_decode_round_trips_bytes_and_byte_keyed_dicts(value):
    assert decode_value(encode_value(value)) == value


def test_values_json_cannot_hold_are_refused():
    with pytest.raises(TypeError):
        encode_value({"callback": lambda: None})
    with pytest.raises(TypeError):
        encode_value({1, 2})


@given(st.floats(min_value=0, max_value=4e9))
def test_not_before_round_trips_through_iso_8601_to_the_millisecond(when):
    text = iso(when)
    assert text.endswith("Z")
    assert abs(parse_iso(text) - when) <= 0.001


def _record(url: str = "http://127.0.0.1/a", slot: str = "127.0.0.1", reason: str = "over_cap", when: float = 0.0) -> ParkRecord:
    return ParkRecord(url=url, slot=slot, reason=reason, attempts=1, not_before=when or time.time(), request=None)


def _take_all(entry):
    return True


def _urls(fold: Fold) -> list[str]:
    return sorted(entry.url for entry in fold.records.values())


def test_the_file_is_private_made_only_when_written_and_records_survive_a_new_handle(tmp_path):
    path = tmp_path / "sub" / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.check()
        assert lot.claim(_take_all).records == [] and lot.compact() == 0
        lot.done(["x"])
        assert not (tmp_path / "sub").exists()  # nothing parked: nothing on disk
        first, second = _record("http://127.0.0.1/1"), _record("http://127.0.0.1/2")
        lot.add_many([first, second])
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        lot.done([first.id])
        assert lot.compact() == 1
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # the rewrite too
        lot.add(_record("http://127.0.0.1/3"))
    assert sorted(os.listdir(path.parent)) == ["parked.jsonl"]  # no lock file, no temporary file
    with ParkFile(path) as lot:
        assert _urls(lot.read()) == ["http://127.0.0.1/2", "http://127.0.0.1/3"]


def test_a_later_record_with_the_same_id_replaces_the_earlier_and_frees_its_claim(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot, ParkFile(path) as other:
        record = _record(reason="over_cap")
        lot.add(record)
        assert [r.id for r in lot.claim(_take_all).records] == [record.id]
        assert other.claim(_take_all).records == []
        record.reason = "held_at_close"
        lot.add(record)  # parked again: back in the pool
        assert [r.reason for r in other.claim(_take_all).records] == ["held_at_close"]


def test_claims_are_exclusive_and_a_closed_handles_claims_come_back(tmp_path):
    path = tmp_path / "parked.jsonl"
    first, second = ParkFile(path), ParkFile(path)
    first.add_many([_record(f"http://127.0.0.1/{i}") for i in range(5)])
    taken = first.claim(lambda entry: entry.url.endswith(("/0", "/1", "/2")))
    assert sorted(r.url[-1] for r in taken.records) == ["0", "1", "2"]
    assert sorted(r.url[-1] for r in second.claim(_take_all).records) == ["3", "4"]
    assert second.claim(_take_all).records == []
    first.close()  # a handle gone without releasing (a crawl that died in this process)
    assert sorted(r.url[-1] for r in second.claim(_take_all).records) == ["0", "1", "2"]
    second.close()


def test_a_released_claim_and_a_dead_process_claim_are_free_and_compaction_drops_dead_claims(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot, ParkFile(path) as other:
        records = [_record(f"http://127.0.0.1/{i}") for i in range(3)]
        lot.add_many(records)
        lot.claim(lambda entry: entry.url.endswith("/0"))
        lot.release([records[0].id])
        assert [r.url for r in other.claim(lambda entry: entry.url.endswith("/0")).records] == [records[0].url]
        # A claim by a process that has exited (its pid and start time no longer match).
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        start = parkowner._start_time(child.pid)
        child.wait()
        host, boot, ns, _, _ = parkowner.this_process()
        dead = Owner(host, boot, ns, child.pid, start or 1, "n")
        with open(path, "a") as out:
            out.write(json.dumps({"claim": [records[1].id], "by": dead.to_raw()}) + "\n")
        assert not parkowner.owner_alive(dead)
        assert other.compact() == 3
        # Dead and released claims gone (compared by owner, not by substring: a pid can occur in a hex id).
        owners = [json.loads(line).get("by") for line in path.read_text().splitlines()]
        assert dead.to_raw() not in owners and all(o is None or o["nonce"] != lot.owner.nonce for o in owners), owners
        assert sorted(r.url for r in lot.claim(_take_all).records) == [records[1].url, records[2].url]


def test_a_claim_from_another_boot_is_free_and_one_from_another_machine_is_kept():
    host, boot, ns, pid, start = parkowner.this_process()
    assert not parkowner.owner_alive(Owner(host, "another-boot", ns, pid, start, "n"))
    assert parkowner.owner_alive(Owner("another-host", boot, ns, 1, 1, "n"))


def test_a_torn_last_line_is_set_aside_at_compaction_and_the_next_append_stays_whole(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add(_record("http://127.0.0.1/whole"))
        torn = '{"id":"x","url":"http://127.0.0.1/torn","not_be'
        with open(path, "a") as out:
            out.write(torn)
        lot.add(_record("http://127.0.0.1/after"))  # starts on a line of its own
        fold = lot.read()
        assert _urls(fold) == ["http://127.0.0.1/after", "http://127.0.0.1/whole"]
        assert [bad.line for bad in fold.bad] == [torn.encode() + b"\n"]
        assert lot.compact() == 2
    assert path.with_name("parked.jsonl.torn").read_text() == torn + "\n"
    assert read_log(path).bad == []


def test_compaction_to_nothing_removes_the_file(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        record = _record()
        lot.add(record)
        lot.done([record.id])
        assert lot.compact() == 0
    assert os.listdir(tmp_path) == []


def test_lines_appended_during_a_compaction_are_kept(tmp_path, monkeypatch):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot, ParkFile(path) as other:
        lot.add_many([_record(f"http://127.0.0.1/{i}") for i in range(3)])
        real_fsync = lot._fsync
        late = _record("http://127.0.0.1/late")

        def fsync_then_append(fd):
            real_fsync(fd)
            if not getattr(fsync_then_append, "done", False):
                fsync_then_append.done = True
                other.add(late)  # another process parks while the rewrite is built

        lot._fsync = fsync_then_append
        lot.compact()
        assert late.url in _urls(lot.read()) and len(lot.read().records) == 4


# -- durability -------------------------------------------------------------------------------


def test_short_writes_are_looped(tmp_path):
    calls = []

    def one_byte(fd, data):
        calls.append(len(data))
        return os.write(fd, data[:7])

    path = tmp_path / "parked.jsonl"
    with ParkFile(path, write=one_byte) as lot:
        lot.add_many([_record("http://127.0.0.1/1"), _record("http://127.0.0.1/2")])
    assert len(calls) > 10
    assert _urls(read_log(path)) == ["http://127.0.0.1/1", "http://127.0.0.1/2"]


@pytest.mark.parametrize("failure", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_raises_and_leaves_no_part_of_the_record(tmp_path, failure):
    path = tmp_path / "parked.jsonl"
    state = {"written": 0}

    def fails_half_way(fd, data):
        if state["written"] > 40:
            raise OSError(failure, os.strerror(failure))
        state["written"] += 30
        return os.write(fd, data[:30])

    with ParkFile(path) as lot:
        lot.add(_record("http://127.0.0.1/kept"))
        size = path.stat().st_size
    with ParkFile(path, write=fails_half_way) as lot:
        with pytest.raises(ParkFileError, match="could not write the park file") as raised:
            lot.add(_record("http://127.0.0.1/lost"))
        assert isinstance(raised.value, OSError) and raised.value.errno == failure
    assert path.stat().st_size == size
    fold = read_log(path)
    assert _urls(fold) == ["http://127.0.0.1/kept"] and fold.bad == []


def test_a_failed_fsync_raises_and_a_failed_first_write_leaves_no_file(tmp_path):
    def no_fsync(fd):
        raise OSError(errno.EIO, "I/O error")

    with ParkFile(tmp_path / "parked.jsonl", fsync=no_fsync) as lot:
        with pytest.raises(ParkFileError):
            lot.add(_record())
    assert os.listdir(tmp_path) == []


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_on_a_full_disk_every_record_is_whole_or_refused_and_compaction_leaves_no_temporary(small_disk):
    path = small_disk / "parked.jsonl"
    kept, refused = [], []
    with ParkFile(path) as lot:
        for i in range(200):
            record = _record(f"http://127.0.0.1/{i}")
            record.detail = "x" * 1500
            try:
                lot.add(record)
                kept.append(record.url)
            except ParkFileError as error:
                assert error.errno == errno.ENOSPC
                refused.append(record.url)
        assert kept and refused
        fold = lot.read()
        assert sorted(kept) == _urls(fold) and fold.bad == []
        # Compaction needs a second copy: on the full disk it fails and removes its temporary file.
        with pytest.raises(OSError):
            lot.compact()
        with pytest.raises(ParkFileError, match="could not compact") as failed:
            lot.compact_apart()  # the same in the child process a crawl compacts in
        assert failed.value.errno == errno.ENOSPC  # a full disk, told apart from other failures
        assert _urls(lot.read()) == sorted(kept)
    assert sorted(os.listdir(small_disk)) == ["parked.jsonl"]
    assert _urls(read_log(path)) == sorted(kept)


# -- hostile files ----------------------------------------------------------------------------


def test_a_symlinked_park_file_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    os.chmod(target, 0o644)
    path = tmp_path / "parked.jsonl"
    path.symlink_to(target)
    with ParkFile(path) as lot:
        with pytest.raises(ParkFileError, match="is a symlink; refusing to follow it") as raised:
            lot.check()
        assert raised.value.errno == errno.ELOOP
        for operation in (lambda: lot.add(_record()), lot.compact, lambda: lot.claim(_take_all)):
            with pytest.raises(ParkFileError, match="symlink"):
                operation()
    assert target.read_text() == "precious\n" and stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_symlinked_torn_file_is_never_followed_and_lines_go_to_a_file_of_our_own(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    path = tmp_path / "parked.jsonl"
    path.write_text("garbage\n")
    os.chmod(path, 0o600)
    path.with_name("parked.jsonl.torn").symlink_to(target)
    with ParkFile(path) as lot:
        assert lot.compact() == 0  # set aside elsewhere, never through the symlink
        assert "symlink" in lot.torn_refused and lot.torn_path.name != "parked.jsonl.torn"
        assert lot.torn_path.read_text() == "garbage\n"
    assert target.read_text() == "precious\n"


def test_a_torn_file_planted_by_another_user_does_not_stop_set_aside(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a file of another user needs root")
    path = tmp_path / "parked.jsonl"
    planted = path.with_name("parked.jsonl.torn")
    planted.write_text("planted\n")
    os.chown(planted, 54321, 54321)
    with ParkFile(path) as lot:
        lot.add(_record())
        with open(path, "a") as out:
            out.write("garbage\n")
        assert lot.compact() == 1
        assert lot.torn_path.parent == tmp_path and lot.torn_path.name.startswith("parked.jsonl.")
        assert lot.torn_path.name.endswith(".torn") and lot.torn_path.read_text() == "garbage\n"
        assert stat.S_IMODE(lot.torn_path.stat().st_mode) == 0o600 and lot.torn_path.stat().st_uid == 0
        assert lot.read().bad == []  # gone from the park file
        with open(path, "a") as out:
            out.write("more garbage\n")
        lot.compact()  # the same file of our own, not one more
        assert lot.torn_path.read_text() == "garbage\nmore garbage\n"
    assert planted.read_text() == "planted\n" and planted.stat().st_uid == 54321
    assert len([name for name in os.listdir(tmp_path) if name.endswith(".torn")]) == 2


def test_a_symlink_planted_at_the_old_temporary_name_is_never_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add_many([_record(f"http://127.0.0.1/{i}") for i in range(2)])
        planted = tmp_path / f".parked.jsonl.{os.getpid()}.tmp"
        planted.symlink_to(target)
        lot.done([next(iter(lot.read().records))])
        assert lot.compact() == 1
    assert target.read_text() == "precious\n"
    assert not path.is_symlink() and planted.is_symlink()


def test_a_directory_a_fifo_a_foreign_or_hard_linked_file_is_refused(tmp_path):
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    with pytest.raises(ParkFileError, match="is a directory; RETRY_AFTER_PARK_FILE must name a file"):
        ParkFile(directory).check()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ParkFileError, match="not a regular file"):
        ParkFile(fifo).add(_record())
    linked = tmp_path / "linked.jsonl"
    (tmp_path / "elsewhere").write_text("")
    os.link(tmp_path / "elsewhere", linked)
    with pytest.raises(ParkFileError, match="hard links"):
        ParkFile(linked).add(_record())
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign.jsonl"
        foreign.write_text(_record().to_line())
        os.chown(foreign, 12345, 12345)
        with pytest.raises(ParkFileError, match="belongs to another user"):
            ParkFile(foreign).claim(_take_all)


def _raw(**fields):
    base = {"id": "r1", "url": "http://127.0.0.1/a", "slot": "s", "reason": "over_cap", "attempts": 1,
            "not_before": iso(time.time()), "request": None}
    base.update(fields)
    return json.dumps(base) + "\n"


@pytest.mark.parametrize(
    "line, why",
    [
        (_raw(url="file:///etc/passwd"), "scheme 'file'"),
        (_raw(url="data:text/plain,hello"), "scheme 'data'"),
        (_raw(request={"url": "file:///etc/passwd"}), "request.url has scheme 'file'"),
        (_raw(not_before="0001-01-01T00:00:00Z"), "outside 1970..9999"),
        (_raw(not_before="tomorrow"), "Invalid isoformat"),
        (_raw(not_before=12), "not an ISO 8601"),
        (_raw(attempts=10**30), "attempts"),
        (_raw(attempts="3"), "attempts"),
        (_raw(id="../../etc"), "id is not"),
        (_raw(slot=["x"]), "slot is not a string"),
        (_raw(request={"url": "http://x/", "_class": "this.s"}), None),
        (_raw(request={"url": "http://x/", "callback": "__init__"}), "request.callback"),
        (_raw(request={"url": "http://x/", "method": "GET /x HTTP/1.1\r\nHost: y"}), "request.method"),
        (_raw(request="x"), "request is not a mapping"),
        ('{"done": "r1"}\n', "not a park-file line"),
        ('{"claim": ["r1"], "by": {"pid": -1}}\n', "claim owner"),
        ("[" * 100000 + "\n", "not a JSON line"),
        ("\x1b]0;owned\x07\n", "not a JSON line"),
    ],
)
def test_a_malformed_or_hostile_line_is_set_aside_never_a_crash(tmp_path, line, why):
    path = tmp_path / "parked.jsonl"
    path.write_text(_raw(id="good", url="http://127.0.0.1/good") + line)
    os.chmod(path, 0o600)
    with ParkFile(path) as lot:
        claimed = lot.claim(_take_all)
        if why is None:  # well-formed here; the Scrapy side refuses it (tests/test_crawl_parking.py)
            assert len(claimed.records) == 2
            return
        assert [r.url for r in claimed.records] == ["http://127.0.0.1/good"]
        assert len(claimed.bad) == 1 and why in claimed.bad[0].why
        lot.compact()
    assert path.with_name("parked.jsonl.torn").read_text() == line
    assert read_log(path).bad == []


def test_a_line_over_the_limit_is_set_aside_by_its_head(tmp_path, monkeypatch):
    for module in (parkfile, parkfold):
        monkeypatch.setattr(module, "MAX_LINE", 10_000)
    for module in (parkfold, parklock, parkcompact):
        monkeypatch.setattr(module, "_CHUNK", 4096)
    path = tmp_path / "parked.jsonl"
    huge = '{"id":"big","url":"http://127.0.0.1/' + "a" * 50_000 + '"}\n'
    path.write_text(_raw(id="good") + huge + _raw(id="after", url="http://127.0.0.1/after"))
    os.chmod(path, 0o600)
    with ParkFile(path) as lot:
        claimed = lot.claim(_take_all)
        assert sorted(r.id for r in claimed.records) == ["after", "good"]
        assert [bad.why for bad in claimed.bad] == ["a line longer than 10000 bytes"]
        with pytest.raises(ParkFileError, match="over 10000"):
            lot.add(_record("http://127.0.0.1/" + "b" * 20_000))
        lot.compact()
    torn = path.with_name("parked.jsonl.torn").read_bytes()
    assert torn.startswith(b'{"id":"big"') and len(torn) < 5000


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["id", "url", "slot", "reason", "detail", "attempts", "not_before", "request", "spider",
                     "done", "claim", "release", "by"]),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    | st.lists(st.text(max_size=8), max_size=3) | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
))
def test_any_json_object_folds_without_raising(raw):
    fold = Fold()
    fold.apply(json.dumps(raw).encode("ascii") + b"\n")
    assert len(fold.records) + len(fold.bad) <= 1
    list(fold.free())


# -- without fcntl (Windows) ------------------------------------------------------------------


def test_the_package_imports_without_fcntl_and_parking_says_it_is_posix_only(tmp_path):
    script = (
        "import sys; sys.modules['fcntl'] = None\n"
        "import scrapy_retryafter\n"
        "from scrapy_retryafter.parkfile import ParkFile\n"
        f"ParkFile({str(tmp_path / 'p.jsonl')!r}).check()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "ModuleNotFoundError" not in done.stderr and "ImportError" not in done.stderr
    assert "parking needs POSIX file locks (fcntl)" in done.stderr and "RETRY_AFTER_PARKING = False" in done.stderr
    assert os.listdir(tmp_path) == []


# -- the command ------------------------------------------------------------------------------


def test_the_command_summarizes_per_slot_and_clears(tmp_path, capsys):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add(_record("http://127.0.0.1/1", "127.0.0.1", "over_cap", 2_000_000_000.0))
        lot.add(_record("http://127.0.0.1/2", "127.0.0.1", "retries_exhausted", 1_900_000_000.0))
        lot.add(_record("http://127.0.0.2/1", "127.0.0.2", "over_cap", 2_000_000_000.0))
    assert main(["parked", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 parked request(s)" in out
    line = next(line for line in out.splitlines() if line.startswith("127.0.0.1 "))
    assert line.split()[1] == "2"
    assert iso(1_900_000_000.0) in line and "over_cap 1, retries_exhausted 1" in line
    assert main(["parked", str(path), "--clear"]) == 0
    assert "cleared 3 parked request(s)" in capsys.readouterr().out
    assert not path.exists()


def test_the_command_on_a_hostile_file_neither_crashes_nor_prints_control_characters(tmp_path, capsys):
    path = tmp_path / "parked.jsonl"
    path.write_text(
        _raw(id="a", slot="\x1b[2J\x1b]0;pwned\x07", reason="over_cap\x1b[31m")
        + _raw(id="b", not_before="0001-01-01T00:00:00Z")
        + _raw(id="c", url="file:///etc/passwd")
        + "\x1b[2Jgarbage\n"
    )
    os.chmod(path, 0o600)
    assert main(["parked", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in out and "1 parked request(s)" in out
    assert "3 line(s) a run sets aside" in out


def test_clear_on_a_missing_file_is_an_error_and_creates_nothing(tmp_path, capsys):
    path = tmp_path / "typo" / "parked.jsonl"
    assert main(["parked", str(path), "--clear"]) == 1
    assert "no park file" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_the_command_refuses_a_symlink(tmp_path, capsys):
    (tmp_path / "parked.jsonl").symlink_to(tmp_path / "elsewhere")
    assert main(["parked", str(tmp_path / "parked.jsonl")]) == 1
    assert main(["parked", str(tmp_path / "parked.jsonl"), "--clear"]) == 1
    assert "symlink" in capsys.readouterr().err


def test_the_command_runs_as_a_module_and_reports_a_missing_file(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "scrapy_retryafter", "parked", str(tmp_path / "none.jsonl")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and "no park file" in done.stderr


# -- many writers, some killed mid-way -------------------------------------------------------

_WRITER = r'''
import json, random, sys, time
from scrapy_retryafter.parkfile import ParkFile, ParkRecord

path, seed, seconds, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rng = random.Random(seed)
log = open(out, "a")


def note(kind, ids):
    log.write(json.dumps({kind: ids}) + "\n")
    log.flush()


lot = ParkFile(path)
ends = time.monotonic() + seconds
n = 0
while time.monotonic() < ends:
    roll = rng.random()
    if roll < 0.45:
        batch = [ParkRecord(url=f"http://127.0.0.1/{seed}/{n + i}", slot="s", reason="over_cap", attempts=1,
                            not_before=time.time(), request={"url": f"http://127.0.0.1/{seed}/{n + i}", "body": "x" * rng.randrange(2000)})
                 for i in range(rng.randrange(1, 20))]
        n += len(batch)
        lot.add_many(batch)
        note("added", [r.id for r in batch])
    elif roll < 0.8:
        taken = [r.id for r in lot.claim(lambda entry: rng.random() < 0.5).records]
        note("claimed", taken)  # written before they are marked done: a kill after it may have done them
        lot.done(taken)
    else:
        lot.compact()
'''


def _noted(path) -> dict[str, list[str]]:
    noted: dict[str, list[str]] = {"added": [], "claimed": []}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                for kind, ids in json.loads(line).items():
                    noted[kind] += ids
    return noted


def test_concurrent_writers_and_writers_killed_mid_way_lose_nothing_and_share_no_claim(tmp_path):
    import random
    import signal

    path = tmp_path / "parked.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(os.path.dirname(os.path.dirname(__file__))), os.environ.get("PYTHONPATH", "")])}
    survivors = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(seed), "4", str(tmp_path / f"{seed}.log")], env=env)
        for seed in range(4)
    ]
    rng = random.Random(7)
    killed = 0
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        victim = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(100 + killed), "30", str(tmp_path / f"killed-{killed}.log")], env=env
        )
        time.sleep(0.6 + rng.random() * 0.5)  # start-up, then some work
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed += 1
    assert [p.wait(60) for p in survivors] == [0, 0, 0, 0]
    lived = [_noted(tmp_path / f"{seed}.log") for seed in range(4)]
    died = [_noted(tmp_path / f"killed-{k}.log") for k in range(killed)]
    claimed = collections.Counter(i for log in lived for i in log["claimed"])
    assert claimed and max(claimed.values()) == 1  # no record taken by two live processes
    with ParkFile(path) as lot:
        lot.compact()
        fold = lot.read()
    handled = {i for log in lived + died for i in log["claimed"]}
    added = {i for log in lived for i in log["added"]}
    assert not {i for log in lived for i in log["claimed"]} & set(fold.records)
    assert added - handled <= set(fold.records)  # every record not handled is still there
    print(f"{killed} writers killed; {len(added)} records added by the others, {len(handled)} handled, "
          f"{len(fold.records)} left, {len(fold.bad)} lines set aside")


def test_lines_appended_during_a_compaction_are_copied_in_linear_time(tmp_path, monkeypatch):
    # The lines another process appends while a compaction folds (one park_many of a
    # slot's whole queue) were joined with bytes += under the lock: quadratic, 4,000 lines
    # of 3 KB held the lock for seconds, past which other processes' parks fail.
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot, ParkFile(path) as other:
        lot.add(_record())
        write_folded = parkcompact.CompactingLog._write_folded
        burst = [ParkRecord(url=f"http://127.0.0.1/{n}", slot="127.0.0.1", reason="over_cap", attempts=1,
                            not_before=0.0, request=None, detail="d" * 3000) for n in range(4000)]

        parking = []

        def meanwhile(self, fd, fold, claims):
            began = time.perf_counter()
            other.add_many(burst)
            parking.append(time.perf_counter() - began)
            return write_folded(self, fd, fold, claims)

        monkeypatch.setattr(parkcompact.CompactingLog, "_write_folded", meanwhile)
        began = time.perf_counter()
        assert lot.compact() == 4001
        assert time.perf_counter() - began - parking[0] < 1.0  # 3 s before, 0.1 s after
        assert len(lot.read().records) == 4001
