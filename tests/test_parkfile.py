"""The park file on its own: round trips, privacy, the lock, torn lines, the command."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_retryafter.__main__ import main
from scrapy_retryafter.parkfile import (
    ParkFile,
    ParkFileLocked,
    ParkRecord,
    decode_value,
    encode_value,
    iso,
    parse_iso,
    read_records,
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


def test_file_and_lock_are_private_and_records_survive_a_reopen(tmp_path):
    path = tmp_path / "sub" / "parked.jsonl"
    with ParkFile(path) as lot:
        first, second = _record("http://127.0.0.1/1"), _record("http://127.0.0.1/2")
        lot.add(first)
        lot.add(second)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.with_name("parked.jsonl.lock")).st_mode) == 0o600
        assert lot.remove([first.id]) == 1
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # the rewrite too
        lot.add(_record("http://127.0.0.1/3"))
    with ParkFile(path) as lot:
        assert sorted(r.url for r in lot.records().values()) == ["http://127.0.0.1/2", "http://127.0.0.1/3"]


def test_a_second_handle_is_refused_while_the_first_holds_the_lock(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path):
        with pytest.raises(ParkFileLocked, match=r"in use by another run.*RETRY_AFTER_PARK_FILE"):
            ParkFile(path)
    ParkFile(path).close()  # free again


def test_a_later_record_with_the_same_id_replaces_the_earlier(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        record = _record(reason="over_cap")
        lot.add(record)
        record.reason = "held_at_close"
        lot.add(record)
        assert [r.reason for r in lot.records().values()] == ["held_at_close"]


def test_a_torn_last_line_is_kept_aside_not_read_and_not_lost(tmp_path):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path) as lot:
        lot.add(_record("http://127.0.0.1/whole"))
    torn = '{"id":"x","url":"http://127.0.0.1/torn","not_be'
    with open(path, "a") as out:
        out.write(torn)
    records, bad = read_records(path)
    assert [r.url for r in records.values()] == ["http://127.0.0.1/whole"]
    assert bad == [torn + "\n"]
    with ParkFile(path) as lot:
        assert [r.url for r in lot.records().values()] == ["http://127.0.0.1/whole"]
    assert path.with_name("parked.jsonl.torn").read_text() == torn + "\n"
    assert read_records(path)[1] == []


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
    assert read_records(path)[0] == {}


def test_the_command_refuses_to_clear_a_file_in_use(tmp_path, capsys):
    path = tmp_path / "parked.jsonl"
    with ParkFile(path):
        assert main(["parked", str(path), "--clear"]) == 1
    assert "in use by another run" in capsys.readouterr().err


def test_the_command_runs_as_a_module_and_reports_a_missing_file(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "scrapy_retryafter", "parked", str(tmp_path / "none.jsonl")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and "no park file" in done.stderr
