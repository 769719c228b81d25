"""The fold kept between claims equals a full fold of the file, whatever was appended or rewritten meanwhile.

Random interleavings of parks, claims, releases, removals, hostile raw lines
(torn, then ended by a later append; garbage; forged), compactions, closed
handles and truncations: after each, the kept fold brought up to date is
compared with the file folded from its first byte, and claims made on kept
folds with claims made on full folds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scrapy_retryafter import parkfile
from scrapy_retryafter.parkfile import ParkFile, ParkRecord
from scrapy_retryafter.parkfold import Fold, _apply_line, _lines
from scrapy_retryafter.parkkept import KeptFold, fold_then_lock

HANDLES = 3
_RAW = [
    b'{"done":["r1"]',  # torn; ended by the "}\n" below, it is a removal
    b"}\n",
    b"not json\n",
    b'{"url":"file:///etc/passwd","id":"r3"}\n',
    b'{"url":"http://127.0.0.1/h","slot":"h","not_before":"2020-01-01T00:00:00Z"}\n',  # no id: derived
    b'{"claim":["r2"],"by":{"pid":1,"start":"x","boot":"y","host":"z","nonce":"n"},"at":1}\n',
    b"\n",
    b'{"id":"r4","url":"http://127.0.0.1/4","slot":"s","reason":"over_cap","not_before":"2020-01-01T00:00:00Z"}',
]

_ids = st.lists(st.integers(0, 9), min_size=1, max_size=4)
_op = st.one_of(
    st.tuples(st.just("park"), st.integers(0, HANDLES - 1), _ids, st.sampled_from(["s", "t", ""])),
    st.tuples(st.just("claim"), st.integers(0, HANDLES - 1), st.integers(1, 4)),
    st.tuples(st.just("done"), st.integers(0, HANDLES - 1), _ids),
    st.tuples(st.just("release"), st.integers(0, HANDLES - 1), _ids),
    st.tuples(st.just("raw"), st.integers(0, len(_RAW) - 1)),
    st.tuples(st.just("compact"), st.integers(0, HANDLES - 1)),
    st.tuples(st.just("close"), st.integers(0, HANDLES - 1)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("sync")),
)


def _record(number: int, spider: str) -> ParkRecord:
    return ParkRecord(url=f"http://127.0.0.1/{number}", slot="127.0.0.1", reason="over_cap", attempts=1,
                      not_before=time.time(), request=None, spider=spider, id=f"r{number}")


def _no_fsync(fd: int) -> None:
    """Durability is not what is compared here: the examples run without waiting for the disk."""


def _take_all(entry):
    return True


class Script:
    """Runs operations on one park file through several handles."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handles = [ParkFile(path, fsync=_no_fsync) for _ in range(HANDLES)]
        self.claimed: list[tuple[int, list[str]]] = []

    def run(self, op: tuple) -> None:
        kind, *args = op
        if kind == "park":
            self.handles[args[0]].add_many([_record(n, args[2]) for n in args[1]])
        elif kind == "claim":
            claimed = self.handles[args[0]].claim(_take_all, parse=False, limit=args[1])
            self.claimed.append((args[0], [record_id for _, record_id, _ in claimed.lines]))
        elif kind in ("done", "release"):
            getattr(self.handles[args[0]], kind)([f"r{n}" for n in args[1]])
        elif kind == "raw":
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, _RAW[args[0]])
            finally:
                os.close(fd)
        elif kind == "compact":
            self.handles[args[0]].compact()
        elif kind == "close":
            self.handles[args[0]].close()
            self.handles[args[0]] = ParkFile(self.path, fsync=_no_fsync)
        elif kind == "truncate" and self.path.exists():
            os.truncate(self.path, int(self.path.stat().st_size * args[0]))

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


def _full(fd: int) -> Fold:
    fold = Fold(keep_lines=False)
    for line, end, kind in _lines(fd, 0, complete=True):
        _apply_line(fold, line, kind, end)
    return fold


def _same(kept: Fold, full: Fold) -> None:
    assert list(kept.records.items()) == list(full.records.items())
    assert kept.claims == full.claims
    assert kept.claimed_at == full.claimed_at


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, max_size=40))
def test_a_kept_fold_brought_up_to_date_is_the_full_fold(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("kept") / "parked.jsonl"
    script = Script(path)
    observer = ParkFile(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    kept: KeptFold | None = None
    reported: list = []
    try:
        for op in [*ops, ("sync",)]:
            if op[0] != "sync":
                script.run(op)
                if op[0] != "truncate":
                    continue  # compared only now and then: several appends are read at once
            state = fold_then_lock(observer, dir_fd, kept)
            if state is None:
                assert not path.exists()
                kept, reported = None, []
                continue
            locked, fresh, tail = state
            try:
                if fresh is not kept:
                    reported = []  # folded from the start: a new file, or one rewritten
                kept = fresh
                reported += kept.fold.bad
                kept.fold.bad = []
                full = _full(locked)
                _same(kept.fold, full)
                assert full.bad == reported + tail
            finally:
                os.close(locked)
    finally:
        if kept is not None:
            kept.close()
        os.close(dir_fd)
        observer.close()
        script.close()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, max_size=40))
def test_claims_on_kept_folds_take_what_claims_on_full_folds_take(tmp_path_factory, ops):
    outcomes = []
    for keep in (True, False):
        path = tmp_path_factory.mktemp("claims") / "parked.jsonl"
        with pytest.MonkeyPatch.context() as patch:
            if not keep:
                def full_fold(log, dir_fd, kept, real=parkfile.fold_then_lock):
                    if kept is not None:
                        kept.close()
                    return real(log, dir_fd, None)

                patch.setattr(parkfile, "fold_then_lock", full_fold)
            script = Script(path)
            try:
                for op in ops:
                    script.run(op)
                script.run(("claim", 0, 100))
                nonces = {handle.owner.nonce: index for index, handle in enumerate(script.handles)}
                fold = script.handles[0].read()
                owners = {key: nonces.get(owner.nonce, -1) for key, owner in fold.claims.items()}
                outcomes.append((script.claimed, list(fold.records), owners, [b.why for b in fold.bad]))
            finally:
                script.close()
    assert outcomes[0] == outcomes[1]
