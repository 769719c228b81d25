"""RedisBoard against a real redis-server: what one process learns, the others hold to."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scrapy_retryafter.breaker import CLOSED, OPEN
from scrapy_retryafter.rate import MARGIN
from scrapy_retryafter.redis.board import RedisBoard, RedisBoardUnavailable
from scrapy_retryafter.redis.exchange import slot_key
from scrapy_retryafter.redisconfig import RedisConfig

from .redis_fixtures import free_port, own_redis, prefix, redis_server, require_redis  # noqa: F401

SLOT = "shop.example"


def board(url: str, prefix: str, **kwargs) -> RedisBoard:
    config = RedisConfig(url=url, params={}, prefix=prefix, **kwargs)
    made = RedisBoard(config)
    made.connect()
    made.start()
    assert SLOT not in made  # a process crawling the shop: it has met the slot
    return made


@pytest.fixture
def pair(redis_server, prefix):
    a, b = board(redis_server.url, prefix), board(redis_server.url, prefix)
    yield a, b
    a.stop()
    b.stop()


def test_a_cooldown_one_process_sets_holds_the_other(pair):
    a, b = pair
    heard = []
    b.on_remote_cool = lambda slot, seconds: heard.append((slot, seconds))
    a.cool(SLOT, 5.0)
    assert a.sync() and b.sync()
    assert SLOT in b
    assert 4.9 <= b.remaining(SLOT) <= 5.05
    assert b.ready_at(SLOT) >= b.clock() + 4.9
    assert [slot for slot, _ in heard] == [SLOT]
    assert b.remaining("other.example") == 0.0


def test_a_shorter_cooldown_never_shortens_the_shared_one(pair, redis_server, prefix):
    a, b = pair
    a.cool(SLOT, 5.0)
    assert a.sync()
    b.cool(SLOT, 1.0)
    assert b.sync()
    server_now = float(redis_server.client().time()[0])
    until = redis_server.client().zscore(f"{prefix}:cooldown", SLOT)
    assert until - server_now >= 3.9
    assert b.remaining(SLOT) >= 4.8


def test_a_process_does_not_hear_its_own_cooldown_as_news(pair):
    a, _ = pair
    heard = []
    a.on_remote_cool = lambda slot, seconds: heard.append(slot)
    a.cool(SLOT, 3.0)
    assert a.sync() and a.sync()
    assert heard == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.5, 30.0)), min_size=1, max_size=8))
def test_the_shared_cooldown_is_the_longest_anyone_asked_for(redis_server, cools):
    key = f"prop-{time.monotonic_ns()}"
    boards = [board(redis_server.url, key) for _ in range(3)]
    try:
        start = float(redis_server.client().time()[0])
        for index, seconds in cools:
            boards[index].cool(SLOT, seconds)
            boards[index].sync()
        until = redis_server.client().zscore(f"{key}:cooldown", SLOT)
        longest = max(seconds for _, seconds in cools)
        assert start + longest - 0.5 <= until <= start + longest + 1.5
        for each in boards:
            assert each.sync()
            assert each.remaining(SLOT) >= longest - 1.0
    finally:
        for each in boards:
            each.stop()


def test_an_open_circuit_holds_the_fleet_and_a_success_anywhere_closes_it(pair):
    a, b = pair
    changes = []
    b.on_remote_circuit = lambda slot, opened: changes.append((slot, opened))
    assert a.breaker_throttled(SLOT, sent_at=a.clock(), threshold=1, open_seconds=60.0)
    assert a.sync() and b.sync()
    assert b.breaker_state(SLOT) == OPEN
    assert b.ready_at(SLOT) >= b.clock() + 59.0
    assert a.success(SLOT, 0.1, 10.0)
    assert a.sync() and b.sync()
    assert b.breaker_state(SLOT) == CLOSED
    assert b.ready_at(SLOT) == 0.0
    assert changes == [(SLOT, True), (SLOT, False)]


def test_a_cut_pace_is_adopted_and_split_between_the_senders(pair):
    a, b = pair
    rate = a.throttled(SLOT, sent_at=a.clock())
    assert rate is not None
    assert a.sync() and b.sync()
    assert b.rate(SLOT) == pytest.approx(rate)
    # Both send to the slot: each learns it is one of two and paces at half.
    a.released(SLOT)
    b.released(SLOT)
    for _ in range(2):
        assert a.sync() and b.sync()
    assert a.share(SLOT) == b.share(SLOT) == 2.0
    b.released(SLOT)
    assert b.ready_at(SLOT) - b.clock() == pytest.approx(2.0 / rate, abs=0.05)


def test_the_fleet_grants_send_times_at_the_slowest_pace_its_senders_claim(pair, redis_server, prefix):
    """One pace for the fleet: a process whose pace grew past another's (or that has not heard of
    a cut yet) gets no closer send times than the slower one; once the slow one stops claiming,
    the faster pace holds again."""
    a, b = pair
    a.throttled(SLOT, sent_at=a.clock())
    b.throttled(SLOT, sent_at=b.clock())
    assert a.sync() and b.sync()  # each has read the other's cut
    a._slots[SLOT].pace.rate = 40.0
    b._slots[SLOT].pace.rate = 10.0

    def claim(who: RedisBoard) -> list[float]:
        who.ready_at(SLOT, held=50)
        assert who.sync()
        return who.leases.times(SLOT)

    claim(b)
    for _ in range(20):  # a few exchanges: each grants the times up to the horizon, which moves on
        times = claim(a)
        if len(times) >= 3:
            break
        time.sleep(0.05)
    assert len(times) >= 2
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert min(gaps) == pytest.approx(0.1, abs=0.005)
    client = redis_server.client()
    paces = client.hgetall(f"{prefix}:slot:lease:{slot_key(SLOT)}")
    assert sum(1 for name in paces if name.startswith("pace:")) == 2
    time.sleep(1.1)  # b claimed nothing for longer than the pace window
    a.leases.forget(SLOT)
    for _ in range(20):
        times = claim(a)
        if len(times) >= 3:
            break
        time.sleep(0.05)
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert gaps and max(gaps) == pytest.approx(0.025, abs=0.005)


def test_a_claim_s_first_time_is_one_fleet_interval_from_every_booked_time_and_told_at_that_pace(pair):
    """Each process of a big fleet gets a time per claim, after another process's: its claim's own rate does
    not say how close it came to that one (slow start refused at 11/s was cut from this process's 5.6)."""
    a, b = pair
    a.throttled(SLOT, sent_at=a.clock())
    b.throttled(SLOT, sent_at=b.clock())
    assert a.sync() and b.sync()
    b._slots[SLOT].pace.rate = 40.0
    a._slots[SLOT].pace.rate = 10.0
    b.ready_at(SLOT, held=50)
    assert b.sync()
    b_times = b.leases.times(SLOT)
    a.ready_at(SLOT, held=1)
    assert a.sync()
    (first,) = a.leases.times(SLOT)[:1]
    assert first - b_times[-1] == pytest.approx(0.1, abs=0.005)  # the slowest claim spaces it from b's times
    a.leases.used(SLOT, first)
    refused, _ = a.leases.spaced(SLOT, first)
    assert refused == pytest.approx(10.0, rel=0.01)


def test_a_pace_that_rose_is_granted_between_the_times_booked_at_the_old_one(redis_server, prefix):
    """Eight processes holding a time each at 1.4/s held a doubled pace back 5.7 s: the new one fits between."""
    a = board(redis_server.url, prefix)
    try:
        a.throttled(SLOT, sent_at=a.clock())
        pace = a._slots[SLOT].pace
        pace.rate = 5.0
        a.ready_at(SLOT, held=1)
        assert a.sync()
        a.ready_at(SLOT, held=2)
        assert a.sync()
        early, late = a.leases.times(SLOT)
        assert late - early == pytest.approx(0.2, abs=0.002)
        pace.rate = 10.0
        a.ready_at(SLOT, held=3)
        assert a.sync()
        times = a.leases.times(SLOT)
        assert len(times) == 3
        between = times[1]
        assert early < between < late
        assert between - early == pytest.approx(0.1, abs=0.002)
        a.leases.used(SLOT, early)
        a.leases.used(SLOT, between)
        refused, _ = a.leases.spaced(SLOT, between)
        assert refused == pytest.approx(10.0, rel=0.01)
    finally:
        a.stop()


def test_a_send_time_granted_before_the_one_the_slot_waits_for_makes_the_queue_look_again(redis_server, prefix):
    a = board(redis_server.url, prefix)
    try:
        sooner: list[str] = []
        a.on_sooner = sooner.append
        a.throttled(SLOT, sent_at=a.clock())
        a.released(SLOT)  # nothing granted yet: the slot waits for a fallback time
        fallback = a.ready_at(SLOT)
        assert fallback > a.clock() + 0.2
        assert a.sync()  # asks the fleet for send times; the schedule is free, so one comes at once
        assert sooner == [SLOT]
        assert a.ready_at(SLOT) < fallback - 0.2
    finally:
        a.stop()


def test_granted_send_times_come_ahead_and_one_this_process_is_too_late_for_is_skipped(redis_server, prefix):
    stalled = [0.0]
    config = RedisConfig(url=redis_server.url, params={}, prefix=prefix)
    a = RedisBoard(config, clock=lambda: time.monotonic() + stalled[0])
    a.connect()
    a.start()
    try:
        late: list[str] = []
        a.on_late_lease = late.append
        rate = a.throttled(SLOT, sent_at=a.clock())
        a.released(SLOT)
        a.ready_at(SLOT)
        assert a.sync()
        granted = a.ready_at(SLOT)
        # Granted a refresh period ahead at least, so it is here before it is due.
        assert granted >= a.clock() + 0.09
        assert late == []
        stalled[0] = granted - time.monotonic() + 0.5 * (1 - MARGIN) / rate  # due, within the margin: used
        assert a.ready_at(SLOT) == 0.0 and late == []
        stalled[0] = granted - time.monotonic() + 2 * (1 - MARGIN) / rate  # the loop stalled past the margin
        assert a.ready_at(SLOT) > a.clock()  # not sent now: it would come too close to the next process's send
        assert late == [SLOT]
    finally:
        a.stop()


def test_a_process_that_stops_leaves_the_sender_count(pair, redis_server, prefix):
    a, b = pair
    a.throttled(SLOT, sent_at=a.clock())
    a.released(SLOT)
    b.cool(SLOT, 0.0)
    b.released(SLOT)
    assert a.sync() and b.sync() and a.sync()
    senders = f"{prefix}:slot:senders:{slot_key(SLOT)}"
    assert redis_server.client().zcard(senders) == 2
    a.stop()
    assert redis_server.client().zcard(senders) == 1


def test_unreachable_at_start_is_an_error_naming_the_url():
    require_redis()
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with pytest.raises(RedisBoardUnavailable, match=r"RETRY_AFTER_REDIS_URL redis://\*\*\*@127\.0\.0\.1:\d+/0 is unreachable.*RETRY_AFTER_REDIS_FALLBACK") as error:
        RedisBoard(RedisConfig(url=url, params={})).connect()
    assert "secret" not in str(error.value)
    assert time.monotonic() - started < 1.5


def test_unreachable_at_start_with_fallback_runs_on_the_local_board():
    require_redis()
    config = RedisConfig(url=f"redis://127.0.0.1:{free_port()}/0", params={}, fallback=True)
    local = RedisBoard(config)
    lost = []
    local.on_lost = lost.append
    assert local.connect() is False
    assert local.lost and len(lost) == 1
    local.cool(SLOT, 2.0)
    assert 1.9 <= local.remaining(SLOT) <= 2.0


def test_redis_lost_then_back_warns_once_and_republishes_local_cooldowns(own_redis, prefix):
    a = board(own_redis.url, prefix)
    lost, back = [], []
    a.on_lost = lost.append
    a.on_back = back.append
    try:
        a.cool(SLOT, 30.0)
        assert a.sync()
        own_redis.kill()
        started = time.monotonic()
        a.cool("second.example", 30.0)
        assert not a.sync()
        assert time.monotonic() - started < 1.5
        assert a.lost and len(lost) == 1
        a.cool("third.example", 30.0)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            a.tick()
            time.sleep(0.05)
        assert len(lost) == 1
        assert a.remaining("second.example") > 25
        own_redis.start()
        deadline = time.monotonic() + 10
        while a.lost and time.monotonic() < deadline:
            a.tick()
            time.sleep(0.05)
        assert not a.lost
        assert back and back[0] >= 3
        scores = own_redis.client().zrange(f"{prefix}:cooldown", 0, -1)
        assert set(scores) == {SLOT, "second.example", "third.example"}
    finally:
        a.stop()


def test_the_fleet_sends_a_new_host_no_more_than_the_first_contact_limit_until_one_answers(redis_server, prefix):
    config = RedisConfig(url=redis_server.url, params={}, prefix=prefix)
    fleet = [RedisBoard(config, first_contact=4) for _ in range(3)]
    try:
        for each in fleet:
            each.connect()
            each.start()
            assert "new.example" in each
        for each in fleet:
            assert each.sync()
        sent = [0] * len(fleet)
        marks: list[float | None] = [None] * len(fleet)
        for n, each in enumerate(fleet):
            while each.ready_at("new.example") == 0.0 and sum(sent) < 50:
                each.released("new.example")
                marks[n] = each.reached("new.example")
                sent[n] += 1
        assert sum(sent) == 4
        # Opened once every first-contact send is answered (one of several may yet be refused).
        answered = 0
        for n, each in enumerate(fleet):
            for _ in range(sent[n]):
                for other in fleet:
                    assert other.sync()
                assert not any(other.ready_at("new.example") == 0.0 for other in fleet if other is not each)
                each.succeeded("new.example")
                each.left("new.example", marks[n])  # the request leaves the downloader after its response
                answered += 1
        assert answered == 4
        for each in fleet:
            assert each.sync()
        assert all(each.ready_at("new.example") == 0.0 for each in fleet)
    finally:
        for each in fleet:
            each.stop()


def test_one_probe_for_the_fleet_when_a_circuit_expires(redis_server, prefix):
    config = RedisConfig(url=redis_server.url, params={}, prefix=prefix)
    fleet = [RedisBoard(config) for _ in range(3)]
    try:
        for each in fleet:
            each.connect()
            each.start()
            assert SLOT not in each
        assert fleet[0].breaker_throttled(SLOT, fleet[0].clock(), threshold=1, open_seconds=0.5)
        for each in fleet:
            assert each.sync()
        time.sleep(0.6)
        for each in fleet:
            assert each.ready_at(SLOT) > each.clock()  # half-open: ask the fleet for the probe
        for each in fleet:
            assert each.sync()
        probing = [each for each in fleet if each.ready_at(SLOT) == 0.0]
        assert len(probing) == 1
        probing[0].released(SLOT)
        assert probing[0].sync()  # its hold is in Redis before the others read
        for each in fleet:
            assert each.sync()
        holds = [(each.ready_at(SLOT) - each.clock(), each.breaker_state(SLOT), fleet.index(probing[0])) for each in fleet]
        assert all(hold > 100 for hold, _, _ in holds), holds  # the probe's hold
    finally:
        for each in fleet:
            each.stop()
