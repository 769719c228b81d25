"""The per-slot frontier in a real Redis: what a pop may hand out, for the whole fleet at once."""

from __future__ import annotations

import threading
import time

import pytest

from scrapy_retryafter.redis.queue import SlotFrontier

from .redis_fixtures import prefix, redis_server, require_redis  # noqa: F401


@pytest.fixture
def client(redis_server):
    import redis

    return redis.Redis(port=redis_server.port)  # bytes, as scrapy-redis's own client


@pytest.fixture
def frontier(client, prefix):
    return SlotFrontier(client, f"{prefix}:requests", prefix)


def drain(frontier: SlotFrontier, held: list[str] = ()) -> list[tuple[str, bytes]]:
    out = []
    while isinstance(answer := frontier.pop(list(held)), tuple):
        out.append(answer)
    return out


def server_now(client) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def test_priority_first_then_first_in_first_out_within_a_slot(frontier):
    for data, priority in [(b"a", 0), (b"b", 5), (b"c", 0), (b"d", 5), (b"e", -1)]:
        frontier.push("host", data, priority)
    assert len(frontier) == 5
    assert [data for _, data in drain(frontier)] == [b"b", b"d", b"a", b"c", b"e"]
    assert len(frontier) == 0
    assert frontier.pop() is None


def test_identical_requests_are_both_kept(frontier):
    frontier.push("host", b"same")
    frontier.push("host", b"same")
    assert len(frontier) == 2
    assert [data for _, data in drain(frontier)] == [b"same", b"same"]


def test_slots_take_turns(frontier):
    for i in range(3):
        for slot in ("a", "b", "c"):
            frontier.push(slot, f"{slot}{i}".encode())
    order = [slot for slot, _ in drain(frontier)]
    assert order[:3] in (["a", "b", "c"], ["a", "c", "b"], ["b", "a", "c"], ["b", "c", "a"], ["c", "a", "b"], ["c", "b", "a"])
    for start in range(0, 9, 3):
        assert sorted(order[start:start + 3]) == ["a", "b", "c"], order


@pytest.mark.parametrize("board_key", ["cooldown", "circuit"])
def test_a_slot_the_board_holds_waits_while_others_flow(frontier, client, prefix, board_key):
    client.zadd(f"{prefix}:{board_key}", {"slow": server_now(client) + 0.4})
    for i in range(3):
        frontier.push("slow", f"s{i}".encode())
        frontier.push("free", f"f{i}".encode())
    assert [slot for slot, _ in drain(frontier)] == ["free"] * 3
    wait = frontier.pop()
    assert isinstance(wait, float) and 0.2 < wait <= 0.4
    assert len(frontier) == 3
    time.sleep(wait + 0.02)
    assert [data for _, data in drain(frontier)] == [b"s0", b"s1", b"s2"]


def test_an_expired_cooldown_or_circuit_holds_nothing(frontier, client, prefix):
    past = server_now(client) - 1
    client.zadd(f"{prefix}:cooldown", {"a": past})
    client.zadd(f"{prefix}:circuit", {"a": past})
    frontier.push("a", b"x")
    assert frontier.pop() == ("a", b"x")


def test_a_cooldown_extended_after_the_slot_was_rekeyed_is_seen_again(frontier, client, prefix):
    client.zadd(f"{prefix}:cooldown", {"a": server_now(client) + 0.1})
    frontier.push("a", b"x")
    assert isinstance(frontier.pop(), float)
    client.zadd(f"{prefix}:cooldown", {"a": server_now(client) + 0.5}, gt=True)
    time.sleep(0.15)
    wait = frontier.pop()
    assert isinstance(wait, float) and wait > 0.2


def test_slots_held_by_this_process_are_skipped_only_by_it(frontier):
    frontier.push("paced", b"p")
    frontier.push("free", b"f")
    assert drain(frontier, held=["paced"]) == [("free", b"f")]
    assert frontier.pop(["paced"]) is None  # when it may go is this process's board to say
    assert len(frontier) == 1
    assert frontier.pop() == ("paced", b"p")


def test_many_cooling_slots_do_not_hide_a_free_one(frontier, client, prefix):
    until = server_now(client) + 5
    client.zadd(f"{prefix}:cooldown", {f"cool{i}": until for i in range(100)})
    for i in range(100):
        frontier.push(f"cool{i}", b"c")
    frontier.push("zz-free", b"f")
    # Each pop looks at a few slots and re-keys the cooling ones to when they reopen.
    found = None
    for _ in range(10):
        answer = frontier.pop()
        if isinstance(answer, tuple):
            found = answer
            break
    assert found == ("zz-free", b"f")
    wait = frontier.pop()
    assert isinstance(wait, float) and 4 < wait <= 5


