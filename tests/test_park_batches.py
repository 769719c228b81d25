"""Claims take a bounded batch: by count and by bytes, one record at least, the rest left for the next."""

from __future__ import annotations

import threading
import time
import tracemalloc

from scrapy_retryafter import parkload
from scrapy_retryafter.parkfile import ParkFile, ParkRecord, encode_value


def _records(count: int, body: int = 0, spider: str = "s") -> list[ParkRecord]:
    out = []
    for i in range(count):
        url = f"http://127.0.0.1:1/item/{i}"
        request = {"url": url, "method": "POST", "body": b"x" * body} if body else None
        out.append(ParkRecord(url=url, slot="127.0.0.1", reason="over_cap", attempts=1, not_before=time.time(),
                              request=encode_value(request) if request else None, spider=spider))
    return out


def _take_all(entry):
    return True


def _ids(claimed) -> list[str]:
    return [record_id for _, record_id, _ in claimed.lines] or [record.id for record in claimed.records]


def test_claims_by_count_take_one_batch_each_in_file_order_until_none_is_left(tmp_path):
    path = tmp_path / "parked.jsonl"
    records = _records(25)
    with ParkFile(path) as lot:
        lot.add_many(records)
    got, handles = [], []
    for expected, more in ((10, 15), (10, 5), (5, 0), (0, 0)):
        handles.append(ParkFile(path))  # another claimer; open, so its claims hold
        claimed = handles[-1].claim(_take_all, parse=False, limit=10)
        assert (len(claimed.lines), claimed.more) == (expected, more)
        got += _ids(claimed)
    assert got == [record.id for record in records]
    handles[0].close()  # a claimer gone: its batch is the next one claimed
    assert _ids(handles[1].claim(_take_all, parse=False, limit=10)) == got[:10]
    for handle in handles:
        handle.close()


def test_a_batch_is_bounded_by_bytes_and_a_record_over_the_bound_is_claimed_alone(tmp_path):
    path = tmp_path / "parked.jsonl"
    small, large = _records(6, body=1000), _records(1, body=50_000)
    for record in large:
        record.url = record.request["url"] = "http://127.0.0.1:1/large"
    line = len(small[0].to_line()) + 1
    with ParkFile(path) as lot:
        lot.add_many(large + small)
        first = lot.claim(_take_all, parse=False, max_bytes=line * 4)
        assert _ids(first) == [large[0].id] and first.more == 6  # alone, though over the bound
        second = lot.claim(_take_all, parse=False, max_bytes=line * 4)
        assert _ids(second) == [r.id for r in small[:4]] and second.more == 2
        third = lot.claim(_take_all, parse=True, max_bytes=line * 4)
        assert _ids(third) == [r.id for r in small[4:]] and third.more == 0


def test_a_claim_of_a_batch_keeps_the_batch_in_memory_not_the_file(tmp_path):
    path = tmp_path / "parked.jsonl"
    count, batch = 10_000, 500
    with ParkFile(path) as lot:
        lot.add_many(_records(count, body=4000))
    size = path.stat().st_size
    line = size // count
    with ParkFile(path) as lot:
        tracemalloc.start()
        try:
            claimed = lot.claim(_take_all, parse=False, limit=batch)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(claimed.lines) == batch and claimed.more == count - batch
        # The batch's lines twice over, and a small entry per record of the file (no line of it).
        assert peak < 2 * batch * line + count * 1024, (peak, size)
        assert peak < size / 4, (peak, size)


def test_two_processes_racing_for_the_last_batch_split_it_and_never_share_a_record(tmp_path):
    path = tmp_path / "parked.jsonl"
    records = _records(300)
    with ParkFile(path) as lot:
        lot.add_many(records)
    handles = [ParkFile(path) for _ in range(4)]
    got: list[list[str]] = [[] for _ in handles]
    start = threading.Barrier(len(handles))

    def claim(index: int) -> None:
        start.wait()
        while True:
            claimed = handles[index].claim(_take_all, parse=False, limit=40)
            if not claimed.lines:
                return
            got[index] += _ids(claimed)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(handles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    every = [record_id for share in got for record_id in share]
    assert sorted(every) == sorted(record.id for record in records)  # each once, none left
    for handle in handles:
        handle.close()


def test_a_later_line_of_a_record_is_the_one_claimed_and_other_spiders_records_are_not_counted(tmp_path):
    path = tmp_path / "parked.jsonl"
    mine, theirs = _records(3), _records(5, spider="other")
    with ParkFile(path) as lot:
        lot.add_many(mine + theirs)
        replaced = ParkRecord(url="http://127.0.0.1:1/replaced", slot="127.0.0.1", reason="over_cap", attempts=2,
                              not_before=time.time(), request=None, spider="s")
        replaced.id = mine[0].id
        lot.add(replaced)
        first = lot.claim(lambda entry: entry.spider == "s", parse=False, limit=2)
        assert first.more == 1  # only this spider's due records count for the next batch
        assert _ids(first) == [mine[1].id, mine[2].id]  # a record written again goes to the end
        claimed = lot.claim(lambda entry: entry.spider == "s", parse=False, limit=2)
        assert claimed.more == 0
        by_id = {record_id: line for _, record_id, line in claimed.lines}
        assert b"/replaced" in by_id[mine[0].id] and by_id[mine[0].id] == replaced.to_line().encode()


def test_the_loader_s_bounds_are_a_few_thousand_records_and_a_few_mb():
    assert 1000 <= parkload.CLAIM_RECORDS <= 50_000
    assert 1 << 20 <= parkload.CLAIM_BYTES <= 64 << 20
    assert parkload.CLAIM_BYTES >= 16 * 1024 * 1024  # MAX_LINE: the largest record fits a batch of its own
    assert 0 < parkload.REFILL_BELOW < parkload.CLAIM_RECORDS


def test_a_record_line_written_by_hand_is_claimed_by_its_bytes_and_a_claim_after_a_torn_tail_holds(tmp_path):
    path = tmp_path / "parked.jsonl"
    first, second = _records(2)
    with ParkFile(path) as lot:
        lot.add(first)
    with open(path, "a") as out:
        out.write("   " + second.to_line())
        out.write('{"id": "torn')  # a writer that died mid-line
    with ParkFile(path) as lot:
        claimed = lot.claim(_take_all, parse=False, limit=1)
        assert _ids(claimed) == [first.id] and claimed.more == 1
        assert [bad.why for bad in claimed.bad] == ["torn line (no newline at the end)"]
        claimed = lot.claim(_take_all, parse=False, limit=1)
        assert [line for _, _, line in claimed.lines] == [("   " + second.to_line()).encode()]
        assert [bad.why for bad in claimed.bad] == ["not a JSON line (a torn write?)"]  # a line of its own now
        assert ParkRecord.from_line(claimed.lines[0][2].decode()).url == second.url
        # Claims appended after the torn line were not glued to it: both hold, nothing is free.
        assert lot.claim(_take_all, parse=False).lines == []
