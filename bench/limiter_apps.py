"""Third-party limiters for bench/limiters.py, served by waitress on loopback.

    python bench/limiter_apps.py KIND PORT SPEC

Runs in a Python that has the bench extra (Flask-Limiter, waitress); the
bench starts and stops it. KIND is one of:

- ``moving-window`` / ``fixed-window``: Flask-Limiter with its own
  ``X-RateLimit-*`` and ``Retry-After`` headers, SPEC a limit such as
  ``20/second``;
- ``github``: an hourly quota the way GitHub's REST API states it (a fixed
  window opened by the first request, ``X-RateLimit-Limit/-Remaining/
  -Used/-Reset`` with an epoch reset, 429 with ``Remaining: 0`` and no
  Retry-After once it is spent), SPEC ``QUOTA/SECONDS`` such as ``5000/3600``.

Every answer is logged; ``GET /__arrivals`` (never limited) returns the log
as JSON lines of ``[epoch seconds, status]``.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

PAGE = b"<html><body><h1>page</h1></body></html>"

StartResponse = Callable[..., Any]


class ArrivalLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[float, int]] = []

    def add(self, status: int) -> None:
        with self.lock:
            self.entries.append((time.time(), status))

    def body(self) -> bytes:
        with self.lock:
            return "".join(json.dumps(entry) + "\n" for entry in self.entries).encode()


def flask_app(strategy: str, limit: str, log: ArrivalLog) -> Any:
    from flask import Flask, Response
    from flask_limiter import Limiter

    app = Flask("bench-limiter")
    limiter = Limiter(
        key_func=lambda: "everyone",
        app=app,
        default_limits=[limit],
        strategy=strategy,
        headers_enabled=True,
        storage_uri="memory://",
    )

    @app.route("/__arrivals")
    @limiter.exempt
    def arrivals() -> Response:
        return Response(log.body(), mimetype="application/json")

    @app.route("/<path:path>")
    def page(path: str) -> Response:
        return Response(PAGE, mimetype="text/html")

    @app.after_request
    def logged(response: Response) -> Response:
        from flask import request

        if request.path != "/__arrivals":
            log.add(response.status_code)
        return response

    return app


class GitHubQuota:
    """A fixed window opened by the first request, stated in GitHub's headers."""

    def __init__(self, quota: int, window: float, log: ArrivalLog) -> None:
        self.quota = quota
        self.window = window
        self.log = log
        self.lock = threading.Lock()
        self.reset_at = 0.0
        self.used = 0

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/__arrivals":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [self.log.body()]
        with self.lock:
            now = time.time()
            if now >= self.reset_at:
                self.reset_at = now + self.window
                self.used = 0
            allowed = self.used < self.quota
            if allowed:
                self.used += 1
            headers = [
                ("X-RateLimit-Limit", str(self.quota)),
                ("X-RateLimit-Remaining", str(self.quota - self.used)),
                ("X-RateLimit-Used", str(self.used)),
                ("X-RateLimit-Reset", str(math.ceil(self.reset_at))),
                ("X-RateLimit-Resource", "core"),
                ("Content-Type", "text/html"),
            ]
            self.log.add(200 if allowed else 429)
        if allowed:
            start_response("200 OK", headers)
            return [PAGE]
        start_response("429 Too Many Requests", headers)
        return [b'{"message": "API rate limit exceeded"}']


def main(argv: list[str]) -> None:
    import waitress

    kind, port, spec = argv[0], int(argv[1]), argv[2]
    log = ArrivalLog()
    if kind in ("moving-window", "fixed-window"):
        app = flask_app(kind, spec.replace("/", " per "), log)
    elif kind == "github":
        quota, window = spec.split("/")
        app = GitHubQuota(int(quota), float(window), log)
    else:
        raise SystemExit(f"unknown limiter kind {kind!r}: moving-window, fixed-window or github")
    waitress.serve(app, host="127.0.0.1", port=port, threads=16, connection_limit=200, _quiet=True)


if __name__ == "__main__":
    main(sys.argv[1:])
