"""CooldownAwarePriorityQueue against Scrapy's own DownloaderAwarePriorityQueue.

Both queues run on one real crawler and its real downloader; downloads in
flight are real downloader slots holding requests, as the engine leaves them.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from scrapy import Request, Spider
from scrapy.core.downloader import Slot
from scrapy.pqueues import DownloaderAwarePriorityQueue
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.test import get_crawler

from scrapy_retryafter import CooldownAwarePriorityQueue, pqueue, slotchoice
from scrapy_retryafter import signals as ra_signals
from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.extension import RetryAfterExtension
from scrapy_retryafter.testing.clock import FakeClock

HOSTS = ["a.test", "b.test", "c.test", "d.test"]
CONCURRENCY = 4


@pytest.fixture(scope="module")
def crawler(tmp_path_factory: Any) -> Any:
    park_file = tmp_path_factory.mktemp("park") / "parked.jsonl"
    crawler = get_crawler(
        Spider, {"CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY, "RETRY_AFTER_PARK_FILE": str(park_file)}
    )
    crawler.engine = crawler._create_engine()
    return crawler


def make_queues(crawler: Any, clock: FakeClock | None = None, board: Any = None) -> tuple[Any, Any]:
    crawler.engine.downloader.slots.clear()
    extension = RetryAfterExtension.of(crawler)
    extension._spider_closed()  # no wake-up left from the last queue
    extension.board = board if board is not None else CooldownBoard(clock=clock or FakeClock())
    ours = CooldownAwarePriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
    theirs = DownloaderAwarePriorityQueue.from_crawler(crawler, FifoMemoryQueue, "")
    return ours, theirs


def start_download(crawler: Any, host: str) -> bool:
    slots = crawler.engine.downloader.slots
    if host not in slots:
        slots[host] = Slot(CONCURRENCY, 0.0, 0)
    if len(slots[host].active) >= CONCURRENCY - 1:
        return False  # a full slot is where the two queues differ on purpose
    slots[host].active.add(Request(f"http://{host}/in-flight/{len(slots[host].active)}"))
    return True


def finish_download(crawler: Any, host: str) -> None:
    slot = crawler.engine.downloader.slots.get(host)
    if slot is not None and slot.active:
        slot.active.pop()


def url(request: Request | None) -> str | None:
    return request.url if request is not None else None


@pytest.fixture(params=["heaps", "scan"])
def way(request, monkeypatch):
    """The queue keeps heaps for many slots and looks at each of a few: both must agree with Scrapy."""
    monkeypatch.setattr(slotchoice, "_FEW", 0 if request.param == "heaps" else 1000)
    return request.param


class BothQueuesAlike(RuleBasedStateMachine):
    """Random pushes, pops and downloads starting and ending, fed to ours and another queue alike."""

    crawler: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.ours, self.theirs = make_queues(self.crawler, self.clock)
        self.pushed = 0

    @rule(host=st.sampled_from(HOSTS), priority=st.integers(-1, 1))
    def push(self, host: str, priority: int) -> None:
        request = Request(f"http://{host}/{self.pushed}", priority=priority)
        self.pushed += 1
        self.ours.push(request)
        self.theirs.push(request)

    @rule()
    def pop(self) -> None:
        assert url(self.ours.pop()) == url(self.theirs.pop())

    @rule()
    def peek(self) -> None:
        assert url(self.ours.peek()) == url(self.theirs.peek())

    @rule(host=st.sampled_from(HOSTS))
    def finish(self, host: str) -> None:
        finish_download(self.crawler, host)

    @invariant()
    def same_length(self) -> None:
        assert len(self.ours) == len(self.theirs)

    def teardown(self) -> None:
        self.clock.now += 10.0
        self.crawler.engine.downloader.slots.clear()
        for _ in range(len(self.theirs)):
            request = self.theirs.pop()
            assert request is not None
            assert url(self.ours.pop()) == url(request)
        assert self.ours.pop() is None


class SameOrderAsScrapy(BothQueuesAlike):
    """Nothing cools, no downloader slot fills up: Scrapy's own queue is the reference."""

    @rule(host=st.sampled_from(HOSTS))
    def start(self, host: str) -> None:
        start_download(self.crawler, host)


