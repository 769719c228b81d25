"""The learned pace against a limiter without burst when send times jitter, simulated.

nginx ``limit_req`` without burst refuses any request closer than 1/rate to
the last one it admitted, so a pace that loopback lets through can be
refused on a network whose arrival times jitter by a few ms. Loopback hides
this; the simulation shows it, with the package's own ``RateController`` and
``Meter``, a seeded uniform jitter on every arrival and a 1.25 s cooldown per
refusal. ``--compare REV`` runs the controller of a git revision side by side.

    python -m bench.jitter [--rate 20] [--pages 400] [--seeds 40] [--compare REV]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import types

from scrapy_retryafter import rate as current
from scrapy_retryafter.meter import Meter

COOLDOWN = 1.25
JITTERS_MS = (0.0, 1.0, 2.0, 3.0, 5.0)


def crawl(controller: type, rate: float, jitter: float, seed: int, pages: int) -> tuple[float, int]:
    """Seconds to get ``pages`` through, and the refusals on the way."""
    rnd = random.Random(seed)
    pace, meter = controller(), Meter(0.0)
    pace.throttled(22.0, 0.0)  # the opening burst, as in the crawls: eight requests at once
    pace.paused(COOLDOWN, 0.0)
    now, admitted, got, refused = COOLDOWN, -1.0, 0, 0
    while got < pages:
        arrival = now + rnd.uniform(-jitter, jitter)
        if arrival - admitted >= 1.0 / rate:
            admitted, got = arrival, got + 1
            pace.succeeded(meter.tick(now), now)
            now += 1.0 / pace.rate
        else:
            refused += 1
            pace.throttled(meter.current(now), now)
            pace.paused(now + COOLDOWN, now)
            now += COOLDOWN
    return now, refused


def controller_at(rev: str) -> type:
    """``RateController`` as it was at ``rev`` (its module imports nothing of the package)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:scrapy_retryafter/rate.py"], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType(f"rate_at_{rev}")
    exec(compile(source, module.__name__, "exec"), module.__dict__)  # noqa: S102 - the project's own history
    return module.RateController


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--compare", metavar="REV", help="a git revision whose controller runs side by side")
    args = parser.parse_args()
    controllers = {"this checkout": current.RateController}
    if args.compare:
        controllers[args.compare] = controller_at(args.compare)
    ideal = args.pages / args.rate
    print(f"{args.pages} pages, no burst, {args.rate:g} requests/s, {args.seeds} seeds; medians")
    print("| jitter | controller | x ideal | p90 x ideal | refusals |")
    print("|---|---|---|---|---|")
    for jitter_ms in JITTERS_MS:
        for name, controller in controllers.items():
            runs = [crawl(controller, args.rate, jitter_ms / 1000, seed, args.pages) for seed in range(args.seeds)]
            times = sorted(seconds for seconds, _ in runs)
            p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
            refusals = statistics.median(refused for _, refused in runs)
            print(f"| ±{jitter_ms:g} ms | {name} | {statistics.median(times) / ideal:.2f} | {p90 / ideal:.2f} | {refusals:g} |")


if __name__ == "__main__":
    main()
