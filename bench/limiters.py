"""Against rate limiters nobody here wrote: stock Scrapy, AutoThrottle and the add-on.

    python bench/limiters.py [--pages 400] [--repeat 3] [--only nginx,flask-moving] [--configs addon,memory]
                             [--app-python PATH] [--keep-logs DIR]

Every limiter runs on 127.0.0.1 on a free port, started afresh for each crawl
and stopped after it; the rows take turns so that machine noise hits them
alike, and the table gives medians. CONCURRENT_REQUESTS=16, the rate never
told to the crawler. Each crawl has its own park file and per-host state
file, except ``memory``: a first crawl of the same limiter writes the state
file and the measured second crawl starts from it (its first run is printed
on stderr).

- ``flask-moving`` / ``flask-fixed``: Flask-Limiter ``20/second`` (moving or
  fixed window, its own X-RateLimit-* and Retry-After headers) under waitress,
  run by ``--app-python`` (a Python with the bench extra: Flask-Limiter,
  waitress; default this one).
- ``nginx`` / ``nginx-burst``: nginx ``limit_req`` at 20 r/s with no burst
  (a GCRA with zero tolerance: a request closer than 50 ms to the last one
  admitted is refused) and with ``burst=10 nodelay``; 429 with
  ``Retry-After: 1``, a static page otherwise. nginx runs as root from a
  temporary prefix; when it is missing the bench installs it with apt-get
  and says so.
- ``github-hour``: GitHub's way of stating a quota (X-RateLimit-Limit,
  -Remaining, -Reset in epoch seconds; a fixed window opened by the first
  request), 5000 an hour, 100 pages.
- ``github-minute``: the same scaled down, 500 per 60 s, 600 pages.
- ``ietf``: the project's own server in another process, 20 per 1 s fixed
  windows announced in ``RateLimit``/``RateLimit-Policy``.

Ideal: pages / rate, the burst's pages free (nginx-burst: 10); for the
quotas, the unthrottled time of the pages the first window holds plus the
time to the first reset where the crawl needs a second window.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import CONFIGS, run  # noqa: E402  (installs the asyncio reactor)
from twisted.internet import defer, reactor  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RATE = 20.0
START_TIMEOUT = 20.0
ADDON = "scrapy-retryafter add-on"
MEMORY = "add-on, second crawl (memory)"
"""A crawl that starts from the per-host state file a first crawl of the same limiter wrote."""

NGINX_CONF = """\
worker_processes 1;
daemon off;
master_process on;
user root root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    log_format arrivals '$msec $status';
    limit_req_zone $binary_remote_addr zone=bench:1m rate={rate:g}r/s;
    limit_req_status 429;
    limit_req_log_level info;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
        access_log {prefix}/access.log arrivals;
        root {prefix}/www;
        default_type text/html;
        error_page 429 @throttled;
        location / {{
            limit_req zone=bench{burst};
            try_files /page.html =404;
        }}
        location @throttled {{
            add_header Retry-After 1 always;
            return 429 "<html><body>429</body></html>";
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[Any], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {START_TIMEOUT:g} s")


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class Running:
    base_url: str
    arrivals: Callable[[], list[tuple[float, int]]]
    """(time in seconds, status) of every answer, in order."""
    close: Callable[[], None]


@dataclass
class Limiter:
    name: str
    description: str
    pages: int
    ideal: float
    start: Callable[[Path], Running]
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def app_limiter(python: str, kind: str, spec: str) -> Callable[[Path], Running]:
    def start(workdir: Path) -> Running:
        port = free_port()
        err = open(workdir / f"{kind}.log", "wb")
        process = subprocess.Popen(
            [python, str(HERE / "limiter_apps.py"), kind, str(port), spec], stdout=err, stderr=subprocess.STDOUT
        )
        try:
            wait_listening(port, process, f"{kind} limiter ({python})")
        except Exception:
            stop(process)
            err.close()
            raise
        base = f"http://127.0.0.1:{port}"

        def arrivals() -> list[tuple[float, int]]:
            with urllib.request.urlopen(base + "/__arrivals", timeout=10) as answer:
                return [tuple(json.loads(line)) for line in answer.read().decode().splitlines()]  # type: ignore[misc]

        def close() -> None:
            stop(process)
            err.close()

        return Running(base, arrivals, close)

    return start


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if found:
        return found
    print("nginx is missing: installing it with apt-get (nginx-light)", flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "nginx-light"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(found):
        raise RuntimeError("apt-get installed nginx-light but no nginx binary was found")
    return found


def nginx_limiter(burst: int) -> Callable[[Path], Running]:
    def start(workdir: Path) -> Running:
        binary = nginx_binary()
        prefix = Path(tempfile.mkdtemp(prefix="nginx-", dir=workdir))
        prefix.chmod(0o755)
        (prefix / "www").mkdir()
        (prefix / "www" / "page.html").write_text("<html><body><h1>page</h1></body></html>")
        port = free_port()
        conf = prefix / "nginx.conf"
        conf.write_text(NGINX_CONF.format(
            prefix=prefix, port=port, rate=RATE, burst=f" burst={burst} nodelay" if burst else ""))
        process = subprocess.Popen([binary, "-p", str(prefix), "-c", str(conf)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port, process, f"nginx (see {prefix}/error.log)")
        except Exception:
            stop(process)
            raise

        def arrivals() -> list[tuple[float, int]]:
            log = prefix / "access.log"
            if not log.exists():
                return []
            rows = []
            for line in log.read_text().splitlines():
                msec, status = line.split()
                rows.append((float(msec), int(status)))
            return rows

        return Running(f"http://127.0.0.1:{port}", arrivals, lambda: stop(process))

    return start


def ietf_limiter(python: str) -> Callable[[Path], Running]:
    def start(workdir: Path) -> Running:
        out_path = workdir / "ietf.jsonl"
        out = open(out_path, "wb")
        config = json.dumps({"rate": RATE, "window": 1.0, "penalty": 1.0, "ratelimit": "ietf"})
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        process = subprocess.Popen([python, "-m", "scrapy_retryafter.testing.server", config],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + START_TIMEOUT
        base = ""
        while time.monotonic() < deadline and not base:
            if process.poll() is not None:
                out.close()
                raise RuntimeError(f"the IETF server exited: {out_path.read_text()[-2000:]}")
            first = out_path.read_text().splitlines()
            base = first[0].strip() if first and first[0].startswith("http://") else ""
            time.sleep(0.05)
        if not base:
            stop(process)
            out.close()
            raise RuntimeError("the IETF server printed no address")

        def arrivals() -> list[tuple[float, int]]:
            out.flush()
            rows = []
            for line in out_path.read_text().splitlines()[1:]:
                if line.startswith("{"):
                    entry = json.loads(line)
                    rows.append((float(entry["t"]), int(entry["status"])))
            return rows

        def close() -> None:
            time.sleep(0.2)  # the server flushes its log every 50 ms
            stop(process)
            out.close()

        running = Running(base, arrivals, close)
        return running

    return start


def limiters(pages: int, app_python: str) -> list[Limiter]:
    return [
        Limiter("flask-moving", "Flask-Limiter 20/second, moving window", pages, pages / RATE,
                app_limiter(app_python, "moving-window", f"{RATE:g}/second")),
        Limiter("flask-fixed", "Flask-Limiter 20/second, fixed window", pages, pages / RATE,
                app_limiter(app_python, "fixed-window", f"{RATE:g}/second")),
        Limiter("nginx", "nginx limit_req 20 r/s, no burst", pages, pages / RATE, nginx_limiter(0)),
        Limiter("nginx-burst", "nginx limit_req 20 r/s, burst=10 nodelay", pages, (pages - 10) / RATE,
                nginx_limiter(10)),
        Limiter("ietf", "RateLimit/RateLimit-Policy 20 per 1 s windows", pages, pages / RATE,
                ietf_limiter(sys.executable)),
        Limiter("github-hour", "GitHub-style 5000/hour, 100 pages", 100, 0.0,
                app_limiter(app_python, "github", "5000/3600"), note="ideal: stock Scrapy's time (no 429 possible)"),
        Limiter("github-minute", "GitHub-style 500 per 60 s, 600 pages", 600, 60.0,
                app_limiter(app_python, "github", "500/60"),
                note="ideal: the first reset (60 s) plus the 100 unthrottled pages after it (~0)"),
    ]


def delayed(running: Running, round_trip: float) -> Running:
    """``running`` behind a relay that adds ``round_trip`` seconds (bench/delay_relay.py)."""
    port = free_port()
    upstream = int(running.base_url.rsplit(":", 1)[1])
    process = subprocess.Popen([sys.executable, str(HERE / "delay_relay.py"), str(port), str(upstream), str(round_trip)])
    try:
        wait_listening(port, process, "the delaying relay")
    except Exception:
        stop(process)
        running.close()
        raise

    def close() -> None:
        stop(process)
        running.close()

    return Running(f"http://127.0.0.1:{port}", running.arrivals, close)


@defer.inlineCallbacks
def crawl(limiter: Limiter, settings: dict[str, Any], workdir: Path, state_dir: Path | None = None,
          round_trip: float = 0.0) -> Any:
    """One crawl against a fresh limiter; its park file (and the per-host state file beside it) in
    ``state_dir``, a fresh directory unless given (so no crawl starts from what another learned)."""
    state_dir = state_dir or Path(tempfile.mkdtemp(prefix="state-", dir=workdir))
    settings = {**settings, "RETRY_AFTER_PARK_FILE": str(state_dir / "parked.jsonl")}
    running = limiter.start(workdir)
    if round_trip > 0:
        running = delayed(running, round_trip)
    try:
        urls = [f"{running.base_url}/p/{i}" for i in range(limiter.pages)]
        spider, _, elapsed = yield run(urls, settings)
        arrivals = running.arrivals()
    finally:
        running.close()
    throttled = sum(status == 429 for _, status in arrivals)
    return len(spider.fetched), throttled, len(arrivals), elapsed, arrivals


@defer.inlineCallbacks
def main(args: argparse.Namespace) -> Any:
    chosen = set(args.only.split(",")) if args.only else None
    table = [lim for lim in limiters(args.pages, args.app_python) if chosen is None or lim.name in chosen]
    names = {"stock": "stock Scrapy", "autothrottle": "stock + AutoThrottle", "addon": "scrapy-retryafter add-on",
             "memory": MEMORY}
    configs = [names[c] for c in args.configs.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="bench-limiters-"))
    keep = Path(args.keep_logs) if args.keep_logs else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    rows = [(lim, config) for lim in table for config in configs]
    results: list[list[Any]] = [[] for _ in rows]
    for attempt in range(args.repeat):
        for index, (lim, config) in enumerate(rows):
            level = os.environ.get("BENCH_LOG_LEVEL", "WARNING")
            state_dir = None
            if config == MEMORY:  # a first crawl learns, the second (measured) starts from its file
                state_dir = Path(tempfile.mkdtemp(prefix="memory-", dir=workdir))
                first = yield crawl(lim, {**CONFIGS[ADDON], "LOG_LEVEL": level}, workdir, state_dir, args.rtt / 1000)
                print(f"  {lim.name} / first run for memory: {first[1]} x 429, {first[3]:.1f} s", file=sys.stderr)
            result = yield crawl(lim, {**CONFIGS[ADDON if config == MEMORY else config], "LOG_LEVEL": level},
                                 workdir, state_dir, args.rtt / 1000)
            results[index].append(result[:4])
            if keep:
                tag = "memory" if config == MEMORY else config.split()[0].lower().replace("-", "")
                slug = f"{lim.name}.{tag}.{attempt}.log"
                (keep / slug).write_text("".join(f"{t:.4f} {status}\n" for t, status in result[4]))
            print(f"  {lim.name} / {config}: {result[0]}/{lim.pages} pages, {result[1]} x 429, "
                  f"{result[3]:.1f} s", file=sys.stderr, flush=True)
    shutil.rmtree(workdir, ignore_errors=True)

    print(f"\n{args.pages} pages unless said, CONCURRENT_REQUESTS=16, rate not told, round trip +{args.rtt:g} ms; "
          f"median of {args.repeat} run(s), rows interleaved")
    print("| limiter | configuration | pages | 429 share | seconds | ideal s | x ideal |\n|---|---|---|---|---|---|---|")
    stock_time: dict[str, float] = {}
    for (lim, config), runs in zip(rows, results):
        if config == "stock Scrapy":
            stock_time[lim.name] = median(r[3] for r in runs)
    for (lim, config), runs in zip(rows, results):
        fetched = min(r[0] for r in runs)
        share = median(100 * r[1] / max(1, r[2]) for r in runs)
        throttled = median(r[1] for r in runs)
        elapsed = median(r[3] for r in runs)
        ideal = lim.ideal or stock_time.get(lim.name, 0.0)
        each = f" ({', '.join(f'{r[3]:.1f}' for r in runs)})" if args.repeat > 1 else ""
        ratio = f"{elapsed / ideal:.2f}" if ideal else "-"
        print(f"| {lim.description} | {config} | {fetched} / {lim.pages} | {throttled:g} ({share:.1f} %) "
              f"| {elapsed:.1f}{each} | {ideal:.1f} | {ratio} |")
    for lim in table:
        if lim.note:
            print(f"\n{lim.name}: {lim.note}")


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=1, help="runs per row, interleaved; medians are printed")
    parser.add_argument("--only", default="", help="comma-separated limiter names (default: all)")
    parser.add_argument("--configs", default="stock,autothrottle,addon",
                        help="comma-separated: stock,autothrottle,addon,memory (memory: the add-on's second crawl)")
    parser.add_argument("--app-python", default=os.environ.get("BENCH_LIMITER_PYTHON", sys.executable),
                        help="a Python with Flask-Limiter and waitress (the bench extra)")
    parser.add_argument("--rtt", type=float, default=0.0,
                        help="milliseconds of round trip added between crawl and limiter (bench/delay_relay.py)")
    parser.add_argument("--keep-logs", default="", help="write each crawl's arrival log (time, status) here")
    args = parser.parse_args()
    if os.environ.get("BENCH_LOG_LEVEL"):
        import logging

        logging.basicConfig(level=os.environ["BENCH_LOG_LEVEL"], format="%(relativeCreated)7.0f %(name)s %(message)s")
    d = main(args)
    d.addErrback(lambda f: (f.printTraceback(file=sys.stderr), None))
    d.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    _main()
