"""The per-host memory kept across runs: merge rules, bounds, and the file under hostile conditions."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_retryafter.hoststate import (
    MAX_HOSTS,
    HostMemory,
    HostMemoryError,
    HostRecord,
    Pace,
    Quota,
    Refusal,
    merge,
    merge_all,
    parse,
)

NOW = 1_800_000_000.0
DAY = 86400.0
WEEK = 7 * DAY


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def memory(tmp_path: Path, **kwargs) -> HostMemory:
    kwargs.setdefault("clock", Clock())
    return HostMemory(tmp_path / "retry_after" / "hosts.json", **kwargs)


def refused(until: float, at: float = NOW, reason: str = "Retry-After 3600s is over the 300s cap") -> HostRecord:
    return HostRecord(refusal=Refusal(until, reason, at))


def paced(rate: float, at: float = NOW) -> HostRecord:
    return HostRecord(pace=Pace(rate, at))


# --------------------------------------------------------------------------
# merge rules
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (refused(NOW + 10), refused(NOW + 100, at=NOW - 5), refused(NOW + 100, at=NOW - 5)),  # latest-ending
        (paced(8.0, at=NOW - 10), paced(3.0, at=NOW), paced(3.0, at=NOW)),  # newest pace, even if faster or slower
        (paced(3.0, at=NOW - 10), paced(8.0, at=NOW), paced(8.0, at=NOW)),
        (paced(8.0), paced(3.0), paced(3.0)),  # learned at the same instant: the slower
        (
            HostRecord(quota=Quota(60, 3600, NOW - 1)),
            HostRecord(quota=Quota(5000, 3600, NOW)),
            HostRecord(quota=Quota(5000, 3600, NOW)),
        ),
        (  # fields merge independently
            HostRecord(refusal=Refusal(NOW + 50, "a", NOW), pace=Pace(2.0, NOW - 100)),
            HostRecord(pace=Pace(5.0, NOW - 1), quota=Quota(10, 1, NOW - 2)),
            HostRecord(Refusal(NOW + 50, "a", NOW), Pace(5.0, NOW - 1), Quota(10, 1, NOW - 2)),
        ),
        (HostRecord(), paced(1.0), paced(1.0)),
    ],
)
def test_merge_rules(a, b, expected):
    assert merge(a, b) == expected
    assert merge(b, a) == expected


_TIMES = st.floats(min_value=NOW - 2 * WEEK, max_value=NOW + WEEK)
_RECORDS = st.builds(
    HostRecord,
    st.none() | st.builds(Refusal, _TIMES, st.sampled_from(["over_cap", "quota", ""]), _TIMES),
    st.none() | st.builds(Pace, st.floats(min_value=1e-6, max_value=1e6), _TIMES),
    st.none() | st.builds(Quota, st.floats(min_value=1, max_value=1e9), st.floats(min_value=0.001, max_value=WEEK), _TIMES),
)


@settings(max_examples=300, deadline=None)
@given(_RECORDS, _RECORDS, _RECORDS)
def test_merge_is_commutative_associative_idempotent(a, b, c):
    assert merge(a, b) == merge(b, a)
    assert merge(merge(a, b), c) == merge(a, merge(b, c))
    assert merge(a, a) == a
    assert merge(merge(a, b), b) == merge(a, b)


_HOSTS = st.sampled_from(["a.test", "b.test", "c.test", "d.test:8080"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(_HOSTS, _RECORDS, max_size=4), min_size=1, max_size=5), st.randoms())
def test_the_order_processes_write_in_does_not_matter(sources, rnd):
    """Any interleaving of saves ends with the same file: nothing newer is lost to something older."""
    shuffled = list(sources)
    rnd.shuffle(shuffled)
    one = merge_all(*sources, now=NOW, max_age=WEEK)
    other = merge_all(*shuffled, now=NOW, max_age=WEEK)
    stepwise: dict[str, HostRecord] = {}
    for source in shuffled:
        stepwise = merge_all(stepwise, source, now=NOW, max_age=WEEK)
    assert one == other == stepwise


def test_merge_all_drops_what_ran_out():
    merged = merge_all(
        {
            "ended.test": refused(NOW - 1),
            "old.test": paced(5.0, at=NOW - WEEK - 1),
            "fresh.test": paced(5.0, at=NOW - WEEK + 1),
            "mixed.test": HostRecord(refusal=Refusal(NOW - 1, "x", NOW - 10), pace=Pace(2.0, NOW)),
        },
        now=NOW,
        max_age=WEEK,
    )
    assert merged == {"fresh.test": paced(5.0, at=NOW - WEEK + 1), "mixed.test": paced(2.0)}


def test_merge_all_keeps_the_most_recently_updated_hosts():
    sources = {f"h{i}.test": paced(1.0, at=NOW - i) for i in range(50)}
    kept = merge_all(sources, now=NOW, max_age=WEEK, max_hosts=10)
    assert set(kept) == {f"h{i}.test" for i in range(10)}


# --------------------------------------------------------------------------
# the file
# --------------------------------------------------------------------------


def test_nothing_learned_creates_nothing(tmp_path):
    store = memory(tmp_path)
    assert store.save({}) == 0
    assert store.save({"a.test": HostRecord()}) == 0
    assert store.save({"a.test": refused(NOW - 1)}) == 0  # a refusal that already ended
    assert store.load() == {}
    assert not (tmp_path / "retry_after").exists()


def test_save_then_load(tmp_path):
    store = memory(tmp_path)
    record = HostRecord(Refusal(NOW + 3600, "over_cap", NOW), Pace(8.5, NOW), Quota(60, 3600, NOW))
    assert store.save({"api.test": record, "b.test": paced(2.0)}) == 2
    assert store.load() == {"api.test": record, "b.test": paced(2.0)}
    assert os.stat(store.path).st_mode & 0o777 == 0o600
    assert record.refused_until(NOW) == NOW + 3600
    assert record.refused_until(NOW + 3600) is None
    assert [p.name for p in store.path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_a_second_save_merges_not_overwrites(tmp_path):
    clock = Clock()
    first, second = memory(tmp_path, clock=clock), memory(tmp_path, clock=clock)
    first.save({"a.test": refused(NOW + 600), "b.test": paced(4.0, at=NOW - 5)})
    second.save({"a.test": refused(NOW + 60), "b.test": paced(9.0), "c.test": paced(1.0)})
    assert first.load() == {"a.test": refused(NOW + 600), "b.test": paced(9.0), "c.test": paced(1.0)}


def test_records_age_out(tmp_path):
    clock = Clock()
    store = memory(tmp_path, clock=clock, max_age=3600)
    store.save({"a.test": paced(4.0), "b.test": refused(NOW + 7200)})
    clock.now = NOW + 3601
    assert store.load() == {}  # the refusal too: learned more than max_age ago
    clock.now = NOW + 1800
    assert set(store.load()) == {"a.test", "b.test"}


def test_the_file_is_bounded_in_hosts(tmp_path):
    clock = Clock()
    store = memory(tmp_path, clock=clock, max_hosts=100)
    for batch in range(5):
        clock.now = NOW + batch
        store.save({f"h{batch}-{i}.test": paced(1.0, at=clock.now) for i in range(40)})
    kept = store.load()
    assert len(kept) == 100
    assert all(host.startswith(("h4-", "h3-", "h2-")) for host in kept)
    assert MAX_HOSTS == 10_000


def test_a_save_that_changes_nothing_does_not_write(tmp_path):
    store = memory(tmp_path)
    store.save({"a.test": paced(4.0)})
    before = os.stat(store.path).st_ino
    store.save({"a.test": paced(4.0, at=NOW - 10)})  # older than what the file holds
    assert os.stat(store.path).st_ino == before


def test_learned_values_are_bounded_before_they_are_written(tmp_path):
    store = memory(tmp_path)
    store.save({
        "a.test": HostRecord(refusal=Refusal(1e300, "x" * 10_000, NOW)),
        "b.test": HostRecord(pace=Pace(1e300, NOW), quota=Quota(1e300, 1e300, NOW)),
        "c.test": HostRecord(pace=Pace(float("nan"), NOW)),  # garbage from the caller: dropped
        "\x00bad": paced(1.0),
        "": paced(1.0),
    })
    loaded = store.load()
    assert set(loaded) == {"a.test", "b.test"}
    assert loaded["a.test"].refusal == Refusal(NOW + WEEK, "x" * 200, NOW)
    assert loaded["b.test"].pace == Pace(1e6, NOW)
    assert loaded["b.test"].quota == Quota(1e9, WEEK, NOW)


# --------------------------------------------------------------------------
# hostile files
# --------------------------------------------------------------------------


def _write(store: HostMemory, text: str | bytes) -> None:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _file(hosts: dict) -> str:
    return json.dumps({"version": 1, "hosts": hosts})


GOOD = {"pace": {"rate": 3.0, "at": NOW - 1}}


@pytest.mark.parametrize(
    "content, kept, set_aside",
    [
        ("", set(), 1),
        ('{"version": 1, "hosts": {"a.test": {"pace": {"rate": 3', set(), 1),  # truncated
        ("\x00\xff garbage", set(), 1),
        (b"\xff\xfe{}", set(), 1),
        ("[]", set(), 1),
        ('{"version": 2, "hosts": {}}', set(), 1),
        ('{"version": 1, "hosts": []}', set(), 1),
        ("[" * 100_000 + "]" * 100_000, set(), 1),  # deep enough to exhaust the recursion limit
        (_file({"a.test": GOOD, "b.test": "nope"}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"pace": {"rate": "3", "at": NOW}}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"pace": {"rate": True, "at": NOW}}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"pace": {"rate": -3, "at": NOW}}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"pace": {"rate": 0, "at": NOW}}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"pace": {"rate": 3}}}), {"a.test"}, 1),  # no time
        (_file({"a.test": GOOD, "b.test": {"pace": {"rate": 3, "at": NOW + 2 * DAY}}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"quota": {"quota": 5, "window": 0, "at": NOW}}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"refusal": {"until": NOW + 9, "reason": 5, "at": NOW}}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "b.test": {"refusal": [], "pace": None}}), {"a.test"}, 1),
        (_file({"a.test": GOOD, "x" * 600: GOOD, "\n": GOOD}), {"a.test"}, 2),
        (_file({"a.test": GOOD, "b.test": {"unknown": 1}}), {"a.test"}, 0),  # nothing in it: not kept
        ('{"version": 1, "hosts": {"a.test": {"pace": {"rate": NaN, "at": 1}}}}', set(), 1),
        ('{"version": 1, "hosts": {"a.test": {"pace": {"rate": Infinity, "at": 1}}}}', set(), 1),
        ('{"version": 1, "hosts": {"a.test": {"pace": {"rate": 1e999, "at": 1}}}}', set(), 1),
        ('{"version": 1, "hosts": {"a.test": {"pace": {"rate": ' + "9" * 5000 + ', "at": 1}}, "b.test": '
         + json.dumps(GOOD) + "}}", {"b.test"}, 1),
    ],
)
def test_garbage_is_set_aside_never_trusted(tmp_path, content, kept, set_aside):
    store = memory(tmp_path)
    _write(store, content)
    assert set(store.load()) == kept
    assert store.set_aside == set_aside
    # The next save keeps what was good, copies the bad file aside and writes a clean one.
    store.save({"new.test": paced(1.0)})
    assert set(store.load()) == kept | {"new.test"}
    assert store.set_aside == 0
    if set_aside:
        original = content if isinstance(content, bytes) else content.encode()
        assert store.bad_path.read_bytes() == original[: 1 << 20]


def test_huge_numbers_in_a_file_are_bounded(tmp_path):
    store = memory(tmp_path)
    _write(store, _file({
        "a.test": {"refusal": {"until": 1e300, "reason": "x" * 5000, "at": NOW - 10}},
        "b.test": {"pace": {"rate": 1e300, "at": NOW}, "quota": {"quota": 1e300, "window": 1e300, "at": NOW}},
        "c.test": {"pace": {"rate": 1e-300, "at": NOW}, "quota": {"quota": 1e-300, "window": 1e-300, "at": NOW}},
        "d.test": {"pace": {"rate": 2, "at": NOW + 3600}},  # another process's clock, an hour fast
    }))
    loaded = store.load()
    assert loaded["a.test"].refusal == Refusal(NOW - 10 + WEEK, "x" * 200, NOW - 10)
    assert loaded["b.test"] == HostRecord(pace=Pace(1e6, NOW), quota=Quota(1e9, WEEK, NOW))
    assert loaded["c.test"] == HostRecord(pace=Pace(1e-6, NOW), quota=Quota(1e-300, 0.001, NOW))
    assert loaded["d.test"].pace == Pace(2.0, NOW)


def test_a_hostile_refusal_does_not_renew_itself_run_after_run(tmp_path):
    clock = Clock()
    store = memory(tmp_path, clock=clock)
    _write(store, _file({"a.test": {"refusal": {"until": 1e300, "reason": "x", "at": NOW}}}))
    assert store.load()["a.test"].refused_until(NOW) == NOW + WEEK
    clock.now = NOW + WEEK + 1
    assert store.load() == {}


def test_a_symlink_is_refused(tmp_path):
    store = memory(tmp_path)
    target = tmp_path / "elsewhere.json"
    target.write_text(_file({"a.test": GOOD}))
    store.path.parent.mkdir(parents=True)
    store.path.symlink_to(target)
    with pytest.raises(HostMemoryError, match="symlink"):
        store.load()
    with pytest.raises(HostMemoryError, match="symlink"):
        store.save({"b.test": paced(1.0)})
    assert json.loads(target.read_text()) == json.loads(_file({"a.test": GOOD}))
    assert store.path.is_symlink()


def test_a_dangling_symlink_is_refused(tmp_path):
    store = memory(tmp_path)
    store.path.parent.mkdir(parents=True)
    store.path.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(HostMemoryError, match="symlink"):
        store.save({"b.test": paced(1.0)})
    assert not (tmp_path / "nowhere.json").exists()


def test_a_symlinked_lock_is_refused(tmp_path):
    store = memory(tmp_path)
    store.path.parent.mkdir(parents=True)
    store.lock_path.symlink_to(tmp_path / "victim")
    with pytest.raises(HostMemoryError, match="lock"):
        store.save({"b.test": paced(1.0)})
    assert not (tmp_path / "victim").exists()


def test_a_directory_at_the_path_is_refused(tmp_path):
    store = memory(tmp_path)
    store.path.mkdir(parents=True)
    with pytest.raises(HostMemoryError, match="not a regular file"):
        store.load()
    with pytest.raises(HostMemoryError, match="not a regular file"):
        store.save({"b.test": paced(1.0)})
    assert store.path.is_dir()


def test_a_fifo_at_the_path_does_not_hang(tmp_path):
    store = memory(tmp_path)
    store.path.parent.mkdir(parents=True)
    os.mkfifo(store.path)
    with pytest.raises(HostMemoryError, match="not a regular file"):
        store.load()


def test_a_file_in_place_of_the_directory_is_a_clear_error(tmp_path):
    (tmp_path / "retry_after").write_text("")
    with pytest.raises(HostMemoryError, match="directory"):
        memory(tmp_path).save({"b.test": paced(1.0)})


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path):
    store = memory(tmp_path)
    store.save({"a.test": paced(1.0)})
    before = store.path.read_bytes()

    def full(fd: int, data: bytes) -> None:
        os.write(fd, data[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    full_disk = memory(tmp_path, write=full)
    with pytest.raises(HostMemoryError, match="No space left"):
        full_disk.save({"b.test": paced(2.0)})
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["hosts.json", "hosts.json.lock"]


def test_an_oversized_file_is_cut_and_set_aside(tmp_path):
    store = memory(tmp_path, max_hosts=1)
    _write(store, _file({"a.test": GOOD}) + " " * 5 + "x" * (3 << 20))
    assert store.load() == {}
    assert store.set_aside == 1


def test_a_lock_held_too_long_is_a_clear_error(tmp_path):
    import fcntl

    store = memory(tmp_path, lock_timeout=0.05)
    store.path.parent.mkdir(parents=True)
    fd = os.open(store.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(HostMemoryError, match="stayed locked"):
            store.save({"a.test": paced(1.0)})
        assert store.load() == {}  # reading takes no lock
    finally:
        os.close(fd)
    store.save({"a.test": paced(1.0)})
    assert set(store.load()) == {"a.test"}


def test_works_without_fcntl(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fcntl", None)  # import fcntl raises ImportError
    store = memory(tmp_path)
    store.save({"a.test": paced(1.0)})
    store.save({"b.test": paced(1.0)})
    assert set(store.load()) == {"a.test", "b.test"}
    assert not store.lock_path.exists()


def test_parse_counts_each_bad_record():
    records, bad = parse(_file({"a.test": GOOD, "b.test": 1, "c.test": {"pace": 1}}).encode(), NOW)
    assert set(records) == {"a.test"}
    assert bad == 2


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=20,
    ),
    st.sampled_from(["refusal", "pace", "quota", "until", "rate", "at", "reason", "quota", "window"]),
)
def test_any_json_in_a_record_is_bounded_or_set_aside(value, key):
    hosts = {"a.test": {key: value}, "b.test": {"pace": {"rate": 1.0, key: value}}, "c.test": value}
    try:
        text = json.dumps({"version": 1, "hosts": hosts}).encode()
    except ValueError:
        return
    records, _ = parse(text, NOW)
    for record in records.values():
        if record.refusal is not None:
            assert record.refusal.until <= NOW + WEEK and record.refusal.at <= NOW
            assert len(record.refusal.reason) <= 200
        if record.pace is not None:
            assert 1e-6 <= record.pace.rate <= 1e6 and record.pace.at <= NOW
        if record.quota is not None:
            assert 0 < record.quota.quota <= 1e9 and 0.001 <= record.quota.window <= WEEK


# --------------------------------------------------------------------------
# several processes at once
# --------------------------------------------------------------------------

PROCESSES = 4
SAVES = 25


def _crawl_process(path: str, number: int, start) -> None:
    start.wait()
    store = HostMemory(path, clock=lambda: NOW)
    for i in range(SAVES):
        store.save({
            f"p{number}-{i}.test": paced(1.0 + i),
            "shared.test": refused(NOW + 100 * number + i, reason=f"p{number}"),
            f"pace-{i % 3}.test": paced(float(number), at=NOW - 100 + number * SAVES + i),
        })


def test_processes_saving_at_once_lose_nothing(tmp_path):
    path = tmp_path / "hosts.json"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [context.Process(target=_crawl_process, args=(str(path), n, start)) for n in range(PROCESSES)]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    loaded = HostMemory(path, clock=lambda: NOW).load()
    assert {f"p{n}-{i}.test" for n in range(PROCESSES) for i in range(SAVES)} <= set(loaded)
    last = PROCESSES - 1
    assert loaded["shared.test"].refusal == Refusal(NOW + 100 * last + SAVES - 1, f"p{last}", NOW)
    for k in range(3):  # the newest pace, whichever process wrote last
        assert loaded[f"pace-{k}.test"].pace.rate == float(last)
    assert len(loaded) == PROCESSES * SAVES + 1 + 3


def test_without_fcntl_a_lock_left_by_a_dead_process_is_broken(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fcntl", None)
    store = memory(tmp_path, lock_timeout=0.05)
    store.path.parent.mkdir(parents=True)
    store.lock_path.write_text("")
    with pytest.raises(HostMemoryError, match="stayed locked"):
        store.save({"a.test": paced(1.0)})
    old = os.stat(store.lock_path).st_mtime - 120
    os.utime(store.lock_path, (old, old))
    store.save({"a.test": paced(1.0)})
    assert set(store.load()) == {"a.test"}


def test_a_read_only_file_system_is_a_clear_error(tmp_path, monkeypatch):
    import tempfile

    def read_only(**kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    store = memory(tmp_path)
    store.save({"a.test": paced(1.0)})
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(HostMemoryError, match="Read-only file system"):
        store.save({"b.test": paced(1.0)})
    assert set(store.load()) == {"a.test"}
