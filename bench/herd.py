"""The thundering-herd table of the reference, with the package's own backoff code.

    python bench/herd.py [--clients 1000] [--seed 1]

1,000 clients fail at t = 0 and retry 5 times (base 1 s, cap 30 s). For each
strategy: the peak number of retries in one 100 ms slot, and the mean total
wait, next to the reference's figures.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scrapy_retryafter.backoff import Backoff  # noqa: E402

REFERENCE = {"none": (1000, 31.0), "full": (155, 15.4), "equal": (222, 23.3), "decorrelated": (75, 30.7)}


def simulate(strategy: Backoff, clients: int, retries: int, rng: random.Random) -> tuple[int, float]:
    slots: Counter[int] = Counter()
    total = 0.0
    for _ in range(clients):
        t, prev = 0.0, strategy.base
        for attempt in range(1, retries + 1):
            prev = strategy.wait(attempt, prev, rng)
            t += prev
            slots[int(t * 10)] += 1
        total += t
    return max(slots.values()), total / clients


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5, help="medians over this many seeds")
    args = parser.parse_args()
    print(f"{args.clients} clients, 5 retries, base 1 s, cap 30 s (median of {args.runs} seeds)")
    print("| strategy | peak / 100 ms | reference | mean total wait | reference |\n|---|---|---|---|---|")
    for name, (ref_peak, ref_wait) in REFERENCE.items():
        results = sorted(
            simulate(Backoff(name, base=1.0, cap=30.0), args.clients, 5, random.Random(args.seed + run))
            for run in range(args.runs)
        )
        peaks = sorted(r[0] for r in results)
        waits = sorted(r[1] for r in results)
        peak, wait = peaks[len(peaks) // 2], waits[len(waits) // 2]
        print(f"| {name} | {peak} | {ref_peak} ({100 * (peak - ref_peak) / ref_peak:+.0f} %) "
              f"| {wait:.1f} s | {ref_wait} s ({100 * (wait - ref_wait) / ref_wait:+.0f} %) |")


if __name__ == "__main__":
    main()
