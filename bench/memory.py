"""Board memory in a broad crawl: bytes per live slot, and expired slots collected.

    python -m bench.memory [--hosts 1000000] [--rate 1000] [--throttled 0.02]

A simulated crawl (injected clock, no network) sends --rate responses per
second over --hosts hosts, two or three responses each, spread over a few
seconds as a broad crawl interleaves them. Every response feeds the board as
the middleware does (a success meter for the learned rate); --throttled of the
hosts answer one 429 with Retry-After: 5, which cools the slot, opens its
pace and counts for its breaker. The board is swept every 30 simulated seconds,
as the extension does. tracemalloc measures the board and its slot keys (the
keys are made here and live only as long as the board holds them).
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
import tracemalloc

from scrapy_retryafter.board import CooldownBoard
from scrapy_retryafter.testing.clock import FakeClock

SWEEP_INTERVAL = 30.0


def live_slots(board: CooldownBoard) -> int:
    return len(board._meters) + sum(1 for slot in board._slots if slot not in board._meters)


def follow_up(pending: list[tuple[float, int]], now: float, index: int, rng: random.Random) -> None:
    heapq.heappush(pending, (now + rng.uniform(0.5, 5.0), index))  # the simulation's own queue: not counted


SIMULATION_LINE = follow_up.__code__.co_firstlineno + 1


def board_bytes() -> int:
    """Traced memory but the simulation's queue of responses to come and tracemalloc's own."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__, SIMULATION_LINE)]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=1000.0, help="responses per simulated second")
    parser.add_argument("--throttled", type=float, default=0.02, help="share of hosts that answer one 429")
    args = parser.parse_args()
    rng = random.Random(7)
    clock = FakeClock(0.0)
    started = time.monotonic()
    tracemalloc.start()
    baseline = board_bytes()
    board = CooldownBoard(clock=clock, rng=rng)
    pending: list[tuple[float, int]] = []
    step = 1.0 / args.rate
    next_sweep = SWEEP_INTERVAL
    samples: list[tuple[int, int]] = []
    swept = 0
    index = 0
    while index < args.hosts or pending:
        clock.now += step
        throttle = False
        if pending and (pending[0][0] <= clock.now or index >= args.hosts):
            due, host = heapq.heappop(pending)
            clock.now = max(clock.now, due) + 0.0
        else:
            host = index
            index += 1
            throttle = rng.random() < args.throttled
            for _ in range(rng.randint(1, 2)):
                follow_up(pending, clock.now, host, rng)
        slot = f"host{host:07d}.example"
        if throttle:
            board.throttle(
                slot, clock.now - 0.1, 5.0 * 1.25, learn=True, wake_jitter=1.0, circuit_threshold=5, circuit_open_seconds=60.0
            )
        else:
            if slot in board:
                board.success(slot, 0.1, 10.0)
            board.succeeded(slot)
        if clock.now >= next_sweep:
            live = live_slots(board)
            samples.append((live, board_bytes() - baseline))
            board.sweep()
            swept += live - live_slots(board)
            next_sweep += SWEEP_INTERVAL
    tracemalloc.stop()
    live, used = max(samples, key=lambda sample: sample[1] / max(sample[0], 1))
    print(f"{args.hosts:,} hosts, {args.rate:.0f} responses/s, {args.throttled:.0%} throttled once, "
          f"{clock.now:.0f} simulated seconds, {len(samples)} sweeps ({time.monotonic() - started:.0f} s to run)")
    print(f"live slots before a sweep: peak {max(s[0] for s in samples):,}; "
          f"worst bytes per live slot (board + keys): {used / live:.0f} ({used:,} bytes for {live:,} slots)")
    print(f"expired slots collected by sweeps: {swept:,}; left at the end: board {len(board):,}, meters {len(board._meters):,}")


if __name__ == "__main__":
    main()