class EverySlotLooked(DownloaderAwarePriorityQueue):
    """The plain definition, looking at every slot on every pop: Scrapy's choice
    among the slots whose board says they may send now and whose downloader
    slot has room."""

    def __init__(self, crawler: Any, board: Any) -> None:
        super().__init__(crawler, FifoMemoryQueue, "")
        self.board = board

    def _may_send(self) -> list[tuple[int, str]]:
        now = self.board.clock()
        stats = []
        for slot in self.pqueues:
            if self.board.ready_at(slot, len(self.pqueues[slot])) > now:
                continue
            downloader_slot = self.crawler.engine.downloader.slots.get(slot)
            active = len(downloader_slot.active) if downloader_slot is not None else 0
            if downloader_slot is None or active < downloader_slot.concurrency:
                stats.append((active, slot))
        return stats

    def _choose(self, update_state: bool) -> str | None:
        stats = self._may_send()
        if not stats:
            return None
        if hasattr(DownloaderAwarePriorityQueue, "_next_slot"):
            return self._next_slot(stats, update_state=update_state)
        return min(stats)[1]

    def pop(self) -> Request | None:
        slot = self._choose(True)
        if slot is None:
            return None
        queue = self.pqueues[slot]
        request = queue.pop()
        if not len(queue):
            del self.pqueues[slot]
        return request

    def peek(self) -> Request | None:
        slot = self._choose(False)
        return self.pqueues[slot].peek() if slot is not None else None


class SameOrderAsLookingAtEverySlot(BothQueuesAlike):
    """Cooldowns, full downloader slots and time passing, against the plain definition."""

    def __init__(self) -> None:
        super().__init__()
        self.theirs = EverySlotLooked(self.crawler, RetryAfterExtension.of(self.crawler).board)

    @rule(host=st.sampled_from(HOSTS))
    def start(self, host: str) -> None:
        slots = self.crawler.engine.downloader.slots
        if host not in slots:
            slots[host] = Slot(2, 0.0, 0)
        slots[host].active.add(Request(f"http://{host}/in-flight/{self.pushed}"))
        self.pushed += 1

    @rule(host=st.sampled_from(HOSTS), seconds=st.sampled_from([0.5, 1.0, 3.0]))
    def cool(self, host: str, seconds: float) -> None:
        RetryAfterExtension.of(self.crawler).board.cool(host, seconds)

    @rule(seconds=st.sampled_from([0.25, 1.0, 2.0]))
    def wait(self, seconds: float) -> None:
        self.clock.now += seconds


def test_with_cooldowns_pops_as_looking_at_every_slot_would(crawler, way):
    SameOrderAsLookingAtEverySlot.crawler = crawler
    run_state_machine_as_test(
        SameOrderAsLookingAtEverySlot, settings=settings(max_examples=300, stateful_step_count=60, deadline=None)
    )


def test_with_nothing_cooling_pops_in_scrapys_order(crawler, way):
    SameOrderAsScrapy.crawler = crawler
    run_state_machine_as_test(
        SameOrderAsScrapy, settings=settings(max_examples=500, stateful_step_count=60, deadline=None)
    )


@pytest.mark.parametrize(
    "script",
    [
        # A busy slot stepped over comes back only after the names past the last chosen.
        "push a, push b, push b, push c, start a, pop, finish a, pop, pop, pop",
        # Wrapping around past busy slots at the start of the names.
        "push a, push b, push c, push c, pop, pop, start a, pop, finish a, start b, pop, pop",
        # Everyone busy: the least busy, round-robin among equals.
        "push a, push a, push b, push b, push c, start a, start b, start c, start c, pop, pop, pop, finish c, pop, pop",
        "push d, push c, push b, push a, start a, start c, pop, pop, finish a, pop, pop",
        "push a, push a, push b, push b, push c, push c, push d, push d, pop, pop, pop, pop, "
        "start a, start d, pop, finish a, pop, pop, pop, pop",
    ],
)
def test_pop_order_matches_scrapy_in_these_sequences(crawler, way, script):
    ours, theirs = make_queues(crawler)
    for n, step in enumerate(script.split(", ")):
        op, _, host = step.partition(" ")
        if op == "push":
            request = Request(f"http://{host}.test/{n}")
            ours.push(request)
            theirs.push(request)
        elif op == "pop":
            assert url(ours.pop()) == url(theirs.pop()), step
        elif op == "start":
            start_download(crawler, f"{host}.test")
        else:
            finish_download(crawler, f"{host}.test")
    assert len(ours) == len(theirs)