def test_a_retry_waits_out_its_backoff_in_redis(frontier):
    frontier.push("a", b"later", delay=0.3)
    frontier.push("a", b"now")
    assert len(frontier) == 2
    assert frontier.pop() == ("a", b"now")
    wait = frontier.pop()
    assert isinstance(wait, float) and 0.1 < wait <= 0.3
    time.sleep(wait + 0.02)
    assert frontier.pop() == ("a", b"later")
    assert len(frontier) == 0


def test_clear_removes_every_key(frontier, client, prefix):
    frontier.push("a", b"1")
    frontier.push("b", b"2", delay=10)
    frontier.clear()
    assert len(frontier) == 0
    assert frontier.pop() is None
    assert client.keys(f"{prefix}:requests*".encode()) == []


def test_concurrent_pops_hand_out_each_request_exactly_once(client, prefix):
    pushed = {f"{slot}-{i}".encode() for slot in "abcde" for i in range(200)}
    writer = SlotFrontier(client, f"{prefix}:requests", prefix)
    for data in sorted(pushed):
        writer.push(data.decode()[0], data)
    got: list[bytes] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = SlotFrontier(client.__class__(connection_pool=client.connection_pool), f"{prefix}:requests", prefix)
        for _, data in drain(mine):
            with lock:
                got.append(data)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == len(pushed)
    assert set(got) == pushed
    assert len(writer) == 0


def test_a_push_repeated_with_its_token_is_made_once(client, prefix):
    # Redis took the push but its answer was lost: the process pushes it again, with the same token.
    frontier = SlotFrontier(client, f"{prefix}:requests", prefix, owner="me")
    assert frontier.push("a", b"1", token="7") is True
    assert frontier.push("a", b"1", token="7") is False
    assert frontier.push("a", b"2", token="8") is True
    other = SlotFrontier(client, f"{prefix}:requests", prefix, owner="you")
    assert other.push("a", b"3", token="8") is True  # tokens are per process
    assert [data for _, data in drain(frontier)] == [b"1", b"2", b"3"]


def test_a_pop_repeated_with_its_token_answers_the_same_request_again(client, prefix):
    # Redis popped it but the answer was lost: asking again with the token must not lose it.
    frontier = SlotFrontier(client, f"{prefix}:requests", prefix, owner="me")
    for data in (b"1", b"2"):
        frontier.push("a", data)
    assert frontier.pop(token="1") == ("a", b"1")
    assert frontier.pop(token="1") == ("a", b"1")
    assert len(frontier) == 1
    assert frontier.pop(token="2") == ("a", b"2")
    assert frontier.pop(token="3") is None
    assert frontier.pop(token="2") == ("a", b"2")  # what the last pop took is remembered
    frontier.clear()
    assert client.keys(f"{prefix}:requests*".encode()) == []


def test_a_queue_built_from_a_bare_spider_is_a_plain_priority_queue(client, prefix):
    """A script seeding a frontier has a Spider but no crawler: no board, no downloader to ask."""
    from scrapy import Request, Spider

    from scrapy_retryafter.redis.queue import CooldownAwareRedisQueue

    queue = CooldownAwareRedisQueue(client, Spider("seed"), f"{prefix}:%(spider)s:requests")
    assert queue.key == f"{prefix}:seed:requests"
    for url, priority in [("http://a.example/1", 0), ("http://a.example/2", 5), ("http://a.example/3", -1)]:
        queue.push(Request(url, priority=priority))
    queue.push(Request("http://b.example/x", meta={"download_slot": "custom"}))
    assert len(queue) == 4
    assert {key.decode() for key in client.keys(f"{prefix}:seed:requests:slot:*")} == {
        f"{prefix}:seed:requests:slot:a.example", f"{prefix}:seed:requests:slot:custom"
    }
    popped = [queue.pop() for _ in range(4)]
    assert queue.pop() is None
    by_host = [r.url for r in popped if "a.example" in r.url]
    assert by_host == ["http://a.example/2", "http://a.example/1", "http://a.example/3"]
    queue.push(Request("http://a.example/4"))
    queue.clear()
    assert len(queue) == 0