def test_a_cooling_slot_waits_while_others_keep_scrapys_order(crawler, way):
    clock = FakeClock()
    ours, theirs = make_queues(crawler, clock)
    for n in range(3):
        for host in ("a.test", "b.test", "c.test"):
            ours.push(Request(f"http://{host}/{n}"))
            if host != "b.test":
                theirs.push(Request(f"http://{host}/{n}"))
    RetryAfterExtension.of(crawler).board.cool("b.test", 5.0)
    for _ in range(6):
        assert url(ours.pop()) == url(theirs.pop())
    assert ours.pop() is None
    assert ours._extension._timer_at == pytest.approx(clock.now + 5.0)
    clock.now += 5.0
    assert [url(ours.pop()) for _ in range(4)] == [f"http://b.test/{n}" for n in range(3)] + [None]


def test_a_closed_circuit_frees_its_slot_before_the_time_it_was_held_for(crawler, way):
    clock = FakeClock()
    ours, _ = make_queues(crawler, clock)
    board = RetryAfterExtension.of(crawler).board
    ours.push(Request("http://a.test/0"))
    ours.push(Request("http://a.test/1"))
    assert board.breaker_throttled("a.test", clock.now, threshold=1, open_seconds=60.0)
    assert ours.pop() is None
    assert board.success("a.test", 0.1, 10.0)
    crawler.signals.send_catch_log(ra_signals.circuit_closed, slot="a.test")
    assert url(ours.pop()) == "http://a.test/0"


def test_a_full_downloader_slot_gives_way_to_one_with_room(crawler, way):
    ours, _ = make_queues(crawler)
    ours.push(Request("http://a.test/0"))
    ours.push(Request("http://b.test/0"))
    slot = crawler.engine.downloader.slots["a.test"] = Slot(1, 0.0, 0)
    slot.active.add(Request("http://a.test/in-flight"))
    finish_download(crawler, "b.test")
    assert url(ours.pop()) == "http://b.test/0"
    assert ours.pop() is None
    slot.active.clear()
    assert url(ours.pop()) == "http://a.test/0"


class CountingBoard:
    """The crawl's board, counting how often the queue asks it about a slot."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.asked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.board, name)

    def __contains__(self, slot: str) -> bool:
        return slot in self.board

    def ready_at(self, slot: str, held: int = 1) -> float:
        self.asked += 1
        return self.board.ready_at(slot, held)


def test_a_pop_does_not_look_at_every_cooling_slot(crawler, monkeypatch):
    monkeypatch.setattr(slotchoice, "_FEW", 0)
    clock = FakeClock()
    counting = CountingBoard(CooldownBoard(clock=clock))
    ours, _ = make_queues(crawler, board=counting)
    for n in range(1000):
        ours.push(Request(f"http://h{n:04d}.test/0"))
        if n % 10:
            counting.cool(f"h{n:04d}.test", 30.0)
    popped = [url(ours.pop()) for _ in range(101)]
    assert popped == [f"http://h{n:04d}.test/0" for n in range(0, 1000, 10)] + [None]
    # Each cooling slot is looked at once and then waits in the heap.
    assert counting.asked <= 900 + 100
    asked = counting.asked
    assert ours.pop() is None
    assert counting.asked == asked


def test_a_slot_emptied_and_fed_again_keeps_scrapys_order_with_few_spare_queues(crawler, way):
    """A slot fed one request at a time empties at every pop; its queue is kept for the next push."""
    ours, theirs = make_queues(crawler)
    hosts = [f"h{n:03d}.test" for n in range(3 * pqueue._SPARES)]
    for host in hosts:
        request = Request(f"http://{host}/first")
        ours.push(request)
        theirs.push(request)
        assert url(ours.pop()) == url(theirs.pop()) == f"http://{host}/first"
    assert len(ours._spares) == pqueue._SPARES  # the most recently emptied, not one per slot ever seen
    for host in (hosts[-1], hosts[0]):  # one with a spare queue, one without
        for priority in (0, 2, 1, 2):
            request = Request(f"http://{host}/{priority}", priority=priority)
            ours.push(request)
            theirs.push(request)
    assert len(ours) == len(theirs) == 8
    assert [url(ours.pop()) for _ in range(9)] == [url(theirs.pop()) for _ in range(9)]
    ours.close()
    assert not ours._spares
